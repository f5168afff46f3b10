"""`twins compare`: one set of weights in NumPy, PyTorch and TensorFlow; where do they part?"""
from __future__ import annotations

import importlib.util
import json
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

from shared.batches import src_tgt
from shared.threads import check_threads
from shared.conditioning import attention_scores, norm_conditioning
from shared.tolerances import bound_for, max_abs_diff, max_rel_diff, trace_bounds
from shared import TransformerConfig
from shared.config import PRESETS
from shared.devices import DEFAULT as DEFAULT_DEVICE
from shared.memory import total_memory
from shared.precision import HALF_PRECISIONS
from shared.saving import write_atomically
from shared.weights import check_buildable, random_weights

from . import arguments, loading
from .backends import COMPARED, Unavailable, make_adapter

DEFAULT_PRESET = "small"  # without --preset, --config or --checkpoint
# The sizes of the random batch and --decode's tokens where not given: each at most the model's
# max_len (a default adapts to the model; a value given over it is refused, never clamped).
DEFAULTS = {"src_len": 16, "tgt_len": 12, "max_new": 10}


def add_arguments(parser) -> None:
    source = parser.add_mutually_exclusive_group()
    source.add_argument("--preset", choices=sorted(PRESETS),
                        help=f"named config (default: {DEFAULT_PRESET})")
    source.add_argument("--checkpoint", metavar="PATH", type=arguments.path,
                        help="weights in any readable format (`twins convert --list-formats`; --from "
                             "and the format's options as there)")
    # Not in the group: with --checkpoint it is the config of a file that holds none.
    parser.add_argument("--config", metavar="FILE.json", type=arguments.path,
                        help="a TransformerConfig as JSON (random weights); with --checkpoint, the "
                             "config of a .pt holding a bare torch_impl state dict or a .weights.h5 "
                             "written by plain Keras save_weights (files written by this project hold "
                             "theirs)")
    parser.add_argument("--dtype", choices=["float32", "float64", *HALF_PRECISIONS],
                        help="override the config's dtype; bfloat16 / float16: a float32 model run in "
                        "that mixed precision by torch and tf, forward and decoding (shared.precision), "
                        "against the float64 oracle")
    parser.add_argument("--batch", type=arguments.integer, default=2,
                        help="rows of the random batch (default 2; bounded by this machine's memory: "
                             "every implementation's trace of it is held at once)")
    parser.add_argument("--src-len", type=arguments.integer,
                        help=f"source length of the random batch (default {DEFAULTS['src_len']}, or the "
                             "model's max_len if smaller)")
    parser.add_argument("--tgt-len", type=arguments.integer,
                        help=f"target length of the random batch (default {DEFAULTS['tgt_len']}, or the "
                             "model's max_len if smaller)")
    parser.add_argument("--seed", type=arguments.seed, default=0)
    parser.add_argument("--backends", default="torch,tf",
                        help="comma-separated implementations to compare with the reference: torch, "
                             "tf, onnx (ONNX Runtime on an in-memory export: the logits only, its "
                             "graphs name no other intermediate; not with --dtype bfloat16). A run "
                             "that compares nothing (none named, or every one not installed) fails, "
                             "exit 1")
    parser.add_argument("--decode", action="store_true",
                        help="also decode greedily in every implementation and compare the tokens")
    parser.add_argument("--max-new", type=arguments.integer,
                        help=f"tokens to decode with --decode (default {DEFAULTS['max_new']}, or the "
                             "model's max_len if smaller)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON ('-' for stdout)")
    parser.add_argument("--threads", type=arguments.integer, metavar="N",
                        help="CPU threads of each framework (default: its own, one per core; idle "
                             "threads sleep, OMP_WAIT_POLICY=PASSIVE, see shared/threads.py)")
    parser.add_argument("--device", type=arguments.device, default=DEFAULT_DEVICE,
                        help="where torch and tf compute: cpu (default), cuda or cuda:N (float32 "
                             "products in float32 there: TF32 off; shared/devices.py), against the "
                             "same bounds; the reference is NumPy on the CPU; not with onnx")
    loading.add_arguments(parser, config=False, skip=("dtype",))  # --dtype: compare's own


