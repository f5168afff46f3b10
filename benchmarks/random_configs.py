"""Random configurations and the inference bounds: the measurement behind
`shared.tolerances.VARIANTS_CONDITIONING` (where float32's bounds start to grow with the layer norms'
conditioning) and behind TF's, ONNX Runtime's and the decode margins' half-precision bounds, and a
check of every precision's bounds beyond the presets and variants they were first measured on.

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
above 1 is a comparison of two correct implementations that the bound fails. With ``onnx`` among
the backends, ONNX Runtime on the model's float32 or float16 export is compared at the logits
(against the oracle and each other backend). Per pair, split at 4 features, the largest fraction
and the rtol that would hold it; with each backend's decode margin: the largest move of the gap
between two candidates' log-probs, on the logits' scale (`shared.divergence.decode_margin`).
``--over FILE`` writes each configuration over a bound, to trace it.

    PYTHONPATH=. python benchmarks/random_configs.py [--examples 600] [--seed 0]
        [--precisions float32 bfloat16 float16] [--backends torch tf onnx] [--batches compare]
        [--over FILE]
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
from shared.loss import log_softmax  # noqa: E402
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
    traced = [b for b in backends if b != "onnx"]
    for backend in traced:
        adapter = make_adapter(backend, config, weights, threads=1)
        if precision != "float32":
            adapter.set_precision(precision)
        ran[backend] = adapter.trace(src, tgt)
    pairs = [f"{b}:reference" for b in traced] + (["torch:tf"] if len(traced) == 2 else [])
    if "onnx" in backends and precision != "bfloat16":  # an export's logits: float32 or float16
        from twins.onnx_runtime import OnnxRuntimeModel
        model = OnnxRuntimeModel.from_weights(config, weights, threads=1, precision=precision)
        ran["onnx"] = {"logits": model.logits(src, tgt)}
        pairs += [f"onnx:{b}" for b in ["reference", *traced]]
    kappas, scores = norm_conditioning(config, f64, ref), attention_scores(config, f64, ref)
    result = {"kappa": max(kappas.values(), default=0.0), "pairs": {}}
    upstream, k, s = {}, 0.0, 0.0  # each tensor's worst norm and score at or before it
    for name in ref:
        k, s = max(k, kappas.get(name, 0.0)), max(s, scores.get(name, 0.0))
        upstream[name] = (k, s)
    for pair in pairs:
        a, b = pair.split(":")
        bound = bound_for(precision, pair)
        names = [n for n in ref if n in ran[a]]  # an ONNX export gives its logits alone
        diffs = {n: max_rel_diff(np.asarray(ran[a][n], np.float64), ran[b][n]) for n in names}
        for column, bounds in (("scores", trace_bounds(bound, {}, ref, scores)),
                               ("grown", trace_bounds(bound, kappas, ref, scores))):
            worst = max(names, key=lambda n: diffs[n] / bounds[n].rtol)
            fraction = diffs[worst] / bounds[worst].rtol
            result[column] = max(result.get(column, 0.0), fraction)
            if column == "grown":
                result["pairs"][pair] = (fraction, worst, *upstream[worst])
    # how far two candidates' log-prob gap moves, on the logits' scale, against the decode margin
    margin = bound_for(precision, "decode-margin").conditioned(*upstream["logits"])
    for backend in [b for b in backends if b in ran]:
        moved = log_softmax(np.asarray(ran[backend]["logits"], np.float64)) - log_softmax(ref["logits"])
        gap = float(np.max(np.ptp(moved, axis=-1))) if moved.size else 0.0
        result["pairs"][f"{backend}:margin"] = (gap / margin.scale(ref["logits"]) / margin.rtol, "logits",
                                                *upstream["logits"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=600, help="configurations drawn (default 600)")
    parser.add_argument("--seed", type=int, default=0, help="hypothesis' seed (default 0)")
    parser.add_argument("--precisions", nargs="+", default=["float32"], choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--backends", nargs="+", default=INSTALLED, choices=["torch", "tf", "onnx"],
                        help="onnx: ONNX Runtime on the model's float32 or float16 export (its logits "
                             "against the oracle and each other backend; not in bfloat16)")
    parser.add_argument("--batches", choices=["strategy", "compare"], default="strategy",
                        help="the strategy's padded batches, or twins compare's: 2 rows of the "
                             "model's max_len (at most 16 and 12 tokens), drawn from the weights' seed")
    parser.add_argument("--over", metavar="FILE", help="write each configuration over a grown bound to "
                        "FILE, one JSON line (precision, config, src, tgt, weights_seed, pairs), to trace it")
    args = parser.parse_args()
    versions = []
    if "torch" in args.backends:
        import torch
        torch.set_num_threads(1)
        versions.append(f"torch {torch.__version__}")
    if "tf" in args.backends:
        import tensorflow as tf
        versions.append(f"TF {tf.__version__}")
    if "onnx" in args.backends:
        import onnxruntime
        versions.append(f"onnxruntime {onnxruntime.__version__}")
    drawn = configurations(args.examples, args.seed)
    if args.batches == "compare":
        drawn = [(config, *src_tgt(config, 2, min(16, config.max_len), min(12, config.max_len), seed=weights_seed),
                  weights_seed) for config, _, _, weights_seed in drawn]
    print(f"# {platform.processor() or platform.machine()}, {', '.join(versions)}, CPU, one thread; "
          f"{len(drawn)} configurations (hypothesis seed {args.seed}, {args.batches}'s batches); VARIANTS_CONDITIONING "
          f"{tolerances.VARIANTS_CONDITIONING}, HALF_CONDITIONING {tolerances.HALF_CONDITIONING}, "
          f"SCORE_LIMIT {tolerances.SCORE_LIMIT}")
    for precision in args.precisions:
        rows: dict[int, dict] = {}
        worst: dict[tuple, tuple] = {}  # (pair, widths): (fraction, tensor, kappa, S, d_model)
        over: dict[tuple, int] = {}  # (pair, widths): configurations over its grown bound
        for config, src, tgt, weights_seed in drawn:
            got = fractions(config, src, tgt, weights_seed, precision, args.backends)
            if args.over and got["grown"] > 1.0:
                with open(args.over, "a") as out:
                    out.write(json.dumps({"precision": precision, "config": config.to_dict(), "src": src.tolist(),
                                          "tgt": tgt.tolist(), "weights_seed": weights_seed,
                                          "pairs": got["pairs"]}) + "\n")
            for pair, found in got["pairs"].items():
                key = (pair, "2-3" if config.d_model < 4 else ">=4")  # 1 feature: every norm's output is its beta
                if found[0] > worst.get(key, (-1.0,))[0]:
                    worst[key] = (*found, config.d_model)
                over[key] = over.get(key, 0) + (found[0] > 1.0)
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
        print("\nPer pair (a backend against the oracle or another, and each backend's decode margin: the "
              "largest move of a two-candidate log-prob gap over the logits, on their scale, against the grown "
              "decode-margin), by width: its largest fraction of the grown bound, the rtol that would hold it "
              "(the difference divided by its growth), and where; the configurations over it.")
        print("| pair | widths | largest fraction | rtol needed | written rtol | d_model | tensor | kappa | S | over |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for (pair, widths), (f, tensor, k, s, d) in sorted(worst.items()):
            rtol = bound_for(precision, "decode-margin" if pair.endswith(":margin") else pair).rtol
            print(f"| {pair} | {widths} | {f:.2f} | {f * rtol:.3g} | {rtol:g} | {d} | {tensor} | {k:.3g} | {s:.3g} | "
                  f"{over[pair, widths]} |")


if __name__ == "__main__":
    main()
