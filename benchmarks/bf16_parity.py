"""bfloat16 mixed precision: torch (autocast) vs TF (Keras mixed_bfloat16) vs the float64 reference.

For each preset and seed, from the same `random_weights`:

* forward: the logits of the bfloat16 runs against the float64 oracle (`shared.reference`), and
  against each other; also the largest difference over every named intermediate of the trace;
* gradient: every canonical weight's gradient (label smoothing 0.1, a batch with padding), divided
  by the largest entry over the model, against torch_impl in float64 (which agrees with the oracle
  to 1e-12; the oracle itself has no gradients), and bfloat16 torch against bfloat16 TF;
* training: `--steps` Adam + Noam steps (warmup 10, factor 0.1) on copy-style batches: the weights
  (scale max(|w|, 1)) against a float64 torch run, and bfloat16 torch against bfloat16 TF.

Every figure is ``max|a - b| / max(max|b|, 1)``, the rule of `shared.tolerances`. Prints a Markdown
table (docs/demos.md's) and the maxima the bounds in `shared/tolerances.py` were set from.

    PYTHONPATH=. python benchmarks/bf16_parity.py [--presets tiny small] [--seeds 0 1 2] [--steps 20]
"""
from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from shared import TransformerConfig, reference, tasks  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import max_rel_diff  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl import precision as tf_precision, training as tf_training  # noqa: E402
from torch_impl import precision as torch_precision, training as torch_training  # noqa: E402

WARMUP, FACTOR, SMOOTHING = 10, 0.1, 0.1


def models(config, weights, precision: str):
    t = torch_impl.Transformer(config)
    t.import_weights(weights)
    t.eval()
    f = tf_impl.Transformer(config)
    f.import_weights(weights)
    torch_precision.set_precision(t, precision)
    tf_precision.set_precision(f, precision)
    return t, f


def batch(config, seed: int, vocab: int | None = None):
    """(src, tgt_in, tgt_out) of 4 rows with padding (the loss's targets: next tokens)."""
    src, tgt_in = src_tgt(config, batch=4, src_len=12, tgt_len=10, seed=seed,
                          src_lengths=[12, 9, 6, 3], tgt_lengths=[10, 7, 5, 2])
    tgt_out = np.roll(tgt_in, -1, axis=1)
    tgt_out[:, -1] = config.eos_id
    tgt_out[tgt_in == config.pad_id] = config.pad_id
    return src, tgt_in, tgt_out


def as_f32(x) -> np.ndarray:
    return np.asarray(x.float().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)).astype(np.float64)


def forward_row(config, weights, b) -> dict:
    src, tgt_in, _ = b
    f64 = config.replace(dtype="float64")
    _, ref = reference.forward({k: v.astype(np.float64) for k, v in weights.items()}, f64, src, tgt_in,
                               return_trace=True)
    t, f = models(config, weights, "bfloat16")
    with torch.no_grad():
        tl = as_f32(t(torch.from_numpy(src), torch.from_numpy(tgt_in)))
        _, tt = t(torch.from_numpy(src), torch.from_numpy(tgt_in), return_trace=True)
    fl = as_f32(f(src, tgt_in))
    _, ft = f(src, tgt_in, return_trace=True)
    trace = lambda tr: {k: as_f32(v) for k, v in tr.items()}  # noqa: E731
    tt, ft = trace(tt), trace(ft)
    return {"torch:reference": max_rel_diff(tl, ref["logits"]), "tf:reference": max_rel_diff(fl, ref["logits"]),
            "torch:tf": max_rel_diff(tl, fl),
            "trace torch:reference": max(max_rel_diff(tt[k], ref[k]) for k in ref),
            "trace tf:reference": max(max_rel_diff(ft[k], ref[k]) for k in ref),
            "trace torch:tf": max(max_rel_diff(tt[k], ft[k]) for k in ref)}


def normalised(grads: dict, scale: float) -> dict:
    return {k: v.astype(np.float64) / scale for k, v in grads.items()}


