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
``ctranslate2``    a directory (destination only,       `shared.exporters.to_ctranslate2`
                   ``--to ctranslate2``)
``tf-tutorial``    ``*.weights.h5`` (source only)       `shared.importers.from_tf_tutorial`
``keras-hub``      ``*.weights.h5``, ``*.keras``        `shared.importers.from_keras_hub`
``marian``         a ``MarianMTModel`` directory        `shared.importers.from_marian`,
                   (``--from`` / ``--to`` only)          `shared.exporters.to_marian`
``fsmt``           an FSMT directory (source only)      `shared.importers.from_fsmt`
``saved-model``    a directory (destination only)       `tf_impl.saved_model` (twins.saved_model)
=================  ===================================  ====================================

``--rename OLD=NEW`` (repeatable) maps source key prefixes before an importer reads them; an
importer whose keys are missing names the unexpected keys that look like them and the renames
that would map them.

Every source is read into ``(config, canonical weights)`` and fully checked before anything is
written; the result is written atomically. ``--verify`` then loads the result in the target's
implementation (torch_impl, tf_impl, or the NumPy reference for a neutral directory) and the source
in its own, runs one batch through both, and prints a parity table for the logits against the
bounds of `shared.tolerances` (exit status 1 when it fails). An nn.Transformer or Annotated
state dict cannot be rebuilt into its model without that model's code, so for those sources the
imported weights are run in the reference and in both backends instead (the target's backend from
the converted file), and the output says so. A Marian or FSMT directory (source or destination)
is run by transformers itself (`twins.transformers_run`) when it is installed.

Each framework is imported only when a format needs it. For ``--to ctranslate2``, ``--verify``
compares CTranslate2's ``score_batch`` log-probs of one batch with the source's, computed by the
source's implementation, against the ``ctranslate2:*`` bounds.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shared import TransformerConfig
from shared import checkpoints
from shared import weights as neutral
from shared.importers.notes import collected
from shared.importers.tf_tutorial import KERAS3_PADDING
from shared.saving import recover

from . import saved_model

FORMATS = ("neutral", "torch", "tf")
STATE_DICTS = ("nn-transformer", "annotated")  # a .pt state dict and options saying the rest
DIRECTORIES = ("marian", "fsmt")  # a transformers save_pretrained directory holding its config
KERAS_IMPORTERS = ("tf-tutorial", "keras-hub")  # Keras files read with h5py: --from only
IMPORTERS = STATE_DICTS + DIRECTORIES
EXPORTERS = ("marian", "ctranslate2", saved_model.FORMAT)  # --to only (marian: also --from)
IMPL = {"neutral": "reference", "torch": "torch", "tf": "tf",
        "marian": "transformers", "fsmt": "transformers"}  # who runs each format in --verify
# Sources whose masked scores are a large negative number: an all-padding source row attends
# uniformly there and has zero attention in this project (docs/design.md, convention 3).
UNIFORM_EMPTY_ROW = {"annotated": "the Annotated Transformer", "fsmt": "fsmt",
                     "marian": "marian (in transformers' eager attention; its default sdpa agrees)"}
_IMPORTER_ARGS = ("n_heads", "norm_first", "pad_id", "bos_id", "eos_id", "norm_eps", "max_len", "dtype")
_KERAS_ARGS = ("mask_zero", "normalize_first", "activation")