def _source(args) -> tuple[TransformerConfig, dict | None]:
    """The config and, from ``--checkpoint``, its weights (None: random weights to draw, once the
    sizes are checked)."""
    if args.checkpoint is not None:  # with --config where the file holds no config (loading.config_of)
        _, config, weights = loading.read(args.checkpoint, args)
    else:
        if args.config is not None:
            config = loading.config_file(args.config)
        else:
            config = TransformerConfig.preset(args.preset or DEFAULT_PRESET)
        weights = None
    dtype = "float32" if args.dtype in HALF_PRECISIONS else args.dtype  # half: float32 weights
    if dtype and dtype != config.dtype:
        config = config.replace(dtype=dtype)
        weights = None if weights is None else {k: v.astype(dtype) for k, v in weights.items()}
    if weights is None:
        check_buildable(config, "inference", f"--config {args.config!r}" if args.config is not None
                        else f"--preset {args.preset or DEFAULT_PRESET}")
    return config, weights


def trace_bytes(config: TransformerConfig, batch: int, src_len: int, tgt_len: int,
                backends: list[str]) -> int:
    """The bytes of the traces `run` holds at once for a batch of ``batch`` rows: the reference's
    (float64) and each backend's (the model's dtype; ONNX Runtime's: the logits alone), every named
    intermediate of `shared.reference.trace_names` counted at its shape. A floor: what each
    implementation allocates on the way (its own activations, the weights) comes on top."""
    from shared.reference import trace_names
    heads, d, vocab = config.n_heads, config.d_model, config.tgt_vocab
    values = 0  # of one row
    for name in trace_names(config):
        length = src_len if name.startswith("encoder.") else tgt_len
        if name == "logits":
            values += tgt_len * vocab
        elif name.endswith("cross_attn.weights"):
            values += heads * tgt_len * src_len
        elif name.endswith(".weights"):
            values += heads * length * length
        else:
            values += length * d
    logits = tgt_len * vocab
    itemsize = 8 if config.dtype == "float64" else 4
    per_row = values * 8 + sum(logits * itemsize if b == "onnx" else values * itemsize for b in backends)
    return batch * per_row


# The package each backend's trace needs (`importlib.util.find_spec`: nothing is imported).
_FRAMEWORK = {"torch": "torch", "tf": "tensorflow", "onnx": "onnxruntime"}


def _check_batch_fits(config: TransformerConfig, args, backends: list[str]) -> None:
    """Refuse a ``--batch`` whose traces (`trace_bytes`) exceed this machine's memory
    (`shared.memory.total_memory`), before anything of the batch's size is built: ``--batch
    100000000`` was killed by the kernel's OOM killer (exit 137, no message)."""
    limit = total_memory()
    # only the backends that can run here hold a trace (one not installed is skipped): a floor
    present = [b for b in backends if importlib.util.find_spec(_FRAMEWORK[b]) is not None]
    need = trace_bytes(config, args.batch, args.src_len, args.tgt_len, present)
    if limit is not None and need > limit:
        compared = ", ".join(["reference", *present])
        raise ValueError(f"--batch {args.batch}: at --src-len {args.src_len} and --tgt-len "
                         f"{args.tgt_len} the traces of {compared} (held at once) need at least "
                         f"{need / 2**30:,.1f} GiB, more than this machine's {limit / 2**30:.1f} GiB; "
                         "give a smaller --batch")


def _check_used(args) -> None:
    """Options the comparison would ignore, refused by name: the tokens of a decode not asked
    for, and a file's options (``--from``, the format options) where no file is read."""
    if args.max_new is not None and not args.decode:
        raise ValueError("--max-new: the tokens --decode decodes, and --decode is not given")
    if args.checkpoint is None:
        given = [loading.flag(name) for name in loading.given_options(args, "read")]
        if args.src_format is not None:
            given.insert(0, "--from")
        if given:
            drawn = (f"--config {args.config!r}" if args.config is not None
                     else f"--preset {args.preset or DEFAULT_PRESET}")
            raise ValueError(f"{', '.join(given)}: only with --checkpoint (they describe the file "
                             f"read), not {drawn}, whose weights are drawn at random")


