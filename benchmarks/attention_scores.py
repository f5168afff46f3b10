"""Attention scores and the inference bounds: the measurement behind `shared.tolerances.SCORE_LIMIT`
and `SCORE_EXPONENT` (how the float32 and half-precision bounds grow on models whose attentions
weigh large scores, such as trained ones).

Each model runs one padded batch (4 rows, up to 12 source and 10 target tokens) in the float64
oracle and in torch_impl and tf_impl (CPU, one thread; whichever is installed) in each precision
asked for; every named intermediate of each pair (torch vs the oracle, tf vs the oracle, torch vs
tf) is compared by the rule of `shared.tolerances`. Per model (the largest over its seeds) the
table gives the attentions' largest score ``S`` and the norms' largest conditioning ``kappa``
(`shared.conditioning`), then the largest difference as a fraction of its bound: as written
(grown with the norms only, as before the scores were followed), and grown by the rule with each
exponent asked for (``--exponents``; the rule's own is `SCORE_EXPONENT`). A fraction above 1 is a
comparison of two correct implementations that the bound would fail.

Sets of models:

* ``random``: presets tiny and small, seeds 0-3, and the 13 convention-15 variants, seeds 0-1:
  the random weights the bounds were measured on (``S`` up to 6);
* ``scaled``: tiny with its query and key kernels, or every kernel, times 1.5, 2, 3 and 5,
  seeds 0-2 (``S`` up to 137);
* ``deep``: small and base (2+2 and 6+6 layers), seed 0, query and key kernels times 3 and 5
  (base: 3 and 4), or every kernel times the square root of that;
* ``--checkpoint DIR ...``: trained models (`twins train` directories: the copy and dates demos
  score 33), seeds 0-2.

    PYTHONPATH=. python benchmarks/attention_scores.py [--sets random scaled deep]
        [--checkpoint runs/copy runs/dates] [--precisions float32 bfloat16 float16]
        [--exponents 1 1.5]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from shared import TransformerConfig, tolerances  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.conditioning import attention_scores, norm_conditioning  # noqa: E402
from shared.tolerances import bound_for, max_rel_diff, trace_bounds  # noqa: E402
from shared.weights import load_checkpoint, random_weights  # noqa: E402

PAIRS = ("torch:reference", "tf:reference", "torch:tf")
BACKENDS = [b for b, module in (("torch", "torch"), ("tf", "tensorflow")) if importlib.util.find_spec(module)]


def scaled(weights: dict, factor: float, which: str) -> dict:
    """``weights`` with the query and key kernels (``which="qk"``) or every kernel (``"all"``)
    times ``factor``."""
    def picked(name: str) -> bool:
        return name.endswith(".kernel") and (which == "all" or ".query." in name or ".key." in name)
    return {name: value * factor if picked(name) else value for name, value in weights.items()}


def models(sets: list[str], checkpoints: list[str]):
    """``(label, config, weights, seed)`` of every model of ``sets`` and ``checkpoints``."""
    from parity_tests import variant_configs
    if "random" in sets:
        for preset in ("tiny", "small"):
            config = TransformerConfig.preset(preset, dtype="float64")
            for seed in range(4):
                yield preset, config, random_weights(config, seed), seed
        for variant in variant_configs.VARIANTS:
            config = variant_configs.config(variant)
            for seed in range(2):
                yield variant, config, random_weights(config, seed), seed
    if "scaled" in sets:
        config = TransformerConfig.preset("tiny", dtype="float64")
        for factor in (1.5, 2, 3, 5):
            for which in ("qk", "all"):
                for seed in range(3):
                    yield f"tiny {which} x{factor:g}", config, scaled(random_weights(config, seed), factor, which), seed
    if "deep" in sets:
        for preset, factors in (("small", (3, 5)), ("base", (3, 4))):
            config = TransformerConfig.preset(preset, dtype="float64")
            for factor in factors:
                yield f"{preset} qk x{factor:g}", config, scaled(random_weights(config, 0), factor, "qk"), 0
                yield (f"{preset} all x{factor ** 0.5:.3g}", config,
                       scaled(random_weights(config, 0), factor ** 0.5, "all"), 0)
    for path in checkpoints:
        config, weights = load_checkpoint(path)[:2]
        for seed in range(3):
            yield os.path.basename(os.path.normpath(path)), config, weights, seed


def traces(config, weights, seed: int, precision: str) -> dict:
    """Every implementation's trace of one padded batch (the oracle's in float64)."""
    from twins.backends import make_adapter
    config = config.replace(dtype="float32")
    weights = {name: np.asarray(value, np.float32) for name, value in weights.items()}
    src, tgt = src_tgt(config, 4, min(12, config.max_len), min(10, config.max_len), seed=seed)
    out = {"reference": make_adapter("reference", config, weights).trace(src, tgt)}
    for backend in BACKENDS:
        adapter = make_adapter(backend, config, weights, threads=1)
        if precision != "float32":
            adapter.set_precision(precision)
        out[backend] = adapter.trace(src, tgt)
    return out


def fractions(config, weights, seed: int, precision: str, exponents: list[float]) -> dict:
    """``S``, ``kappa`` and the largest fraction of each bound (as written; grown by each exponent)."""
    ran = traces(config, weights, seed, precision)
    ref = ran["reference"]
    f64 = {name: np.asarray(value, np.float32).astype(np.float64) for name, value in weights.items()}
    kappas, scores = norm_conditioning(config, f64, ref), attention_scores(config, f64, ref)
    result = {"S": max(scores.values(), default=0.0), "kappa": max(kappas.values(), default=0.0)}
    pairs = [p for p in PAIRS if all(side in ran for side in p.split(":"))]
    rules = {"written": None, **{f"x{e:g}": e for e in exponents}}
    written_exponent = tolerances.SCORE_EXPONENT
    try:
        for column, exponent in rules.items():
            worst = 0.0
            for pair in pairs:
                a, b = pair.split(":")
                bound = bound_for(precision, pair)
                if exponent is None:  # the norms alone: the rule before the scores were followed
                    bounds = trace_bounds(bound, kappas, ref)
                else:
                    tolerances.SCORE_EXPONENT = exponent
                    bounds = trace_bounds(bound, kappas, ref, scores)
                worst = max(worst, max(max_rel_diff(ran[a][n], ran[b][n]) / bounds[n].rtol for n in ref))
            result[column] = worst
    finally:
        tolerances.SCORE_EXPONENT = written_exponent
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sets", nargs="*", default=["random", "scaled", "deep"],
                        choices=["random", "scaled", "deep"])
    parser.add_argument("--checkpoint", nargs="*", default=[], help="twins train directories")
    parser.add_argument("--precisions", nargs="+", default=["float32", "bfloat16", "float16"],
                        choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--exponents", nargs="+", type=float, default=[1.0, tolerances.SCORE_EXPONENT])
    args = parser.parse_args()
    versions = []
    if "torch" in BACKENDS:
        import torch
        torch.set_num_threads(1)
        versions.append(f"torch {torch.__version__}")
    if "tf" in BACKENDS:
        import tensorflow as tf
        versions.append(f"TF {tf.__version__}")
    print(f"# {platform.processor() or platform.machine()}, {', '.join(versions)}, CPU, one thread; "
          f"SCORE_LIMIT {tolerances.SCORE_LIMIT}, HALF_CONDITIONING {tolerances.HALF_CONDITIONING}")
    columns = ["written", *(f"x{e:g}" for e in args.exponents)]
    for precision in args.precisions:
        print(f"\n## {precision}: the largest difference as a fraction of its bound, over "
              f"{', '.join(PAIRS)} and every intermediate")
        grown = " | ".join(f"grown, S ** {c[1:]}" for c in columns[1:])
        print(f"| model | S | kappa | as written (norms only) | {grown} |")
        print("|---|---|---|---|" + "---|" * (len(columns) - 1))
        rows: dict[str, dict] = {}
        for label, config, weights, seed in models(args.sets, args.checkpoint):
            got = fractions(config, weights, seed, precision, args.exponents)
            row = rows.setdefault(label, dict.fromkeys(["S", "kappa", *columns], 0.0))
            for key, value in got.items():
                row[key] = max(row[key], value)
        for label, row in rows.items():
            print(f"| {label} | {row['S']:.1f} | {row['kappa']:.2f} | "
                  + " | ".join(f"{row[c]:.2f}" for c in columns) + " |")
        largest = (f"**{max(r[c] for r in rows.values()):.2f}**" for c in columns)
        print("| **largest** | | | " + " | ".join(largest) + " |")


if __name__ == "__main__":
    main()
