"""`twins convert CKPT DIR --to saved-model`: a TensorFlow SavedModel that decodes
(`tf_impl.saved_model`), from any checkpoint `twins convert` reads.

The weights go into a tf_impl model (through `twins.backends`), which `export_saved_model` writes
crash-safely to DIR with two signatures: ``serving_default`` (greedy) and ``beam_search`` (beam size
and length penalty fixed here, by ``--beam-size`` and ``--length-penalty``); ``--max-new`` is the
decode limit of both. ``--verify`` loads DIR with ``tf.saved_model.load``, decodes one batch (with
one row holding an id out of range) through both signatures and through tf_impl's `greedy_decode`
/ `beam_search` on the source weights, and prints whether tokens, lengths and scores are identical
and the bad row comes back as the sentinel; exit status 1 when not.
"""
from __future__ import annotations

import json

from shared import TransformerConfig

FORMAT = "saved-model"
_OPTIONS = ("beam_size", "length_penalty", "max_new", "jit_compile")


def add_arguments(parser, parse_bool) -> None:
    group = parser.add_argument_group("SavedModel export (--to saved-model)")
    group.add_argument("--beam-size", type=int, help="beams of the beam_search signature (default 4)")
    group.add_argument("--length-penalty", type=float,
                       help="GNMT alpha >= 0 of the beam_search signature (default 0: none)")
    group.add_argument("--max-new", type=int,
                       help="decode limit of both signatures: new tokens at most, EOS included "
                            "(default: the model's max_len; --max-len is an imported model's own "
                            "length)")
    group.add_argument("--jit-compile", type=parse_bool, metavar="true|false",
                       help="compile the decoding loop with XLA (default: tf_impl's, true)")


def check_options(args, dst_fmt: str) -> None:
    """The export's options only with ``--to saved-model`` (before anything is read)."""
    given = [k for k in _OPTIONS if getattr(args, k, None) is not None]
    if given and dst_fmt != FORMAT:
        flags = ", ".join("--" + k.replace("_", "-") for k in given)
        raise ValueError(f"{flags}: only for --to {FORMAT} (the destination is {dst_fmt})")


def _settings(args, config: TransformerConfig) -> dict:
    """The options checked against the model, each error naming its flag."""
    from shared.decoding import check_search_args
    settings = {"max_len": config.max_len if args.max_new is None else args.max_new,
                "beam_size": 4 if args.beam_size is None else args.beam_size,
                "length_penalty": 0.0 if args.length_penalty is None else args.length_penalty}
    flags = {"max_len": "--max-new", "beam_size": "--beam-size", "length_penalty": "--length-penalty"}
    try:
        check_search_args(config, **settings)
    except ValueError as err:  # "max_len: expected ..." -> "--max-new: expected ..."
        name, _, rest = str(err).partition(":")
        raise ValueError(f"{flags.get(name, name)}:{rest}") from None
    return settings


def run(args, src_fmt: str, config: TransformerConfig, weights: dict) -> int:
    """Export (and with ``--verify`` check) the SavedModel; the exit status."""
    from tf_impl.saved_model import export_saved_model
    from .backends import make_adapter
    settings = _settings(args, config)
    model = make_adapter("tf", config, weights).model  # `Unavailable` without TensorFlow
    export_saved_model(model, args.dst, jit_compile=args.jit_compile, **settings)
    xla = {None: "on (tf_impl's default)", True: "on", False: "off"}[args.jit_compile]
    print(f"exported {args.src} ({src_fmt}) -> {args.dst} ({FORMAT}): signatures serving_default "
          f"(greedy) and beam_search (beam size {settings['beam_size']}, length penalty "
          f"{settings['length_penalty']}), up to {settings['max_len']} new tokens, XLA: {xla}")
    print(f"config: {json.dumps(config.to_dict(), sort_keys=True)}")
    return verify(model, args.dst, args.seed) if args.verify else 0


def verify(model, path: str, seed: int = 0) -> int:
    """Decode one batch with the SavedModel and with tf_impl; print the table; the exit status."""
    from shared.batches import token_batch
    from tf_impl.saved_model import compare_export
    config = model.config
    src = token_batch(config, config.src_vocab, batch=4, length=min(9, config.max_len), seed=seed)
    src[-1, 0] = config.src_vocab  # the last row: an id out of range, to be returned as the sentinel
    print(f"verify: DST = {path} loaded with tf.saved_model.load, against tf_impl decoding the "
          f"source weights; one batch of {src.shape[0]} x {src.shape[1]} source tokens (seed "
          f"{seed}), the last row with an id out of range")
    report = compare_export(model, path, src)
    print(f"{'signature':<16} {'tokens':<10} {'lengths':<10} {'scores':<10} {'bad row':<10} result")
    ok = True
    for name, checks in report.items():
        same = [checks[k] for k in checks if k != "invalid"]
        passed = all(checks.values())
        ok &= passed
        cells = ["identical" if s else "DIFFER" for s in same]
        print(f"{name:<16} {cells[0]:<10} {cells[1]:<10} {cells[2]:<10} "
              f"{'flagged' if checks['invalid'] else 'NOT FLAGGED':<10} {'pass' if passed else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
