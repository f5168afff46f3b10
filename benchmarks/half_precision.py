"""Half-precision inference (bfloat16, float16) against the float64 oracle, and its tokens against
float32's: the measurements behind the "bfloat16" / "float16" inference bounds of
`shared/tolerances.py`.

Two parts, each for torch_impl (on ``--device``), where TensorFlow is installed tf_impl (CPU), and
with ``--backends ... onnx`` ONNX Runtime (CPU) on a float16 ONNX export built in memory
(`shared.exporters.onnx`, ``precision="float16"``; bfloat16 exports are refused, so skipped):

* ``parity``: for each precision, preset and seed, from the same `random_weights`: the largest
  difference of the forward logits, of every named intermediate of the trace, and of the logits of
  cached decoding steps (teacher-forced on a target without padding) from the float64 oracle,
  and the same between every two backends run (an export's graphs name no intermediate but the
  logits: its intermediates column is "-");
* ``agreement``: trained checkpoints (``twins train`` directories, e.g. the copy and dates demos)
  decode their held-out sources greedily and with beam search (4, alpha 0.6) in float32 and in each
  half precision; the fraction of sequences whose tokens equal float32's is reported.

Every difference is ``max|a - b| / max(max|b|, 1)``, the rule of `shared.tolerances`.

    PYTHONPATH=. python benchmarks/half_precision.py parity [--presets tiny small] [--seeds 0 1 2]
        [--variants all|NAME ...] [--device cpu|cuda] [--backends torch tf onnx] [--precisions float16]
    PYTHONPATH=. python benchmarks/half_precision.py agreement --checkpoint runs/copy runs/dates
        [--device cpu|cuda] [--backends torch tf]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import platform

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import torch  # noqa: E402

import torch_impl  # noqa: E402
from shared import TransformerConfig, reference  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.masks import padding_id  # noqa: E402
from shared.conditioning import attention_scores, norm_conditioning  # noqa: E402
from shared.tolerances import bound_for, max_rel_diff, trace_bounds  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from torch_impl.precision import set_precision as torch_set_precision  # noqa: E402

HALF = ("bfloat16", "float16")
ONNX_PRECISIONS = ("float16",)  # the ONNX export refuses bfloat16 (shared.exporters.onnx.refusals)


def as_f64(x) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy().astype(np.float64)
    return np.asarray(x).astype(np.float64)


def build(backend: str, config, weights, precision: str, device: str):
    if backend == "onnx":
        from twins.onnx_runtime import OnnxRuntimeModel
        return OnnxRuntimeModel.from_weights(config, weights, threads=torch.get_num_threads(), precision=precision)
    if backend == "torch":
        model = torch_impl.Transformer(config)
        model.import_weights(weights)
        model.to(device).eval()
        torch_set_precision(model, precision)
        return model
    import tf_impl
    from tf_impl.precision import set_precision
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    set_precision(model, precision)
    return model


def inputs(config, seed: int):
    """(src (4, 12) with padding and an all-padding row, tgt (4, 10) without padding; as long as
    ``config.max_len`` allows)."""
    s, t = min(12, config.max_len), min(10, config.max_len)
    src, tgt = src_tgt(config, batch=4, src_len=s, tgt_len=t, seed=seed, src_lengths=[s, 3 * s // 4, s // 3, 0],
                       tgt_lengths=[t] * 4)
    return src, tgt


def forward_and_steps(backend: str, model, src: np.ndarray, tgt: np.ndarray, device: str):
    """Logits ``(B, T, V)``, the trace (None for ONNX Runtime: its graphs name no intermediate),
    and the cached steps' logits ``(B, T, V)`` of ``model``."""
    if backend == "onnx":
        step, state, steps = model.step(src), None, []
        for i in range(tgt.shape[1]):
            out, state = step(tgt, i, state)
            steps.append(as_f64(out))
        return as_f64(model.logits(src, tgt)), None, np.stack(steps, 1)
    if backend == "torch":
        s, t = torch.from_numpy(src).to(device), torch.from_numpy(tgt).to(device)
        with torch.inference_mode():
            logits, trace = model(s, t, return_trace=True)
            cache = model.init_cache(model.encode(s), torch_impl.inputs.make_src_mask(s, padding_id(model.config)),
                                     t.shape[1])
            steps = []
            for i in range(t.shape[1]):
                out, cache = model.decode_step(t[:, i], cache)
                steps.append(out)
        return as_f64(logits), {k: as_f64(v) for k, v in trace.items()}, as_f64(torch.stack(steps, 1))
    from tf_impl.inputs import make_src_mask
    logits, trace = model(src, tgt, return_trace=True)
    cache = model.init_cache(model.encode(src), make_src_mask(src, padding_id(model.config)), tgt.shape[1])
    steps = []
    for i in range(tgt.shape[1]):
        out, cache = model.decode_step(tgt[:, i], cache)
        steps.append(as_f64(out))
    return as_f64(logits), {k: as_f64(v) for k, v in trace.items()}, np.stack(steps, 1)