def gradient_row(config, weights, b) -> dict:
    f64 = config.replace(dtype="float64")
    exact = torch_training.gradients(models(f64, {k: v.astype(np.float64) for k, v in weights.items()},
                                            "float32")[0], b, SMOOTHING)
    t, f = models(config, weights, "bfloat16")
    tg, fg = torch_training.gradients(t, b, SMOOTHING), tf_training.gradients(f, b, SMOOTHING)
    scale = max(float(np.abs(g).max()) for g in exact.values())
    exact, tg, fg = normalised(exact, scale), normalised(tg, scale), normalised(fg, scale)
    skip = lambda n: n.endswith(".key.bias")  # noqa: E731  gradient-free: exact 0, rounding noise
    return {"torch:reference": max(max_rel_diff(tg[n], exact[n]) for n in exact if not skip(n)),
            "tf:reference": max(max_rel_diff(fg[n], exact[n]) for n in exact if not skip(n)),
            "torch:tf": max(max_rel_diff(tg[n], fg[n]) for n in exact if not skip(n))}


def copy_batches(steps: int, seed: int):
    pairs = tasks.copy_examples(4 * steps, seed)
    for i in range(steps):
        sources = [s[: 10 - 2 * j] for j, (s, _) in enumerate(pairs[4 * i: 4 * i + 4])]
        yield tasks.batch_sequences(sources, sources)


def training_row(config, weights, steps: int, seed: int) -> dict:
    config = config.replace(src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB)
    weights = random_weights(config, seed)
    f64 = config.replace(dtype="float64")
    exact = models(f64, {k: v.astype(np.float64) for k, v in weights.items()}, "float32")[0]
    t, f = models(config, weights, "bfloat16")
    opts = [torch_training.make_optimizer(exact, warmup=WARMUP, factor=FACTOR),
            torch_training.make_optimizer(t, warmup=WARMUP, factor=FACTOR),
            tf_training.make_optimizer(f, warmup=WARMUP, factor=FACTOR)]
    losses = []
    for b in copy_batches(steps, seed):
        losses.append([torch_training.train_step(exact, opts[0], b).loss,
                       torch_training.train_step(t, opts[1], b).loss,
                       tf_training.train_step(f, opts[2], b).loss])
    we, wt, wf = exact.export_weights(), t.export_weights(), f.export_weights()
    keep = [n for n in we if not n.endswith(".key.bias")]
    loss = np.array(losses)
    return {"torch:reference": max(max_rel_diff(wt[n], we[n]) for n in keep),
            "tf:reference": max(max_rel_diff(wf[n], we[n]) for n in keep),
            "torch:tf": max(max_rel_diff(wt[n], wf[n]) for n in keep),
            "loss torch:reference": float(np.abs(loss[:, 1] - loss[:, 0]).max()),
            "loss tf:reference": float(np.abs(loss[:, 2] - loss[:, 0]).max()),
            "loss torch:tf": float(np.abs(loss[:, 1] - loss[:, 2]).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["tiny", "small"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    torch.set_num_threads(1)
    worst: dict[str, float] = {}
    print("| preset | seed | what | bf16 torch vs f64 | bf16 TF vs f64 | bf16 torch vs bf16 TF |")
    print("|---|---|---|---|---|---|")
    for preset in args.presets:
        for seed in args.seeds:
            config = TransformerConfig.preset(preset, dropout=0.0)
            weights = random_weights(config, seed)
            b = batch(config, seed)
            rows = {"logits": forward_row(config, weights, b), "gradients": gradient_row(config, weights, b),
                    f"weights after {args.steps} steps": training_row(config, weights, args.steps, seed)}
            rows["every intermediate"] = {k.split(" ", 1)[1]: v for k, v in rows["logits"].items()
                                          if k.startswith("trace")}
            rows[f"loss, {args.steps} steps (abs)"] = {k.split(" ", 1)[1]: v
                                                         for k, v in rows[f"weights after {args.steps} steps"].items()
                                                         if k.startswith("loss")}
            for what, r in rows.items():
                print(f"| {preset} | {seed} | {what} | {r['torch:reference']:.1e} | {r['tf:reference']:.1e} "
                      f"| {r['torch:tf']:.1e} |")
                for pair in ("torch:reference", "tf:reference", "torch:tf"):
                    key = f"{what.split(',')[0].split(' after')[0]} {pair}"
                    worst[key] = max(worst.get(key, 0.0), r[pair])
    print("\nmaxima:")
    for key, value in worst.items():
        print(f"  {key}: {value:.2e}")


if __name__ == "__main__":
    main()