def run(args) -> int:
    for name in ("batch", *DEFAULTS):
        if getattr(args, name) is not None and getattr(args, name) < 1:  # None where not given
            raise ValueError(f"--{name.replace('_', '-')}: expected a positive int, got {getattr(args, name)}")
    _check_used(args)
    check_threads(args.threads)
    backends = [b for b in args.backends.split(",") if b]
    unknown = [b for b in backends if b not in COMPARED]
    if unknown:
        raise ValueError(f"--backends: expected names from {COMPARED}, got {unknown}")
    if len(set(backends)) < len(backends):  # (none: the reference alone)
        raise ValueError(f"--backends: expected each of {COMPARED} at most once, got {args.backends!r}")
    if "onnx" in backends and args.dtype == "bfloat16":  # it was skipped, and nothing compared passed
        raise ValueError("--backends onnx with --dtype bfloat16: the ONNX export computes in float32, "
                         "float64 or float16, not bfloat16; drop onnx from --backends or choose "
                         "another --dtype")
    if "onnx" in backends and args.device != DEFAULT_DEVICE:  # before any work, not after the others
        raise ValueError(f"--backends onnx with --device {args.device}: ONNX Runtime runs here on its "
                         "CPU provider; drop onnx from --backends or use --device cpu")
    if args.preset is not None and args.config is not None:
        raise ValueError(f"--config {args.config!r} with --preset {args.preset}: give one of them "
                         "(--config goes with --checkpoint only for a file that holds no config)")
    if args.json is not None and args.json != "-":  # a FIFO would block the write after the work
        loading.check_output("--json", args.json, {"--checkpoint": args.checkpoint,
                                                   "--config": args.config})
    config, weights = _source(args)
    for name, default in DEFAULTS.items():  # named as typed, before any model sees them
        if getattr(args, name) is None:
            setattr(args, name, min(default, config.max_len))
        elif getattr(args, name) > config.max_len:
            raise ValueError(f"--{name.replace('_', '-')}: expected at most the model's max_len="
                             f"{config.max_len}, got {getattr(args, name)}")
    _check_batch_fits(config, args, backends)
    if weights is None:
        weights = random_weights(config, args.seed)
    # With --json - stdout carries the JSON alone (to pipe it); the table goes to stderr.
    out = sys.stderr if args.json == "-" else sys.stdout
    src, tgt = src_tgt(config, args.batch, args.src_len, args.tgt_len, seed=args.seed)

    adapters, skipped = {"reference": make_adapter("reference", config, weights)}, {}
    for name in backends:
        try:
            with arguments.flags("device"):
                adapters[name] = make_adapter(name, config, weights, threads=args.threads,
                                              device=args.device)
        except Unavailable as err:
            skipped[name] = str(err)
        else:
            if args.dtype in HALF_PRECISIONS:
                adapters[name].set_precision(args.dtype)
    # The bounds of the arithmetic that ran: each mixed precision has its own.
    bounds_dtype = args.dtype if args.dtype in HALF_PRECISIONS else config.dtype
    traces = {name: a.trace(src, tgt) for name, a in adapters.items()}
    names = list(traces["reference"])
    # The bounds grow on a model that magnifies rounding more than the random weights they were
    # measured on: past large attention scores, and in half precision past ill-conditioned layer
    # norms (shared.conditioning).
    conditioning = norm_conditioning(config, weights, traces["reference"])
    scores = attention_scores(config, weights, traces["reference"])
    # Pairs read "torch:reference", "tf:reference", "torch:tf" (and "onnx:reference", "onnx:torch",
    # "onnx:tf"), as the tolerance table names them.
    order = {"onnx": 0, "torch": 1, "tf": 2, "reference": 3}
    pairs = [tuple(sorted(p, key=order.get)) for p in combinations(adapters, 2)]

    # Nothing compared is no agreement: every backend skipped (not installed), or none asked for
    # (--backends '': the reference's intermediates alone) fails, as the table says.
    rows, first_parting, ok = [], None, bool(pairs)
    written = {f"{a}:{b}": bound_for(bounds_dtype, f"{a}:{b}") for a, b in pairs}
    bounds = {pair: trace_bounds(bound, conditioning, names, scores) for pair, bound in written.items()}
    for name in names:
        ref = traces["reference"][name]
        row = {"name": name, "shape": list(ref.shape), "pairs": {},
               "reference": {"mean": float(ref.mean()), "std": float(ref.std()),
                             "max_abs": float(np.abs(ref).max())}}
        for a, b in pairs:
            bound = bounds[f"{a}:{b}"][name]
            if "onnx" in (a, b) and name not in traces["onnx"]:  # the logits alone: nothing to compare
                row["pairs"][f"{a}:{b}"] = {"absent": True, "pass": True}
                continue
            if name not in traces[a] or name not in traces[b]:
                row["pairs"][f"{a}:{b}"] = {"missing": True, "pass": False}
                passed = False
            else:
                x, y = traces[a][name], traces[b][name]
                passed = bool(bound.allows(x, y))
                row["pairs"][f"{a}:{b}"] = {"max_abs": max_abs_diff(x, y), "max_rel": max_rel_diff(x, y),
                                            "bound": bound.rtol, "pass": passed}
            if not passed:
                ok = False
        if not ok and first_parting is None and pairs:
            first_parting = {"name": name, "pairs": [p for p, r in row["pairs"].items() if not r["pass"]],
                             "diverging": diverging(row)}
        rows.append(row)
    timings = {name: a.time_forward(src, tgt) for name, a in adapters.items()}

    _print_table(config, args, rows, pairs, skipped, first_parting, timings, out,
                 _growth_note(written, bounds, conditioning, scores))
    decoding = None
    if args.decode:
        decoding = compare_decoding(config, weights, adapters, src, args.max_new, out, bounds_dtype)
        ok = ok and all(d["pass"] for d in decoding.values())
    if args.json:
        result = {"config": config.to_dict(), "batch": args.batch, "src_len": args.src_len,
                  "tgt_len": args.tgt_len, "rows": rows, "norm_conditioning": conditioning,
                  "attention_scores": scores, "skipped": skipped,
                  "first_parting": first_parting, "forward_seconds": timings, "decoding": decoding,
                  "pass": ok}
        text = json.dumps(result, indent=2)
        if args.json == "-":
            print(text)
        else:
            write_atomically(args.json, lambda tmp: Path(tmp).write_text(text + "\n", encoding="utf-8"))
    return 0 if ok else 1


