"""The sweep behind ``("float32", "onnx:reference")`` in `shared/tolerances.py`: ONNX Runtime on an
ONNX export (`shared.exporters.onnx`, `twins.onnx_runtime`) against the float64 oracle; with
``--dtypes float16``, the float16 export of the float32 model (the variants' side of
``("float16", "onnx:reference")``, whose presets' side is benchmarks/half_precision.py parity).

For every convention-15 variant (parity_tests/variant_configs.py), pad_id 3 with and without a pad
start token, and the `base` preset, float32 and float64, `random_weights` seeds, the matrix shapes
(parity_tests/matrix.py: padded and all-padding rows) that fit the model's ``max_len``:

* the full pass (``decoder_model``) logits against `shared.reference.forward`;
* the cached steps (``decoder_model`` then ``decoder_with_past``, through `OnnxStep`) along the
  target, on the rows a decode could feed (no pad after the start token: the cached step attends
  every position, as the backends' do).

With ``--pairs``, also ``onnx:torch`` and ``onnx:tf``: the full pass against torch_impl's and
tf_impl's float32 logits (float16: in their float16 mixed precision). Every figure is
``max|a - b| / max(max|b|, 1)``. Float64 with gelu is refused by the export.

    python3 dev.py bench onnx_bounds [--seeds 0 1 2 3] [--pairs] [--dtypes float32 float64 float16]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from parity_tests import variant_configs as VC
from parity_tests.matrix import SHAPES
from shared import TransformerConfig
from shared import reference as R
from shared.exporters.onnx import refusals
from shared.tolerances import max_rel_diff
from shared.weights import random_weights
from twins.onnx_runtime import OnnxRuntimeModel


def configs() -> dict[str, TransformerConfig]:
    out = {name: VC.config(name) for name in VC.VARIANTS}
    out["pad3"] = VC.BASE.replace(pad_id=3, bos_id=1, eos_id=2)
    out["pad3-start-pad"] = VC.BASE.replace(pad_id=3, bos_id=1, eos_id=2, decoder_start_id=3)
    return out


def decodable_rows(c: TransformerConfig, tgt: np.ndarray) -> list[int]:
    """Rows a decode could feed the cached step: no pad after column 0, column 0 real."""
    first_real = c.start_id == c.pad_id or not c.mask_padding
    return [b for b in range(len(tgt)) if not (tgt[b, 1:] == c.pad_id).any()
            and (first_real or tgt[b, 0] != c.pad_id)]


def measure(c: TransformerConfig, seed: int, shapes, threads: int = 1, precision: str = "float32"
            ) -> tuple[float, float]:
    """(full pass, cached steps) worst relative differences against the oracle."""
    w = random_weights(c, seed)
    model = OnnxRuntimeModel.from_weights(c, w, threads=threads, precision=precision)
    full = cached = 0.0
    for shape in shapes:
        if max(shape.src_len, shape.tgt_len) > c.max_len:
            continue
        src, tgt = shape.make(c, seed)
        ref = R.forward(w, c, src, tgt)
        full = max(full, max_rel_diff(model.logits(src, tgt), ref))
        step, state, steps = model.step(src), None, []
        for t in range(tgt.shape[1]):
            logits, state = step(tgt, t, state)
            steps.append(logits)
        rows = decodable_rows(c, tgt)
        if rows:
            cached = max(cached, max_rel_diff(np.stack(steps, 1)[rows], ref[rows]))
    return full, cached


def measure_pairs(seeds, precision: str = "float32") -> None:
    """``onnx:torch`` and ``onnx:tf``: decoder_model logits against torch_impl's (SDPA path) and
    tf_impl's (eager) logits, the variants above and the tiny matrix variants; in float16 the
    export's against the backends' in that mixed precision (their ``set_precision``)."""
    from parity_tests.backends import Backend
    from parity_tests.matrix import VARIANTS
    from tf_impl.precision import set_precision as tf_precision
    from torch_impl.precision import set_precision as torch_precision
    backends = {"torch": Backend("torch", "eager", "cpu"), "tf": Backend("tf", "eager", "/CPU:0")}
    set_precision = {"torch": torch_precision, "tf": tf_precision}
    cases = {**configs(), **{n: c.replace(dropout=0.0) for n, c in VARIANTS.items() if n != "base"},
             "base": TransformerConfig.preset("base", dropout=0.0)}
    worst = dict.fromkeys(backends, 0.0)
    for name, config in cases.items():
        c = config.replace(dtype="float32")
        for seed in seeds[:2]:
            w = random_weights(c, seed)
            model = OnnxRuntimeModel.from_weights(c, w, threads=2, precision=precision)
            built = {k: b.build(c, w) for k, b in backends.items()}
            for k, m in built.items():
                set_precision[k](m, precision)
            for shape in (SHAPES.values() if name != "base" else [SHAPES["b2-tgt-longer"]]):
                if max(shape.src_len, shape.tgt_len) > c.max_len:
                    continue
                src, tgt = shape.make(c, seed)
                got = model.logits(src, tgt)
                for k, b in backends.items():
                    worst[k] = max(worst[k], max_rel_diff(got, b.logits(built[k], src, tgt)))
        print(f"{name:<22} {precision:<8} " + "  ".join(f"onnx:{k} {v:.2e}" for k, v in worst.items()), flush=True)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3])
    parser.add_argument("--pairs", action="store_true",
                        help="also ONNX Runtime against torch_impl and tf_impl (needs both)")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"],
                        choices=["float32", "float64", "float16"],
                        help="float16: the float16 export of the float32 model")
    args = parser.parse_args(argv)
    worst = {dtype: [0.0, 0.0] for dtype in args.dtypes}
    print(f"{'variant':<16} {'dtype':<8} {'full pass':>10} {'cached':>10}")
    for name, config in configs().items():
        for dtype in args.dtypes:
            precision = "float16" if dtype == "float16" else "float32"
            c = config.replace(dtype="float32" if dtype == "float16" else dtype)
            if refusals(c, precision):
                print(f"{name:<16} {dtype:<8} {'refused':>10}")
                continue
            full, cached = np.max([measure(c, s, SHAPES.values(), precision=precision) for s in args.seeds],
                                  axis=0)
            worst[dtype] = [max(worst[dtype][0], full), max(worst[dtype][1], cached)]
            print(f"{name:<16} {dtype:<8} {full:>10.2e} {cached:>10.2e}", flush=True)
    base = TransformerConfig.preset("base", dropout=0.0)
    for seed in args.seeds[:2]:
        for dtype in [d for d in args.dtypes if d != "float64"]:
            full, _ = measure(base, seed, [SHAPES["b2-tgt-longer"]], threads=2,
                              precision="float16" if dtype == "float16" else "float32")
            print(f"{'base':<16} {dtype:<8} {full:>10.2e} {'':>10}  (seed {seed})")
    for dtype, (full, cached) in worst.items():
        print(f"worst {dtype}: full pass {full:.2e}, cached {cached:.2e}")
    if args.pairs:
        for dtype in [d for d in args.dtypes if d != "float64"]:
            measure_pairs(args.seeds, "float16" if dtype == "float16" else "float32")


if __name__ == "__main__":
    main()
