"""`twins convert SRC DST`: weights from one format to another, exactly; `--verify` proves it.

Formats (detected from the path; ``--from`` / ``--to`` override):

=================  ===================================  ====================================
format             path                                 read / written by
=================  ===================================  ====================================
``neutral``        a directory                          `shared.weights` (NumPy)
``torch``          ``*.pt``, ``*.pth``                  `torch_impl.checkpoints`
``tf``             ``*.weights.h5``                     `tf_impl.checkpoints`
``nn-transformer`` ``*.pt`` state dict (source only)    `shared.importers.from_nn_transformer`
``annotated``      ``*.pt`` state dict (source only)    `shared.importers.from_annotated`
``saved-model``    a directory (destination only)       `tf_impl.saved_model` (twins.saved_model)
=================  ===================================  ====================================

Every source is read into ``(config, canonical weights)`` and fully checked before anything is
written; the result is written atomically. ``--verify`` then loads the result in the target's
implementation (torch_impl, tf_impl, or the NumPy reference for a neutral directory) and the source
in its own, runs one batch through both, and prints a parity table for the logits against the
bounds of `shared.tolerances` (exit status 1 when it fails). An nn.Transformer or Annotated
state dict cannot be rebuilt into its model without that model's code, so for those sources the
imported weights are run in the reference and in both backends instead (the target's backend from
the converted file), and the output says so.

Each framework is imported only when a format needs it.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shared import TransformerConfig
from shared import checkpoints
from shared import weights as neutral
from shared.saving import recover

from . import saved_model

FORMATS = ("neutral", "torch", "tf")
IMPORTERS = ("nn-transformer", "annotated")
EXPORTS = (saved_model.FORMAT,)  # destinations that are programs, not checkpoints (`--to` only)
IMPL = {"neutral": "reference", "torch": "torch", "tf": "tf"}  # who runs each format in --verify
_IMPORTER_ARGS = ("n_heads", "norm_first", "pad_id", "bos_id", "eos_id", "norm_eps", "max_len", "dtype")


def add_arguments(parser) -> None:
    parser.add_argument("src", metavar="SRC", help="source: a neutral checkpoint directory, a "
                        "torch_impl .pt, a tf_impl .weights.h5, or (with --from) a state dict .pt")
    parser.add_argument("dst", metavar="DST", help="destination: a directory (neutral), a .pt "
                        "(torch_impl) or a .weights.h5 (tf_impl); replaced atomically if it exists")
    parser.add_argument("--from", dest="src_format", choices=FORMATS + IMPORTERS,
                        help="source format (default: from the path)")
    parser.add_argument("--to", dest="dst_format", choices=FORMATS + EXPORTS,
                        help="destination format (default: from the path); saved-model: a "
                             "TensorFlow SavedModel that decodes")
    parser.add_argument("--config", metavar="FILE.json",
                        help="the config, for a .pt holding a bare torch_impl state dict or a "
                             ".weights.h5 written by plain Keras save_weights (files written by "
                             "this project hold theirs)")
    parser.add_argument("--verify", action="store_true",
                        help="run one batch through source and result, print the logits parity "
                             "table (for a saved-model: its decoded tokens against tf_impl's); "
                             "exit 1 when it fails")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --verify batch")
    imp = parser.add_argument_group("importers (--from nn-transformer / annotated)")
    imp.add_argument("--n-heads", type=int, help="attention heads (required)")
    imp.add_argument("--norm-first", type=_bool, metavar="true|false",
                     help="nn-transformer only, required: the norm_first the model was built with")
    imp.add_argument("--pad-id", type=int, help="padding id (required)")
    imp.add_argument("--bos-id", type=int, help="begin-of-sequence id (required)")
    imp.add_argument("--eos-id", type=int, help="end-of-sequence id (required)")
    imp.add_argument("--norm-eps", type=float,
                     help="layer-norm eps (default: nn-transformer 1e-5, annotated 1e-6)")
    imp.add_argument("--max-len", type=int,
                     help="needed only if the state dict holds no positional table")
    imp.add_argument("--dtype", choices=["float32", "float64"], help="cast (default: the source's)")
    saved_model.add_arguments(parser, _bool)


def _bool(text: str) -> bool:
    """``--norm-first true|false``: explicit either way (a wrong placement loads silently)."""
    import argparse
    value = str(text).lower()
    if value not in ("true", "false"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return value == "true"


# -- formats --------------------------------------------------------------------------------------
def _torch_format() -> checkpoints.CheckpointFormat:
    from torch_impl import checkpoints as torch_checkpoints
    return torch_checkpoints.PT


def _tf_format() -> checkpoints.CheckpointFormat:
    from tf_impl import checkpoints as tf_checkpoints
    return tf_checkpoints.H5


# The project's formats, in `shared.checkpoints` terms; a backend's are looked up (and its framework
# imported) only when a file of it is read or written, never to tell a path's format. The suffixes
# are the backends' own (PT_SUFFIXES, H5_SUFFIX); test_porting_convert.py checks they agree.
FORMAT_OF = {
    "neutral": checkpoints.NEUTRAL,
    "torch": checkpoints.deferred("torch", (".pt", ".pth"), "a .pt file", _torch_format),
    "tf": checkpoints.deferred("tf", (".weights.h5",), "a .weights.h5 file", _tf_format),
}


def detect(path: str, role: str) -> str:
    """``neutral`` for a directory (or, as a destination, a path without a file suffix), ``torch``
    for ``*.pt`` / ``*.pth``, ``tf`` for ``*.weights.h5``; anything else needs ``--from`` / ``--to``
    (`shared.checkpoints.detect`)."""
    return checkpoints.detect(path, role, tuple(FORMAT_OF.values()))


def read(fmt: str, path: str, config: TransformerConfig | None = None, importer: dict | None = None
         ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """``(config, canonical weights)`` from ``path`` in format ``fmt``, fully checked."""
    if fmt in FORMAT_OF:
        return FORMAT_OF[fmt].read(path, config)
    from shared import importers
    from torch_impl import checkpoints as torch_checkpoints
    state_dict = torch_checkpoints.read_foreign_state_dict(path)
    importer = {k: v for k, v in (importer or {}).items() if v is not None}
    fn = importers.from_nn_transformer if fmt == "nn-transformer" else importers.from_annotated
    try:
        return fn(state_dict, **importer)
    except importers.ImporterError as err:  # name the file, not only the importer
        raise importers.ImporterError(f"{path!r} ({fn.__name__})", err.problems) from None


def write(fmt: str, path: str, config: TransformerConfig, weights: dict) -> None:
    """Write ``weights`` to ``path`` in format ``fmt``, atomically."""
    FORMAT_OF[fmt].write(path, config, weights)


def _importer_options(args, fmt: str) -> dict | None:
    given = {k: getattr(args, k) for k in _IMPORTER_ARGS if getattr(args, k) is not None}
    if fmt not in IMPORTERS:
        if given:
            flags = ", ".join("--" + k.replace("_", "-") for k in given)
            raise ValueError(f"{flags}: only for --from nn-transformer / annotated (this source "
                             f"is {fmt}, which holds its config)")
        return None
    required = ["n_heads", "pad_id", "bos_id", "eos_id"] + (["norm_first"] if fmt == "nn-transformer" else [])
    lacking = ["--" + k.replace("_", "-") for k in required if k not in given]
    if lacking:
        raise ValueError(f"--from {fmt}: {', '.join(lacking)} required (not stored in a state dict)")
    if fmt == "annotated" and "norm_first" in given:
        raise ValueError("--norm-first: the Annotated Transformer is always pre-norm; do not pass it")
    if args.config:
        raise ValueError(f"--config: --from {fmt} builds the config from the state dict and the options")
    return given


# -- the command ----------------------------------------------------------------------------------
def run(args) -> int:
    recover(args.src)  # a save that a crash interrupted: finished (or refused, naming the data) first
    if not Path(args.src).exists():
        raise FileNotFoundError(f"{args.src!r}: no such file or directory")
    src_fmt = args.src_format or detect(args.src, "source")
    dst_fmt = args.dst_format or detect(args.dst, "destination")
    if Path(args.src).resolve() == Path(args.dst).resolve():
        raise ValueError(f"SRC and DST are the same path ({args.src!r}); write elsewhere")
    importer = _importer_options(args, src_fmt)
    saved_model.check_options(args, dst_fmt)
    config = None
    if args.config:
        with open(args.config, encoding="utf-8") as f:
            config = TransformerConfig.from_json(f.read())
    try:
        config, weights = read(src_fmt, args.src, config, importer)
        if dst_fmt in EXPORTS:
            return saved_model.run(args, src_fmt, config, weights)
        write(dst_fmt, args.dst, config, weights)
    except FileExistsError as err:
        raise ValueError(str(err)) from None
    except ImportError as err:
        raise ValueError(f"{src_fmt} -> {dst_fmt} needs a framework that is not installed ({err})") from None
    n_params = neutral.parameter_count(config)
    print(f"converted {args.src} ({src_fmt}) -> {args.dst} ({dst_fmt}): {n_params:,} parameters in "
          f"{len(weights)} tensors, {config.dtype}")
    print(f"config: {json.dumps(config.to_dict(), sort_keys=True)}")
    if not args.verify:
        return 0
    return 0 if verify(src_fmt, args.src, dst_fmt, args.dst, config, weights, args.seed) else 1


# -- --verify -------------------------------------------------------------------------------------
def _load(impl: str, path: str | None, config: TransformerConfig, weights: dict | None):
    """The `twins.backends` adapter of one implementation: loaded by that implementation from the
    file at ``path``, or holding ``weights`` when ``path`` is None."""
    from .backends import load_adapter, make_adapter
    if path is None:
        return make_adapter(impl, config, weights)
    return load_adapter(impl, path, config)  # config = the file's, or the given one for a file without


def _bound(config: TransformerConfig, a: str, b: str):
    from shared.tolerances import Bound, bound_for
    if a == b:
        return Bound(rtol=0.0, reason="one implementation, the same weights: identical logits")
    try:
        return bound_for(config.dtype, f"{a}:{b}")
    except KeyError:
        return bound_for(config.dtype, f"{b}:{a}")


def verify(src_fmt: str, src: str, dst_fmt: str, dst: str, config: TransformerConfig,
           weights: dict, seed: int = 0) -> bool:
    """Print the logits parity table of source and result; True when every row passes."""
    from shared.batches import src_tgt
    from shared.tolerances import max_abs_diff, max_rel_diff

    batch = src_tgt(config, batch=2, src_len=min(9, config.max_len), tgt_len=min(7, config.max_len),
                    seed=seed)
    runs = {}  # label -> adapter (twins.backends)
    if src_fmt in IMPORTERS:
        print(f"verify: the {src_fmt} state dict cannot be rebuilt into its source model here; "
              "comparing the imported weights in the reference and in both backends instead, "
              f"the {IMPL[dst_fmt]} one loaded from DST = {dst}")
        for impl in ("reference", "torch", "tf"):
            path = dst if impl == IMPL[dst_fmt] else None
            label = f"{impl}:{'DST' if path else 'imported'}"
            try:
                runs[label] = _load(impl, path, config, weights)
            except ImportError as err:
                if path is not None:
                    raise
                print(f"verify: skipped {impl}: {err}")
            if path is not None:
                result = label
        labels = list(runs)
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]
    else:
        print(f"verify: SRC = {src} in {IMPL[src_fmt]}, DST = {dst} in {IMPL[dst_fmt]}")
        a, b = f"{IMPL[src_fmt]}:SRC", f"{IMPL[dst_fmt]}:DST"
        runs[a] = _load(IMPL[src_fmt], src, config, None)
        runs[b] = _load(IMPL[dst_fmt], dst, config, None)
        pairs, result = [(a, b)], b

    ok = True
    result_weights = runs[result].export_weights()
    same = sorted(result_weights) == sorted(weights) and all(
        result_weights[k].dtype == weights[k].dtype and result_weights[k].tobytes() == weights[k].tobytes()
        for k in weights)
    ok &= same
    print(f"weights: {len(weights)} tensors in DST "
          f"{'bit-identical to the source' if same else 'DIFFER from the source'}")

    logits = {label: adapter.logits(*batch) for label, adapter in runs.items()}
    width = max(len("compared"), *(len(f"{a} vs {b}") for a, b in pairs))
    print(f"one batch: {batch[0].shape[0]} x {batch[0].shape[1]} source and {batch[1].shape[0]} x "
          f"{batch[1].shape[1]} target tokens (seed {seed}), {config.dtype}")
    print(f"{'name':<8} {'compared':<{width}}  {'max abs':>9}  {'max rel':>9}  {'bound':>7}  result")
    for a, b in pairs:
        bound = _bound(config, a.split(":")[0], b.split(":")[0])
        x, y = logits[a], logits[b]
        passed = bool(bound.allows(x, y)) and bool(np.isfinite(x).all() and np.isfinite(y).all())
        ok &= passed
        print(f"{'logits':<8} {a + ' vs ' + b:<{width}}  {max_abs_diff(x, y):>9.2e}  "
              f"{max_rel_diff(x, y):>9.2e}  {bound.rtol:>7.0e}  {'pass' if passed else 'FAIL'}")
    print("(max rel: the difference relative to the logits' scale, which shared/tolerances.py "
          "bounds; an implementation against itself must match exactly)")
    print("PASS" if ok else "FAIL")
    return ok