def add_arguments(parser) -> None:
    parser.add_argument("src", metavar="SRC", help="source: a neutral checkpoint directory, a "
                        "torch_impl .pt, a tf_impl .weights.h5, or (with --from) a state dict .pt")
    parser.add_argument("dst", metavar="DST", help="destination: a directory (neutral; with --to, a "
                        "Marian, CTranslate2 or SavedModel directory), a .pt (torch_impl) or a .weights.h5 "
                        "(tf_impl); replaced atomically if it exists")
    parser.add_argument("--from", dest="src_format", choices=FORMATS + IMPORTERS + KERAS_IMPORTERS,
                        help="source format (default: from the path; marian / fsmt: a transformers "
                             "save_pretrained directory)")
    parser.add_argument("--to", dest="dst_format", choices=FORMATS + EXPORTERS,
                        help="destination format (default: from the path; marian: a directory "
                             "transformers.MarianMTModel.from_pretrained loads; ctranslate2: a "
                             "CTranslate2 model directory; saved-model: a TensorFlow SavedModel that "
                             "decodes; these three are never detected from the path)")
    parser.add_argument("--config", metavar="FILE.json",
                        help="the config, for a .pt holding a bare torch_impl state dict or a "
                             ".weights.h5 written by plain Keras save_weights (files written by "
                             "this project hold theirs)")
    parser.add_argument("--verify", action="store_true",
                        help="run one batch through source and result, print the logits parity "
                             "table (for a saved-model: its decoded tokens against tf_impl's); "
                             "exit 1 when it fails")
    parser.add_argument("--seed", type=int, default=0, help="seed of the --verify batch")
    parser.add_argument("--rename", action="append", metavar="OLD=NEW", type=_rename,
                        help="importers: replace the source key prefix OLD by NEW before reading "
                             "(repeatable; e.g. src_tok_emb.=src_tok_emb.embedding.)")
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
    imp.add_argument("--dtype", choices=["float32", "float64"],
                     help="cast (default: the source's); also for --from marian / fsmt")
    _add_keras_arguments(parser)
    saved_model.add_arguments(parser, _bool)


def _add_keras_arguments(parser) -> None:
    keras = parser.add_argument_group(
        "Keras importers (--from tf-tutorial / keras-hub; --bos-id, --eos-id, --dtype as above; "
        "--norm-eps default: tutorial 1e-3, keras-hub 1e-5 or the .keras config's; --max-len: "
        "tutorial only, default 2048)")
    keras.add_argument("--mask-zero", type=_bool, metavar="true|false",
                       help="keras-hub, required for a .weights.h5: the TokenAndPositionEmbedding "
                            "layers' mask_zero (a .keras file stores it)")
    keras.add_argument("--normalize-first", type=_bool, metavar="true|false",
                       help="keras-hub: the layers' normalize_first (default: the .keras config's, "
                            "else false)")
    keras.add_argument("--activation", choices=["relu", "gelu", "swish", "silu"],
                       help="keras-hub: the layers' activation (default: the .keras config's, else relu)")


def _rename(text: str) -> tuple[str, str]:
    """``--rename OLD=NEW``: one key-prefix mapping (OLD may be empty, to add a prefix)."""
    import argparse
    old, sep, new = str(text).partition("=")
    if not sep or old == new:
        raise argparse.ArgumentTypeError(f"expected OLD=NEW with OLD != NEW, got {text!r}")
    return old, new


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
    if fmt in KERAS_IMPORTERS:
        return _read_keras(fmt, path, importer or {})
    from shared import importers
    importer = {k: v for k, v in (importer or {}).items() if v is not None}
    if fmt in DIRECTORIES:  # NumPy + safetensors: no framework needed
        fn = importers.from_marian if fmt == "marian" else importers.from_fsmt
        return fn(path, **importer)
    from torch_impl import checkpoints as torch_checkpoints
    state_dict = torch_checkpoints.read_foreign_state_dict(path)
    fn = importers.from_nn_transformer if fmt == "nn-transformer" else importers.from_annotated
    try:
        return fn(state_dict, **importer)
    except importers.ImporterError as err:  # name the file, not only the importer
        raise importers.ImporterError(f"{path!r} ({fn.__name__})", err.problems) from None


def _read_keras(fmt: str, path: str, options: dict) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """A Keras file (h5py; no code from it runs) through the tutorial or KerasHub importer."""
    from shared import importers
    options = {k: v for k, v in options.items() if v is not None}
    if fmt == "tf-tutorial":
        if path.endswith(".keras"):
            raise ValueError(f"{path!r}: --from tf-tutorial reads the .weights.h5 of save_weights "
                             "(a subclassed tutorial model's .keras holds no architecture to read)")
        fn = importers.from_tf_tutorial
    else:
        fn = importers.from_keras_hub
    file = importers.read_keras_file(path)
    if file.config is not None:
        options["keras_config"] = file.config
    try:
        return fn(file.weights, **options)
    except importers.ImporterError as err:  # name the file, not only the importer
        raise importers.ImporterError(f"{path!r} ({fn.__name__})", err.problems) from None


