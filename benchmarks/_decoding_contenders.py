"""The contenders of `benchmarks/decoding.py`: one decoder each (greedy, or beam search with
``--beam-size``), on the same weights.

A contender is a `Decoder`: ``decode(src (B, S) NumPy ids, max_len)``, timed, run to completion
(its result on the host, so a GPU's work has finished when it returns), and ``tokens(result)``,
untimed, the ``(B, max_len)`` int64 ids without the start token, pad after EOS. torch_impl and
tf_impl run as users get them (cached; tf_impl compiled, XLA on the cached path); transformers'
``MarianMTModel.generate`` runs the Marian directory `shared.exporters.marian` writes from the same
canonical weights (`twins convert --to marian`); CTranslate2 the model `shared.exporters.ctranslate2`
writes (`twins convert --to ctranslate2`), float32, and as reference points int8 (quantised weights:
not the same function, so not a parity contender), float16 and bfloat16; ONNX Runtime the ONNX
export (`shared.exporters.onnx`) through `twins.onnx_runtime`. Every contender gets the same thread
count (`shared.threads`), the same device and, where it has one, the same precision (`Settings`).

The model is `contender_config`: the paper's ``base`` in the one form every contender computes
(transformers' Marian fixes the layer norms' eps at torch's 1e-5 and the positional table as
``[sin | cos]``; `shared.exporters.marian.marian_problems`). Neither changes a step's work: the
table is a constant added once per position, eps a constant in every norm.

`serve` runs one contender in a process of its own, as a user runs one framework, and decodes what
the benchmark sends it: frameworks loaded side by side in one process slow each other down
(measured, base, greedy, batch 1, 1 thread, one core: torch_impl took 6.0-6.4 ms a step in a process
with CTranslate2 alone and 6.5-6.7 in one where tf_impl had decoded too, CTranslate2 6.4-6.6 in
both; an effect of the shared address space, not of the framework the benchmark measures).
A contender that cannot run here (a library not installed, no CUDA build, a device its library
does not list) raises `Skipped` with the library's own message, and the benchmark goes on without it.
"""
from __future__ import annotations

import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from shared import TransformerConfig
from shared.weights import init_weights


class Skipped(Exception):
    """A contender that cannot run on this machine; the message says why (the library's own words)."""


@dataclass(frozen=True)
class Settings:
    """What every contender is given: threads (``--threads``), ``device`` (``"cpu"`` or ``"cuda"``),
    ``precision`` (``"float32"``, ``"bfloat16"`` or ``"float16"``: the dtype of the products for
    a contender with a precision setting; one with a fixed compute type says so in its description)
    and ``beam_size`` (1: greedy; more: beam search with that many beams and no length penalty,
    which changes nothing where every hypothesis runs to the limit, as here)."""
    threads: int
    device: str = "cpu"
    precision: str = "float32"
    beam_size: int = 1

    @property
    def search(self) -> str:
        return "greedy" if self.beam_size == 1 else f"beam {self.beam_size}"


@dataclass(frozen=True)
class Decoder:
    """One contender, built: ``decode`` is timed, ``tokens`` is not (module docstring)."""
    description: str
    decode: Callable[[np.ndarray, int], Any]
    tokens: Callable[[Any], np.ndarray] = lambda result: result.tokens


def scratch_dir(prefix: str) -> tempfile.TemporaryDirectory:
    """A temporary directory for a contender's export, to load it from and remove as soon as it is
    loaded: an export of ``base`` is 250-480 MB, and a contender's process may end by a signal
    (``serve`` runs as a daemon), where no exit handler would remove it. The libraries keep what
    they loaded; a file one of them maps stays readable after its name is removed (POSIX)."""
    return tempfile.TemporaryDirectory(prefix=prefix, ignore_cleanup_errors=True)


def contender_config() -> TransformerConfig:
    """Preset ``base`` with the two settings transformers' Marian cannot change (module docstring)."""
    return TransformerConfig.preset("base", norm_eps=1e-5, pe_layout="halves")


def bench_weights(config: TransformerConfig) -> dict:
    """`shared.weights.init_weights` (seed 0) with the generator bias of EOS at -3e4: EOS is never
    chosen (the other logits are within a few units of 0), so every row decodes exactly the tokens
    asked and all contenders do the same work. -3e4, not lower: a float16 contender stores the
    bias in float16, whose largest finite value is 65504 (the ONNX export refuses a larger one);
    the figures measured with -1e9 before are the same work."""
    weights = init_weights(config, 0)
    weights["generator.bias"] = weights["generator.bias"].copy()
    weights["generator.bias"][config.eos_id] = -3e4
    return weights