def diverging(row: dict) -> str:
    """The implementation that parts from the reference at ``row``: the one whose comparison with
    the reference fails (both, when both do); where only a cross pair fails (each within its
    bound of the reference), the one farther from the reference, relative to its bound."""
    versus = {pair.split(":")[0]: r for pair, r in row["pairs"].items()
              if pair.endswith(":reference") and not r.get("missing") and not r.get("absent")}
    failing = [impl for impl, r in versus.items() if not r["pass"]]
    if failing:
        return " and ".join(failing)
    if not versus:
        return "an implementation"
    return max(versus, key=lambda impl: versus[impl]["max_rel"] / max(versus[impl]["bound"], 1e-300))


def _print_table(config, args, rows, pairs, skipped, first_parting, timings, out=sys.stdout,
                 growth: str | None = None) -> None:
    mixed = f" ({args.dtype} mixed precision)" if args.dtype in HALF_PRECISIONS else ""
    print(f"config: d_model={config.d_model} heads={config.n_heads} layers={config.n_encoder_layers}+"
          f"{config.n_decoder_layers} norm_first={config.norm_first} norm_style={config.norm_style} "
          f"dtype={config.dtype}{mixed}; batch={args.batch} src_len={args.src_len} "
          f"tgt_len={args.tgt_len}", file=out)
    for name, why in skipped.items():
        print(f"skipped {name}: {why}", file=out)
    if not pairs:
        print("nothing to compare: only the reference ran; its intermediates:", file=out)
    width = max(len(r["name"]) for r in rows)
    header = f"{'intermediate':<{width}}  {'shape':<18}"
    for a, b in pairs:
        header += f"  {a + ' vs ' + b:>28}"
    if not pairs:
        header += f"  {'mean':>10} {'std':>10} {'max|x|':>10}"
    print(header, file=out)
    for r in rows:
        line = f"{r['name']:<{width}}  {str(tuple(r['shape'])):<18}"
        for a, b in pairs:
            p = r["pairs"][f"{a}:{b}"]
            verdict = "ok" if p.get("pass") else "FAIL"  # one width, so FAIL shifts nothing
            cell = ("missing" if p.get("missing") else "-" if p.get("absent")
                    else f"{p['max_abs']:.2e} {p['max_rel']:.2e} {verdict:<4}")
            line += f"  {cell:>28}"
        if not pairs:
            stats = r["reference"]
            line += f"  {stats['mean']:>10.4f} {stats['std']:>10.4f} {stats['max_abs']:>10.4f}"
        print(line, file=out)
    if pairs:
        print("(each cell: max abs diff, max diff relative to the tensor's scale, verdict against "
              "shared/tolerances.py)", file=out)
        if growth:
            print(growth, file=out)
        if first_parting:
            failed = ", ".join(p.replace(":", " vs ") for p in first_parting["pairs"])
            ran = args.dtype if args.dtype in HALF_PRECISIONS else config.dtype
            hint = "" if ran == "float64" else (
                f"; {ran} rounding may explain it on a model the bounds were not measured on, so rerun "
                "with --dtype float64 to tell a bug from rounding")
            print(f"FAIL: {first_parting['diverging']} first diverges from the float64 reference at "
                  f"{first_parting['name']} (failing: {failed}){hint}", file=out)
        else:
            print(f"PASS: all {len(rows)} intermediates agree for {', '.join(a + ' vs ' + b for a, b in pairs)}",
                  file=out)
    else:
        why = "every backend asked for was skipped" if skipped else "--backends named none"
        print(f"FAIL: nothing was compared ({why}): a comparison needs the reference and at least "
              "one backend", file=out)
    print("forward time (median of 5; torch eval + no_grad, tf under tf.function): "
          + ", ".join(f"{n} {t * 1e3:.2f} ms" for n, t in timings.items()), file=out)