def _row(a, b, written: float, bounds) -> tuple:
    """(logits, every intermediate or None, steps, the largest difference as a fraction of its
    conditioned bound, the largest difference divided by its bound's growth) of run ``a`` against
    ``b``; ``written`` the bound's rtol as written, ``bounds`` each traced name's conditioned
    `Bound` (`trace_bounds`)."""
    (al, at, as_), (bl, bt, bs) = a, b
    diffs = {"logits": max_rel_diff(al, bl), "steps": max_rel_diff(as_, bs)}
    if at is not None and bt is not None:
        diffs |= {k: max_rel_diff(at[k], bt[k]) for k in bounds}
    inner = None if at is None or bt is None else max(v for k, v in diffs.items() if k != "steps")
    rtol = {k: bounds["logits" if k == "steps" else k].rtol for k in diffs}
    return (diffs["logits"], inner, diffs["steps"], max(diffs[k] / rtol[k] for k in diffs),
            max(diffs[k] * written / rtol[k] for k in diffs))


def parity(args) -> None:
    worst: dict[str, tuple[float, float, float]] = {}
    print("| precision | backend | model | seed | kappa | logits vs f64 | every intermediate "
          "| cached steps' logits | of the bound |")
    print("|---|---|---|---|---|---|---|---|---|")
    order = {"onnx": 0, "torch": 1, "tf": 2}  # pairs named as shared/tolerances.py names them
    from parity_tests import variant_configs as VC
    configs = {name: TransformerConfig.preset(name, dropout=0.0) for name in args.presets}
    configs |= {name: VC.config(name, "float32") for name in args.variants}
    for precision in args.precisions:
        backends = [b for b in args.backends if b != "onnx" or precision in ONNX_PRECISIONS]
        for preset, config in configs.items():
            for seed in args.seeds:
                weights = random_weights(config, seed)
                src, tgt = inputs(config, seed)
                f64 = config.replace(dtype="float64")
                ref_logits, ref = reference.forward({k: v.astype(np.float64) for k, v in weights.items()},
                                                    f64, src, tgt, return_trace=True)
                kappa = norm_conditioning(config, weights, ref)
                scores = attention_scores(config, weights, ref)  # below SCORE_LIMIT for random weights
                ran = {"reference": (ref_logits, ref, ref_logits)}
                for backend in backends:
                    model = build(backend, config, weights, precision, args.device)
                    ran[backend] = forward_and_steps(backend, model, src, tgt, args.device)
                    pairs = [(backend, "reference")] + [tuple(sorted((backend, other), key=order.get))
                                                        for other in ran if other not in (backend, "reference")]
                    for a, b in pairs:
                        key = f"{a}:{b}"
                        bound = bound_for(precision, key)
                        row = _row(ran[a], ran[b], bound.rtol, trace_bounds(bound, kappa, ref, scores))
                        inner = "-" if row[1] is None else f"{row[1]:.1e}"
                        label = a if b == "reference" else f"{a} vs {b}"
                        print(f"| {precision} | {label} | {preset} | {seed} | {max(kappa.values(), default=0.0):.2f} "
                              f"| {row[0]:.1e} | {inner} | {row[2]:.1e} | {row[3]:.2f} |")
                        raw = max(v for v in row[:3] if v is not None)
                        before = worst.get(f"{precision} {key}", (0.0, 0.0, 0.0))
                        worst[f"{precision} {key}"] = (max(before[0], raw), max(before[1], row[4]),
                                                       max(before[2], row[3]))
    print("\nmaxima (every intermediate, logits and steps): the largest difference; the largest "
          "difference divided by its bound's growth (shared.conditioning); the largest fraction of "
          "its conditioned bound:")
    for key, (raw, shrunk, fraction) in worst.items():
        print(f"  {key}: {raw:.2e}; {shrunk:.2e}; {fraction:.2f}")