def padded(rows: list[list[int]], width: int, pad_id: int) -> np.ndarray:
    """Token rows of unequal length as ``(len(rows), width)`` int64, pad after each row's end."""
    out = np.full((len(rows), width), pad_id, dtype=np.int64)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def _torch_settings(settings: Settings, library: str = ""):
    """torch's threads, and on CUDA float32 products as the parity tests run them (no TF32);
    raises `Skipped` where torch sees no CUDA device (``library``: who asked, for the reason)."""
    import torch

    torch.set_num_threads(settings.threads)
    if settings.device == "cuda":
        if not torch.cuda.is_available():
            raise Skipped(f"{library}torch {torch.__version__}: torch.cuda.is_available() is False")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_contender(config: TransformerConfig, weights: dict, settings: Settings) -> Decoder:
    """torch_impl's cached decoding (on CUDA: a CUDA graph a step, `torch_impl.graphs`; greedy also
    selects inside it), in ``settings.precision`` (`torch_impl.precision.set_precision`: float32
    residual stream, norms and softmax, products in the half dtype)."""
    torch = _torch_settings(settings)
    import torch_impl
    from torch_impl.precision import set_precision

    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    model = model.to(settings.device).eval()
    set_precision(model, settings.precision)

    def decode(src: np.ndarray, max_len: int):  # NumPy results: the device is done
        if settings.beam_size == 1:
            return torch_impl.greedy_decode(model, src, max_len)
        return torch_impl.beam_search(model, src, max_len, settings.beam_size)

    return Decoder(f"torch {torch.__version__}, {settings.device}, {settings.precision}, "
                   f"{settings.search}, {torch.get_num_threads()} threads", decode)


# The first transformers whose beam search takes the vocabulary from the scores: before it (5.17), a
# beam step reshapes them by ``config.get_text_config().vocab_size``, which for a Marian of two
# vocabularies is the source's (``decoder_vocab_size`` is the target's), so ``generate(num_beams>1)``
# fails ("shape ... is invalid for input of size ..."). Greedy search is not affected.
MARIAN_BEAM_SEARCH_FIXED = (5, 18)


def marian_beam_search_works() -> bool:
    """Whether the installed transformers beam-searches a Marian whose vocabularies differ."""
    import transformers
    from packaging.version import Version
    return Version(transformers.__version__).release[:2] >= MARIAN_BEAM_SEARCH_FIXED


def transformers_contender(config: TransformerConfig, weights: dict, settings: Settings) -> Decoder:
    """transformers' ``MarianMTModel.from_pretrained`` on the project's Marian export of the same
    weights (`shared.exporters.marian.to_marian`, as `twins convert --to marian` writes it; its
    ``generation_config.json`` forces no EOS and bans pad), ``generate`` (greedy, or ``num_beams``
    without a length penalty) with the model's defaults (SDPA attention, the dynamic key/value
    cache), every setting that could end a row early or force a token stated: the start token is
    the project's, no minimum length, no EOS forced at the limit, ``max_new_tokens`` (never the
    config's ``max_length``). In ``settings.precision`` through ``dtype``: the whole model in that
    dtype (norms and softmax too, unlike torch_impl's half precision, so its tokens may differ
    there)."""
    import transformers

    torch = _torch_settings(settings, f"transformers {transformers.__version__} on ")
    if settings.beam_size > 1 and config.src_vocab != config.tgt_vocab and not marian_beam_search_works():
        raise Skipped(f"transformers {transformers.__version__}: generate's beam search reshapes each "
                      f"step's scores by the config's vocab_size, which is Marian's source vocabulary "
                      f"({config.src_vocab}), not the decoder's ({config.tgt_vocab}), and fails; transformers "
                      f"{'.'.join(map(str, MARIAN_BEAM_SEARCH_FIXED))} takes the scores' own width")
    from shared.exporters.marian import to_marian

    transformers.utils.logging.disable_progress_bar()  # "Loading weights": not benchmark output
    with scratch_dir("twins-bench-marian-") as folder:
        path = os.path.join(folder, "model")
        to_marian(path, config, weights)
        model = transformers.MarianMTModel.from_pretrained(path, dtype=getattr(torch, settings.precision))
    model = model.to(settings.device).eval()
    device = torch.device(settings.device)

    def decode(src: np.ndarray, max_len: int):
        ids = torch.as_tensor(src, device=device)
        out = model.generate(input_ids=ids, attention_mask=ids != config.pad_id,
                             num_beams=settings.beam_size, length_penalty=0.0, do_sample=False,
                             max_new_tokens=max_len, min_new_tokens=0,
                             decoder_start_token_id=config.start_id, forced_eos_token_id=None,
                             bad_words_ids=[[config.pad_id]])
        return out.cpu().numpy()  # on the host: the device is done

    def tokens(out: np.ndarray) -> np.ndarray:  # column 0 is the start token
        return padded(list(out[:, 1:]), out.shape[1] - 1, config.pad_id)

    return Decoder(f"transformers {transformers.__version__} MarianMTModel.generate, torch "
                   f"{torch.__version__}, {settings.device}, {settings.precision}, {settings.search}, "
                   f"{model.config._attn_implementation} attention, {torch.get_num_threads()} threads",
                   decode, tokens)