def write(fmt: str, path: str, config: TransformerConfig, weights: dict) -> None:
    """Write ``weights`` to ``path`` in format ``fmt``, atomically."""
    if fmt == "ctranslate2":
        from shared.exporters import to_ctranslate2
        to_ctranslate2(config, weights, path)
        return
    if fmt == "marian":
        from shared.exporters import to_marian
        to_marian(path, config, weights)
        return
    FORMAT_OF[fmt].write(path, config, weights)


def _keras_options(args, fmt: str) -> dict:
    """The options of ``--from tf-tutorial`` / ``keras-hub``, each checked against the importer."""
    names = {"tf-tutorial": ("bos_id", "eos_id", "norm_eps", "max_len", "dtype"),
             "keras-hub": ("bos_id", "eos_id", "pad_id", "norm_eps", "dtype", "mask_zero",
                           "normalize_first", "activation")}[fmt]
    given = {k: getattr(args, k) for k in _IMPORTER_ARGS + _KERAS_ARGS if getattr(args, k) is not None}
    if fmt == "keras-hub" and "norm_first" in given:
        raise ValueError("--norm-first: for --from keras-hub the flag is --normalize-first")
    wrong = [k for k in given if k not in names]
    if wrong:
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in wrong)}: not an option of "
                         f"--from {fmt} (it takes {', '.join('--' + k.replace('_', '-') for k in names)})")
    lacking = [f"--{k.replace('_', '-')}" for k in ("bos_id", "eos_id") if k not in given]
    if lacking:
        raise ValueError(f"--from {fmt}: {', '.join(lacking)} required (not stored in a Keras file)")
    if args.config:
        raise ValueError(f"--config: --from {fmt} builds the config from the file and the options")
    return given


