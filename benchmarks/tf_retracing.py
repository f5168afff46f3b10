"""What tf_impl's decoding keeps as the source shapes change: resident memory, memory mappings
and time over ``--shapes`` decodes, each of a new (batch, length) and ``max_len`` from a few
values; with ``--new-models``, each of a new model (the same shape), dropped after its decode.

A server decodes sources of every length. `tf_impl.decoding` compiles its loop as one
``tf.function`` per model and program; every trace and every XLA executable it makes is kept for
the model's life, and TensorFlow keeps an XLA executable for the process's life, after its model
and function are gone. Each executable holds memory mappings of its own, and Linux ends a process
at ``vm.max_map_count`` of them (LLVM's "Unable to allocate section memory": an abort, not an
exception). This prints how much memory, how many mappings and how much time the sequence costs,
with XLA (the default of a cached decode, `tf_impl.decoding.JIT_COMPILE`) and without.

    python3 dev.py bench tf_retracing [--preset tiny] [--shapes 30] [--new-models]

Printed, per mode: the resident memory grown since the first decode (MiB), the process's memory
mappings (of ``vm.max_map_count``) and the seconds, every 10 decodes. Run it on a quiet machine; the
memory and mappings are a property of the code and the TF version.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _args import positive  # noqa: E402
from shared.memory import mapping_use  # noqa: E402


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20


def _mappings_shown() -> str:
    use = mapping_use()
    return "mappings: no /proc here" if use is None else f"{use[0]:>6} mappings (of {use[1]})"


def measure(preset: str, shapes: int, jit_compile: bool, new_models: bool) -> None:
    """The sequence of decodes in this process, one line every 10 decodes."""
    import gc

    import numpy as np

    import tf_impl
    from shared import TransformerConfig
    from shared.weights import random_weights

    config = TransformerConfig.preset(preset)

    def model_of(seed: int):
        model = tf_impl.Transformer(config)
        model.import_weights(random_weights(config, seed))
        return model

    model = model_of(0)
    rng = np.random.default_rng(0)
    tf_impl.greedy_decode(model, rng.integers(4, config.src_vocab, size=(1, 1)), 1, jit_compile=jit_compile)
    start_mib, start = _resident_mib(), time.perf_counter()
    for i in range(1, shapes + 1):
        if new_models:  # the first decode's shape, another model each time; the last one dropped
            del model
            gc.collect()
            model = model_of(i)
            tf_impl.greedy_decode(model, rng.integers(4, config.src_vocab, size=(1, 1)), 1, jit_compile=jit_compile)
        else:
            length = 1 + i % min(40, config.max_len)
            src = rng.integers(4, config.src_vocab, size=(1 + i % 3, length))
            tf_impl.greedy_decode(model, src, 1 + i % 7, jit_compile=jit_compile)
        if i % 10 == 0 or i == shapes:
            print(f"  jit_compile={jit_compile!s:<5}  {i:>4} {'models' if new_models else 'shapes'}  "
                  f"+{_resident_mib() - start_mib:7.0f} MiB  {_mappings_shown()}  "
                  f"{time.perf_counter() - start:7.1f} s", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny")
    parser.add_argument("--shapes", type=positive, default=30, help="decodes (default 30)")
    parser.add_argument("--new-models", action="store_true",
                        help="each decode of a new model of the preset, one shape, the last model dropped")
    parser.add_argument("--mode", choices=("xla", "graph"), help=argparse.SUPPRESS)  # one child run
    args = parser.parse_args(argv)
    if args.mode:
        measure(args.preset, args.shapes, args.mode == "xla", args.new_models)
        return 0
    import tensorflow as tf
    what = "models, one shape" if args.new_models else "source shapes"
    print(f"tf_impl decoding over {args.shapes} {what}, preset {args.preset}, TensorFlow "
          f"{tf.__version__}; each mode in a fresh process")
    for mode in ("xla", "graph"):
        subprocess.run([sys.executable, __file__, "--preset", args.preset, "--shapes", str(args.shapes),
                        "--mode", mode, *(["--new-models"] if args.new_models else [])], check=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