def tf_contender(config: TransformerConfig, weights: dict, settings: Settings) -> Decoder:
    """tf_impl, compiled (XLA on the cached path), in ``settings.precision``; on ``cuda`` only
    where TensorFlow lists a GPU (it then places its ops there)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import tf_impl
    from tf_impl.precision import set_precision

    try:  # only before TensorFlow's runtime starts
        tf.config.threading.set_intra_op_parallelism_threads(settings.threads)
        tf.config.threading.set_inter_op_parallelism_threads(settings.threads)
    except RuntimeError:
        pass
    gpus = tf.config.list_physical_devices("GPU")
    if settings.device == "cuda":
        if not gpus:
            raise Skipped(f"tensorflow {tf.__version__}: tf.config.list_physical_devices('GPU') is empty")
        tf.config.experimental.enable_tensor_float_32_execution(False)
    elif gpus:
        raise Skipped(f"tensorflow {tf.__version__} would place its ops on {gpus[0].name}: "
                      "run it with --device cuda")
    tf.get_logger().setLevel("ERROR")  # the retracing notice: a trace per shape is by design here
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    set_precision(model, settings.precision)

    def decode(src: np.ndarray, max_len: int):
        if settings.beam_size == 1:
            return tf_impl.greedy_decode(model, src, max_len)
        return tf_impl.beam_search(model, src, max_len, settings.beam_size)

    threads = tf.config.threading.get_intra_op_parallelism_threads()
    return Decoder(f"tf {tf.__version__}, {settings.device}, {settings.precision}, {settings.search}, "
                   f"compiled, XLA, intra-op {threads} threads", decode)


def ctranslate2_contender(config: TransformerConfig, weights: dict, settings: Settings,
                          compute_type: str) -> Decoder:
    """CTranslate2's ``Translator`` on this project's export, greedy or ``beam_size`` beams (no
    length penalty), in ``compute_type`` whatever ``settings.precision`` says (the contender's name
    fixes it). Raises `Skipped` with CTranslate2's message where it cannot run: a compute type or
    device its build lacks, or CUDA libraries that do not load (a wheel built for another CUDA
    than the machine's: those are loaded at the first translation, so one is run here)."""
    import ctranslate2
    try:
        from shared.exporters import ctranslate2 as export
    except ImportError as err:
        raise NotImplementedError(f"no CTranslate2 export in this checkout ({err})") from None
    try:
        with scratch_dir("twins-bench-ct2-") as folder:
            path = os.path.join(folder, "model")
            export.to_ctranslate2(config, weights, path)
            translator = ctranslate2.Translator(path, device=settings.device, compute_type=compute_type,
                                                intra_threads=settings.threads, inter_threads=1)
        translator.translate_batch(export.source_tokens(config, np.full((1, 1), 3)), beam_size=1,
                                   max_decoding_length=1)
    except (RuntimeError, ValueError, OSError) as err:
        raise Skipped(f"ctranslate2 {ctranslate2.__version__}, {settings.device}, {compute_type}: {err}") from None

    def decode(src: np.ndarray, max_len: int):
        return translator.translate_batch(export.source_tokens(config, src),
                                          beam_size=settings.beam_size, length_penalty=0.0,
                                          max_decoding_length=max_len,
                                          return_end_token=True, max_input_length=0)

    def tokens(results) -> np.ndarray:  # vocabulary entry i is str(i) (shared.exporters.ctranslate2)
        rows = [[int(token) for token in r.hypotheses[0]] for r in results]
        return padded(rows, max(map(len, rows)), config.pad_id)

    return Decoder(f"ctranslate2 {ctranslate2.__version__}, {settings.device}, {compute_type}, "
                   f"{settings.search}, {settings.threads} threads", decode, tokens)


def onnx_contender(config: TransformerConfig, weights: dict, settings: Settings) -> Decoder:
    """ONNX Runtime on this project's ONNX export of the same weights (`shared.exporters.onnx`,
    written to a directory and loaded as a user would), decoded through `twins.onnx_runtime`: the
    shared NumPy search (greedy or beam) over the ``decoder_with_past`` session, under its session
    options (``ORT_ENABLE_ALL``, sequential, ``threads`` intra-op threads, spinning off under
    OMP_WAIT_POLICY=PASSIVE). A float16 export where ``settings.precision`` is float16
    (`shared.exporters.onnx`'s half-precision graphs), else float32 (ONNX Runtime's CPU has no
    bfloat16 products: the export refuses them).

    On ``cuda``, only where ``onnxruntime.get_available_providers()`` lists CUDAExecutionProvider:
    the three sessions are reopened on it (`twins.onnx_runtime` opens CPU sessions), and the NumPy
    search then moves the key/value cache between host and device at every step, as that module
    serves it."""
    import onnxruntime

    from shared.exporters.onnx import DECODER, DECODER_WITH_PAST, ENCODER, read_onnx, to_onnx
    from twins.onnx_runtime import OnnxRuntimeModel, session_options

    providers = onnxruntime.get_available_providers()
    if settings.device == "cuda" and "CUDAExecutionProvider" not in providers:
        raise Skipped(f"onnxruntime {onnxruntime.__version__}: CUDAExecutionProvider is not in "
                      f"onnxruntime.get_available_providers() = {providers}")
    precision = "float16" if settings.precision == "float16" else "float32"
    with scratch_dir("twins-bench-onnx-") as folder:
        path = os.path.join(folder, "model")
        to_onnx(config, weights, path, precision=precision)
        model = OnnxRuntimeModel.load(path, threads=settings.threads)
        where = "ORT_ENABLE_ALL"
        if settings.device == "cuda":
            files = read_onnx(path)[1]
            for name, graph in (("encoder", ENCODER), ("decoder", DECODER), ("decoder_with_past", DECODER_WITH_PAST)):
                session = onnxruntime.InferenceSession(str(files[graph]), session_options(settings.threads),
                                                       providers=["CUDAExecutionProvider"])
                if session.get_providers()[0] != "CUDAExecutionProvider":  # it falls back without raising
                    raise Skipped(f"onnxruntime {onnxruntime.__version__}: the CUDA session of {graph} "
                                  f"runs on {session.get_providers()}")
                setattr(model, name, session)
            where = "CUDAExecutionProvider, the cache through the host each step"

    def decode(src: np.ndarray, max_len: int):
        if settings.beam_size == 1:
            return model.greedy(src, max_len)
        return model.beam(src, max_len, settings.beam_size)

    return Decoder(f"onnxruntime {onnxruntime.__version__}, {settings.device}, {precision}, "
                   f"{settings.search}, {where}, "
                   f"{settings.threads} intra-op threads", decode)


CONTENDERS: dict[str, Callable[[TransformerConfig, dict, Settings], Decoder]] = {
    "torch": torch_contender,
    "transformers": transformers_contender,
    "tf": tf_contender,
    "ct2-float32": lambda c, w, s: ctranslate2_contender(c, w, s, "float32"),
    "ct2-int8": lambda c, w, s: ctranslate2_contender(c, w, s, "int8"),
    "ct2-float16": lambda c, w, s: ctranslate2_contender(c, w, s, "float16"),
    "ct2-bfloat16": lambda c, w, s: ctranslate2_contender(c, w, s, "bfloat16"),
    "onnx": onnx_contender,
}


def serve(conn, name: str, settings: Settings, cpus: list[int] | None) -> None:
    """Run contender ``name`` of `contender_config` in this process (started by `multiprocessing`,
    with the thread policy already in its environment), on ``cpus`` when given. Sends ``("ready",
    description)`` or ``("skipped", reason)``; then, for each ``(src, max_len)`` received,
    ``("done", seconds, tokens)``: the seconds of one decode (timed here, so no messaging is timed)
    and its tokens ``(B, max_len)``, or ``("failed", traceback)``; stops on None."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    config = contender_config()
    try:
        decoder = CONTENDERS[name](config, bench_weights(config), settings)
    except (Skipped, NotImplementedError, ImportError) as exc:
        conn.send(("skipped", str(exc)))
        return
    conn.send(("ready", decoder.description))
    while (request := conn.recv()) is not None:
        src, max_len = request
        try:
            start = time.perf_counter()
            result = decoder.decode(src, max_len)
            seconds = time.perf_counter() - start
            conn.send(("done", seconds, decoder.tokens(result)))
        except Exception:  # the benchmark reports it and stops; this process stays usable until then
            conn.send(("failed", traceback.format_exc()))