def _growth_note(written: dict, bounds: dict, conditioning: dict, scores: dict) -> str | None:
    """A line saying where the pairs' bounds grew, by how much and with what: the layer norms'
    conditioning or the attentions' scores (`shared.conditioning`, `Bound.conditioned`);
    None where none grew."""
    grown = {pair: max(b.rtol for b in per_name.values()) / written[pair].rtol for pair, per_name in bounds.items()}
    grown = {pair: growth for pair, growth in grown.items() if growth > 1.0}
    if not grown:
        return None
    pair = next(iter(grown))
    first = next(name for name, b in bounds[pair].items() if b.rtol > written[pair].rtol)
    causes = []
    norm = max(conditioning, key=conditioning.get, default=None)
    if norm is not None and any(b.conditioning is not None and conditioning[norm] > b.conditioning
                                for b in written.values()):
        causes.append(f"a layer norm's conditioning {conditioning[norm]:.3g} at {norm}")
    attention = max(scores, key=scores.get, default=None)
    if attention is not None and any(b.score_limit is not None and scores[attention] > b.score_limit
                                     for b in written.values()):
        causes.append(f"an attention's score {scores[attention]:.3g} at {attention}")
    return (f"bounds grown with the model (shared/conditioning.py): from {first} on, up to "
            f"x{max(grown.values()):.3g} for {', '.join(p.replace(':', ' vs ') for p in grown)}; "
            f"the largest: {' and '.join(causes)}")


def compare_decoding(config, weights, adapters, src: np.ndarray, max_new: int, out=None,
                     precision: str | None = None) -> dict:
    """Greedy-decode ``src`` in every implementation and compare each with the float64 oracle.

    Identical tokens pass. Where a backend parts from the oracle, the report gives the item, the
    step, both candidate tokens and the oracle's log-prob margin between them: a margin inside the
    error bound of the arithmetic that ran (`shared.divergence.decode_margin` of ``precision``,
    default the config's dtype: grown with the oracle's pass along its tokens, on its logits'
    scale) is a near-tie, which that arithmetic may break either way, and is reported as such; a
    larger margin is a failure. The report is printed to ``out`` (stdout).
    """
    precision = precision or config.dtype
    out = sys.stdout if out is None else out
    from shared.divergence import decode_margin, first_divergence, oracle_log_probs

    results = {name: adapter.greedy(src, max_new) for name, adapter in adapters.items()}
    report = {}
    ref = results["reference"]
    log_probs = oracle_log_probs(weights, config, src, ref.tokens)  # margins for divergences
    margin_bound = decode_margin(precision, weights, config, src, ref.tokens)
    print(f"decode: greedy, {max_new} new tokens, batch {src.shape[0]}; oracle tokens:", file=out)
    for row in ref.tokens:
        print("   ", " ".join(str(t) for t in row), file=out)
    for name, result in results.items():
        if name == "reference":
            continue
        parts = first_divergence(ref.tokens, result.tokens, log_probs)
        near_ties = [d for d in parts if abs(d.margin) <= margin_bound]
        passed = len(parts) == len(near_ties)
        report[name] = {"identical": not parts, "pass": passed,
                        "divergences": [d._asdict() for d in parts]}
        if not parts:
            print(f"decode: {name} vs reference: identical tokens", file=out)
        for d in parts:
            kind = f"near-tie (within the {precision} bound)" if d in near_ties else "FAIL"
            print(f"decode: {name} vs reference: {d}; {kind}", file=out)
    return report