def decode(backend: str, model, src: np.ndarray, max_len: int, device: str, beam: bool) -> np.ndarray:
    if backend == "onnx":
        return model.beam(src, max_len, 4, 0.6).tokens if beam else model.greedy(src, max_len).tokens
    if backend == "torch":
        s = torch.from_numpy(src).to(device)
        if beam:
            return torch_impl.beam_search(model, s, max_len, beam_size=4, length_penalty=0.6).tokens
        return torch_impl.greedy_decode(model, s, max_len).tokens
    import tf_impl
    if beam:
        return tf_impl.beam_search(model, src, max_len, beam_size=4, length_penalty=0.6).tokens
    return tf_impl.greedy_decode(model, src, max_len).tokens


def agreement(args) -> None:
    from shared.weights import load_checkpoint
    from twins import demo_tasks as tasks
    print("| checkpoint | backend | search | precision | sequences equal to float32's | exact vs targets |")
    print("|---|---|---|---|---|---|")
    for path in args.checkpoint:
        config, weights = load_checkpoint(path)[:2]
        task = tasks.infer_task(config)
        data = tasks.heldout(task, args.heldout)
        src = tasks.pad(data.sources)
        max_len = tasks.spec(task).target_len + 1
        for backend in args.backends:
            for beam in (False, True):
                base = None
                for precision in ("float32", *[p for p in args.precisions
                                               if backend != "onnx" or p in ONNX_PRECISIONS]):
                    model = build(backend, config, weights, precision, args.device)
                    tokens = np.asarray(decode(backend, model, src, max_len, args.device, beam))
                    base = tokens if base is None else base
                    same = float(np.mean(np.all(tokens == base, axis=1)))
                    exact = float(np.mean(tasks.exact(tokens, data.targets)))
                    print(f"| {os.path.basename(os.path.normpath(path))} ({task}) | {backend} "
                          f"| {'beam 4' if beam else 'greedy'} | {precision} | {same:.2%} ({len(src)}) "
                          f"| {exact:.2%} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("part", choices=["parity", "agreement"])
    parser.add_argument("--presets", nargs="*", default=["tiny", "small"])
    parser.add_argument("--variants", nargs="*", default=[],
                        help="parity: convention-15 variants (parity_tests/variant_configs.py), or 'all'")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--precisions", nargs="+", default=list(HALF), choices=HALF)
    parser.add_argument("--device", default="cpu", help="torch_impl's device (tf_impl runs on its own)")
    parser.add_argument("--backends", nargs="+", choices=["torch", "tf", "onnx"],
                        default=["torch", "tf"] if importlib.util.find_spec("tensorflow") else ["torch"])
    parser.add_argument("--checkpoint", nargs="+", default=[], help="agreement: twins train directories")
    parser.add_argument("--heldout", type=int, default=500, help="agreement: held-out sources per task")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    args = parser.parse_args()
    if args.variants == ["all"]:
        from parity_tests import variant_configs as VC
        args.variants = list(VC.VARIANTS)
    torch.set_num_threads(args.threads)
    gpu = torch.cuda.get_device_name() if args.device.startswith("cuda") else platform.processor() or "cpu"
    print(f"torch {torch.__version__} on {args.device} ({gpu}), {torch.get_num_threads()} CPU threads; "
          f"backends {args.backends}")
    if args.device.startswith("cuda"):  # TF32 off, as every comparison in the project (docs/design.md)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    parity(args) if args.part == "parity" else agreement(args)


if __name__ == "__main__":
    main()