def _transformers_family(path: str) -> str | None:
    """``marian`` / ``fsmt`` when ``path`` is such a save_pretrained directory, else None."""
    try:
        found = json.loads((Path(path) / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    return found if found in DIRECTORIES else None


def _importer_options(args, fmt: str) -> dict | None:
    if fmt in KERAS_IMPORTERS:
        return _keras_options(args, fmt)
    given = {k: getattr(args, k) for k in _IMPORTER_ARGS if getattr(args, k) is not None}
    keras_only = [k for k in _KERAS_ARGS if getattr(args, k, None) is not None]
    if keras_only:
        raise ValueError(f"{', '.join('--' + k.replace('_', '-') for k in keras_only)}: only for "
                         "--from keras-hub")
    rename = list(getattr(args, "rename", None) or [])
    if fmt not in IMPORTERS:
        if given or rename:
            flags = ", ".join("--" + k.replace("_", "-") for k in list(given) + ["rename"] * bool(rename))
            raise ValueError(f"{flags}: only for --from {' / '.join(IMPORTERS)} (this source "
                             f"is {fmt}, which holds its config)")
        return None
    if fmt in DIRECTORIES:
        extra = [k for k in given if k != "dtype"]
        if extra:
            flags = ", ".join("--" + k.replace("_", "-") for k in extra)
            raise ValueError(f"{flags}: --from {fmt} reads these from the directory's config.json")
        if args.config:
            raise ValueError(f"--config: --from {fmt} reads the config from the directory's config.json")
        return {**given, "rename": rename or None}
    given["rename"] = rename or None
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
    if args.src_format is None and (family := _transformers_family(args.src)):
        raise ValueError(f"{args.src!r}: a transformers {family} directory, not a neutral "
                         f"checkpoint; pass --from {family}")
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
        with collected() as notes:  # a source's notes (half precision widened), printed first
            config, weights = read(src_fmt, args.src, config, importer)
        for text in notes:
            print(f"note: {text}")
        if dst_fmt == saved_model.FORMAT:
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
    if src_fmt in UNIFORM_EMPTY_ROW:
        print(f"note: {UNIFORM_EMPTY_ROW[src_fmt]} masks with a large negative score, so a source "
              "row that is all padding attends uniformly to its padding there; here it has zero "
              "attention (docs/design.md, convention 3), which no boolean mask reproduces. Every "
              "other row computes the same (see the importer's docstring)")
    if src_fmt == "fsmt":
        print("note: fsmt numbers positions by counting non-pad tokens; the result computes the "
              "same on right-padded rows (outputs at padded target positions aside), not after a "
              "left or inner pad")
    if src_fmt == "tf-tutorial":
        print(f"note: {KERAS3_PADDING}")
    if not args.verify:
        return 0
    if dst_fmt == "ctranslate2":
        return 0 if verify_ctranslate2(src_fmt, args.src, args.dst, config, weights, args.seed) else 1
    return 0 if verify(src_fmt, args.src, dst_fmt, args.dst, config, weights, args.seed) else 1


# -- --verify -------------------------------------------------------------------------------------
def _load(impl: str, path: str | None, config: TransformerConfig, weights: dict | None):
    """The `twins.backends` adapter of one implementation: loaded by that implementation from the
    file at ``path``, or holding ``weights`` when ``path`` is None."""
    from .backends import load_adapter, make_adapter
    if impl == "transformers":
        from .transformers_run import TransformersRun
        return TransformersRun(path, config)
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

    tgt_len = min(7, config.max_len)
    # fsmt numbers positions skipping padding: padded target positions differ by design, so its
    # target rows are full (the source keeps its padding, which both mask)
    full = [tgt_len] * 2 if "fsmt" in (src_fmt, dst_fmt) else None
    batch = src_tgt(config, batch=2, src_len=min(9, config.max_len), tgt_len=tgt_len, seed=seed,
                    tgt_lengths=full)
    runs = {}  # label -> adapter (twins.backends, or transformers_run)
    if src_fmt in STATE_DICTS + KERAS_IMPORTERS:
        what = "state dict" if src_fmt in STATE_DICTS else "file"
        print(f"verify: the {src_fmt} {what} cannot be rebuilt into its source model here; "
              "comparing the imported weights in the reference and in both backends instead, "
              f"the {IMPL[dst_fmt]} one loaded from DST = {dst}")
        impls = ("reference", "torch", "tf")
        for impl in impls + ((IMPL[dst_fmt],) if IMPL[dst_fmt] not in impls else ()):
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


def verify_ctranslate2(src_fmt: str, src: str, dst: str, config: TransformerConfig, weights: dict,
                       seed: int = 0) -> bool:
    """CTranslate2's per-token log-probs (``score_batch``) of one batch against the source's, run
    in the source's implementation (the reference for an importer's state dict); True on pass."""
    import ctranslate2

    from shared.batches import src_tgt
    from shared.exporters import ctranslate2 as ct2
    from shared.tolerances import bound_for, max_abs_diff, max_rel_diff

    if src_fmt in STATE_DICTS + KERAS_IMPORTERS:  # no source model here: its imported weights, in the reference
        impl, source = "reference", _load("reference", None, config, weights)
    else:
        impl = IMPL[src_fmt]
        source = _load(impl, src, config, None)
    src_ids, tgt_in = src_tgt(config, batch=2, src_len=min(9, config.max_len),
                              tgt_len=min(7, config.max_len - 1), seed=seed)
    tgt = tgt_in[:, 1:]  # score_batch prepends the start token itself
    translator = ctranslate2.Translator(str(dst), device="cpu", compute_type="float32")
    got = ct2.score(translator, config, src_ids, tgt)
    want = ct2.project_scores(source.logits, config, src_ids, tgt)
    bound = bound_for("float32", f"ctranslate2:{impl}")
    ok = bool(bound.allows(got, want)) and bool(np.isfinite(got).all())
    label = f"ctranslate2:DST vs {impl}:SRC"
    print(f"verify: DST = {dst} in CTranslate2 {ctranslate2.__version__} (float32), SRC = {src} in {impl}")
    print(f"one batch: 2 x {src_ids.shape[1]} source and 2 x {tgt.shape[1]} target tokens + EOS "
          f"(seed {seed}), per-token log-probs of score_batch")
    print(f"{'name':<9} {'compared':<{len(label)}}  {'max abs':>9}  {'max rel':>9}  {'bound':>7}  result")
    print(f"{'log-probs':<9} {label}  {max_abs_diff(got, want):>9.2e}  {max_rel_diff(got, want):>9.2e}  "
          f"{bound.rtol:>7.0e}  {'pass' if ok else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return ok
