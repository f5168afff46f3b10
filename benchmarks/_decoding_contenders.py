"""The contenders of `benchmarks/decoding.py`: one greedy decoder each, on the same weights.

A contender is ``decode(src (B, S) NumPy ids, max_len) -> lengths (B,)``, run to completion (host
results). torch_impl and tf_impl run as users get them (cached; tf_impl compiled, XLA on the cached
path); CTranslate2 runs the model `shared.exporters.ctranslate2` writes from the same canonical
weights (`twins convert --to ctranslate2`), float32 and, as a reference point, int8 (weights
quantised: not the same function, so not a parity contender); ONNX Runtime runs the ONNX export of
the same weights (`shared.exporters.onnx`) through `twins.onnx_runtime`. Every contender gets the
same thread count (`shared.threads`).

`serve` runs one contender in a process of its own, as a user runs one framework, and decodes what
the benchmark sends it: frameworks loaded side by side in one process slow each other down
(measured, base, greedy, batch 1, 1 thread, one core: torch_impl took 6.0-6.4 ms a step in a process
with CTranslate2 alone and 6.5-6.7 in one where tf_impl had decoded too, CTranslate2 6.4-6.6 in
both; an effect of the shared address space, not of the framework the benchmark measures).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Callable

import numpy as np

from shared import TransformerConfig
from shared.weights import init_weights

Decode = Callable[[np.ndarray, int], np.ndarray]


def bench_weights(config: TransformerConfig) -> dict:
    """`shared.weights.init_weights` (seed 0) with the generator bias of EOS at -1e9: EOS is never
    chosen, so every row decodes exactly the tokens asked and all contenders do the same work."""
    weights = init_weights(config, 0)
    weights["generator.bias"] = weights["generator.bias"].copy()
    weights["generator.bias"][config.eos_id] = -1e9
    return weights


def torch_contender(config: TransformerConfig, weights: dict, threads: int) -> tuple[str, Decode]:
    import torch

    import torch_impl

    torch.set_num_threads(threads)
    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    model.eval()

    def decode(src: np.ndarray, max_len: int) -> np.ndarray:
        return torch_impl.greedy_decode(model, src, max_len).lengths

    return f"torch {torch.__version__}, {torch.get_num_threads()} threads", decode


def tf_contender(config: TransformerConfig, weights: dict, threads: int) -> tuple[str, Decode]:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import tf_impl

    try:  # only before TensorFlow's runtime starts
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass
    tf.get_logger().setLevel("ERROR")  # the retracing notice: a trace per shape is by design here
    model = tf_impl.Transformer(config)
    model.import_weights(weights)

    def decode(src: np.ndarray, max_len: int) -> np.ndarray:
        return tf_impl.greedy_decode(model, src, max_len).lengths

    return (f"tf {tf.__version__}, compiled, XLA, intra-op "
            f"{tf.config.threading.get_intra_op_parallelism_threads()} threads"), decode


def ctranslate2_contender(config: TransformerConfig, weights: dict, threads: int,
                          compute_type: str) -> tuple[str, Decode]:
    """CTranslate2's ``Translator`` on this project's export, greedy (``beam_size=1``); raises
    NotImplementedError when the export is not available in this checkout."""
    import ctranslate2
    try:
        from shared.exporters import ctranslate2 as export
    except ImportError as err:
        raise NotImplementedError(f"no CTranslate2 export in this checkout ({err})") from None
    path = os.path.join(tempfile.mkdtemp(prefix="twins-bench-ct2-"), "model")
    export.to_ctranslate2(config, weights, path)
    translator = ctranslate2.Translator(path, device="cpu", compute_type=compute_type,
                                        intra_threads=threads, inter_threads=1)

    def decode(src: np.ndarray, max_len: int) -> np.ndarray:
        results = translator.translate_batch(export.source_tokens(config, src), beam_size=1,
                                             max_decoding_length=max_len, return_end_token=True,
                                             max_input_length=0)
        return np.array([len(r.hypotheses[0]) for r in results])

    return f"ctranslate2 {ctranslate2.__version__}, {compute_type}, {threads} threads", decode


def onnx_contender(config: TransformerConfig, weights: dict, threads: int) -> tuple[str, Decode]:
    """ONNX Runtime on this project's ONNX export of the same weights (`shared.exporters.onnx`,
    written to a directory and loaded as a user would), greedy through `twins.onnx_runtime`: the
    shared NumPy search over the ``decoder_with_past`` session, under its session options
    (``ORT_ENABLE_ALL``, sequential, ``threads`` intra-op threads, spinning off under
    OMP_WAIT_POLICY=PASSIVE)."""
    import onnxruntime

    from shared.exporters.onnx import to_onnx
    from twins.onnx_runtime import OnnxRuntimeModel

    path = os.path.join(tempfile.mkdtemp(prefix="twins-bench-onnx-"), "model")
    to_onnx(config, weights, path)
    model = OnnxRuntimeModel.load(path, threads=threads)

    def decode(src: np.ndarray, max_len: int) -> np.ndarray:
        return model.greedy(src, max_len).lengths

    return (f"onnxruntime {onnxruntime.__version__}, ORT_ENABLE_ALL, {threads} intra-op threads"), decode


CONTENDERS = {
    "torch": torch_contender,
    "tf": tf_contender,
    "ct2-float32": lambda c, w, t: ctranslate2_contender(c, w, t, "float32"),
    "ct2-int8": lambda c, w, t: ctranslate2_contender(c, w, t, "int8"),
    "onnx": onnx_contender,
}


def serve(conn, name: str, threads: int, cpus: list[int] | None) -> None:
    """Run contender ``name`` of preset ``base`` in this process (started by `multiprocessing`, with
    the thread policy already in its environment), on ``cpus`` when given. Sends ``("ready",
    description)`` or ``("skipped", reason)``; then, for each ``(src, max_len)`` received, the
    seconds of one decode (timed here, so no messaging is timed) and its lengths; stops on None."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    config = TransformerConfig.preset("base")
    try:
        description, decode = CONTENDERS[name](config, bench_weights(config), threads)
    except (NotImplementedError, ImportError) as exc:
        conn.send(("skipped", str(exc)))
        return
    conn.send(("ready", description))
    while (request := conn.recv()) is not None:
        src, max_len = request
        start = time.perf_counter()
        lengths = decode(src, max_len)
        conn.send((time.perf_counter() - start, lengths))
