"""Random configurations and the inference bounds: the measurement behind
`shared.tolerances.FLOAT32_CONDITIONING` (where float32's bounds start to grow with the layer norms'
conditioning), and a check of every precision's bounds beyond the presets and variants they were
measured on.

The configurations are the parity suite's own hypothesis strategy (`parity_tests.strategies.cases`:
widths 1 to 16, 1-2 layers a stack, every norm style, ``norm_eps`` 1e-6 to 0.5, every
architecture variant, padded batches with all-padding rows), drawn from ``--seed`` (the suite
draws a fixed handful; this draws ``--examples``). Each runs in the float64 oracle and, through
`twins compare`'s adapters (CPU, one thread), in torch_impl and tf_impl (eager) in each precision
asked for; every traced tensor of each pair (torch vs the oracle, tf vs the oracle, torch vs tf) is
compared by the rule of `shared.tolerances`. Per model width the table gives the configurations,
the norms' largest conditioning ``kappa`` and the largest difference as a fraction of its bound:
grown with the attention scores alone (float32's rule before it followed the norms) and grown by
the rule (`trace_bounds`: norms and scores); then how many configurations exceed each. A fraction
above 1 is a comparison of two correct implementations that the bound fails.

    PYTHONPATH=. python benchmarks/random_configs.py [--examples 600] [--seed 0]
        [--precisions float32 bfloat16 float16] [--backends torch tf] [--batches compare]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

from shared import reference, tolerances  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.conditioning import attention_scores, norm_conditioning  # noqa: E402
from shared.tolerances import bound_for, max_rel_diff, trace_bounds  # noqa: E402
from shared.weights import random_weights  # noqa: E402

INSTALLED = [b for b, module in (("torch", "torch"), ("tf", "tensorflow")) if importlib.util.find_spec(module)]


def configurations(examples: int, seed: int) -> list:
    """``(config, src, tgt, weights_seed)`` of ``examples`` draws of the suite's strategy from
    ``seed`` (as float32 configs), duplicates dropped."""
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as seeded

    from parity_tests.strategies import cases
    drawn, seen = [], set()

    @seeded(seed)
    @settings(max_examples=examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=cases())
    def draw(case):
        config, src, tgt, weights_seed = case
        key = json.dumps([config.to_dict(), src.tolist(), tgt.tolist(), weights_seed])
        if key not in seen:
            seen.add(key)
            drawn.append((config.replace(dtype="float32"), src, tgt, weights_seed))

    draw()
    return drawn


def fractions(config, src, tgt, weights_seed: int, precision: str, backends: list[str]) -> dict:
    """``kappa``, the largest fraction of its bound over the pairs grown by the scores alone
    (``scores``) and by the rule (``grown``), and per pair ``(grown, tensor, kappa, S)`` at its
    worst tensor (``pairs``)."""
    from twins.backends import make_adapter
    weights = random_weights(config, weights_seed)
    f64 = {name: value.astype(np.float64) for name, value in weights.items()}
    ref = reference.forward(f64, config.replace(dtype="float64"), src, tgt, return_trace=True)[1]
    ran = {"reference": ref}
    for backend in backends:
        adapter = make_adapter(backend, config, weights, threads=1)
        if precision != "float32":
            adapter.set_precision(precision)
        ran[backend] = adapter.trace(src, tgt)
    kappas, scores = norm_conditioning(config, f64, ref), attention_scores(config, f64, ref)
    pairs = [f"{b}:reference" for b in backends] + (["torch:tf"] if len(backends) == 2 else [])
    result = {"kappa": max(kappas.values(), default=0.0), "pairs": {}}
    upstream, k, s = {}, 0.0, 0.0  # each tensor's worst norm and score at or before it
    for name in ref:
        k, s = max(k, kappas.get(name, 0.0)), max(s, scores.get(name, 0.0))
        upstream[name] = (k, s)
    for pair in pairs:
        a, b = pair.split(":")
        bound = bound_for(precision, pair)
        diffs = {n: max_rel_diff(np.asarray(ran[a][n], np.float64), ran[b][n]) for n in ref}
        for column, bounds in (("scores", trace_bounds(bound, {}, ref, scores)),
                               ("grown", trace_bounds(bound, kappas, ref, scores))):
            worst = max(ref, key=lambda n: diffs[n] / bounds[n].rtol)
            fraction = diffs[worst] / bounds[worst].rtol
            result[column] = max(result.get(column, 0.0), fraction)
            if column == "grown":
                result["pairs"][pair] = (fraction, worst, *upstream[worst])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=600, help="configurations drawn (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis' seed (default 0)")
    parser.add_argument("--precisions", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--backends", nargs="+", default=INSTALLED, choices=["torch", "tf"])
    parser.add_argument("--batches", choices=["strategy", "compare"], default="strategy",
                        help="the strategy's padded batches, or twins compare's: 2 rows of the "
                             "model's max_len (at most 16 and 12 tokens), drawn from the weights' seed")
    args = parser.parse_args()
    versions = []
    if "torch" in args.backends:
        import torch
        torch.set_num_threads(1)
        versions.append(f"torch {torch.__version__}")
    if "tf" in args.backends:
        import tensorflow as tf
        versions.append(f"TF {tf.__version__}")
    drawn = configurations(args.examples, args.seed)
    if args.batches == "compare":
        drawn = [(config, *src_tgt(config, 2, min(16, config.max_len), min(12, config.max_len), seed=weights_seed),
                  weights_seed) for config, _, _, weights_seed in drawn]
    print(f"# {platform.processor() or platform.machine()}, {', '.join(versions)}, CPU, one thread; "
          f"{len(drawn)} configurations (hypothesis seed {args.seed}, {args.batches}'s batches); FLOAT32_CONDITIONING "
          f"{tolerances.FLOAT32_CONDITIONING}, HALF_CONDITIONING {tolerances.HALF_CONDITIONING}, "
          f"SCORE_LIMIT {tolerances.SCORE_LIMIT}")
    for precision in args.precisions:
        rows: dict[int, dict] = {}
        worst: dict[str, tuple] = {}  # pair: (fraction, tensor, kappa, S, d_model)
        for config, src, tgt, weights_seed in drawn:
            got = fractions(config, src, tgt, weights_seed, precision, args.backends)
            for pair, found in got["pairs"].items():
                if found[0] > worst.get(pair, (-1.0,))[0]:
                    worst[pair] = (*found, config.d_model)
            row = rows.setdefault(config.d_model, {"n": 0, "kappa": 0.0, "scores": 0.0, "grown": 0.0,
                                                   "over scores": 0, "over grown": 0})
            row["n"] += 1
            for key in ("kappa", "scores", "grown"):
                row[key] = max(row[key], got[key])
            row["over scores"] += got["scores"] > 1.0
            row["over grown"] += got["grown"] > 1.0
        print(f"\n## {precision}: the largest difference as a fraction of its bound, over "
              f"{', '.join(args.backends)} against the oracle{' and each other' if len(args.backends) == 2 else ''}, "
              "every traced tensor")
        print("| d_model | configs | largest kappa | scores' growth alone | grown by the rule | over, scores alone "
              "| over, grown |")
        print("|---|---|---|---|---|---|---|")
        for width in sorted(rows):
            r = rows[width]
            print(f"| {width} | {r['n']} | {r['kappa']:.3g} | {r['scores']:.2f} | {r['grown']:.2f} | "
                  f"{r['over scores']} | {r['over grown']} |")
        total = {key: sum(r[key] for r in rows.values()) for key in ("n", "over scores", "over grown")}
        print(f"| **all** | {total['n']} | | {max(r['scores'] for r in rows.values()):.2f} | "
              f"{max(r['grown'] for r in rows.values()):.2f} | {total['over scores']} | {total['over grown']} |")
        print("\nEach pair's largest fraction of its grown bound: " + "; ".join(
            f"{pair} {f:.2f} (d_model {d}, {tensor}, kappa {k:.3g}, S {s:.3g} before it)"
            for pair, (f, tensor, k, s, d) in worst.items()))


if __name__ == "__main__":
    main()
