"""TensorFlow SavedModels that decode (docs/formats/saved_model.md): `tf_impl.saved_model`, two
signatures (``serving_default`` greedy, ``beam_search``), served by any TensorFlow program without
this project. Write only; tf_impl builds the model, imported by name when one is written
(`shared.formats.native.backend`).
"""
from __future__ import annotations

from shared.checks import check_config
from shared.decoding import check_flags, check_search_args
from shared.paths import check_path

from .native import backend
from .record import Format, Option, boolean

# The decode limit when --max-new is not given: the signatures return this many columns and
# decode this many steps, so the model's max_len (up to thousands of positions) is no default.
DEFAULT_MAX_NEW = 256
DEFAULT_BEAM_SIZE = 4  # or tgt_vocab - 1 where that is smaller (pad is never generated)
BEAM_SIZE = Option("beam_size", f"beams of the beam_search signature (default {DEFAULT_BEAM_SIZE}, or "
                   "the model's tgt_vocab - 1 if smaller)", int)
LENGTH_PENALTY = Option("length_penalty", "GNMT alpha >= 0 of the beam_search signature (default 0: "
                        "none)", float)
MAX_NEW = Option("max_new", f"decode limit of both signatures: new tokens at most, EOS included "
                 f"(default: {DEFAULT_MAX_NEW} or the model's max_len if smaller)", int)
JIT_COMPILE = Option("jit_compile", "compile the decoding loop with XLA (default: tf_impl's, true)",
                     boolean, metavar="true|false")


# The model of the last export in this process, by path: ``--verify`` compares the SavedModel with
# the decoding of the very model that traced its programs (a second model holding the same weights
# traces its own, whose float rounding need not match bit for bit).
_EXPORTED: dict = {}


def exported_model(path):
    """The tf_impl model that wrote the SavedModel at ``path`` in this process, or None."""
    return _EXPORTED.get(str(path))


def settings(config, beam_size=None, length_penalty=None, max_new=None) -> dict:
    """The export's decoding settings, checked against the model; an error names the option. A
    default the model cannot take is the largest it can, as the conversion's output says: a beam
    has at most ``tgt_vocab - 1`` children, ``max_new`` at most ``max_len`` tokens."""
    chosen = {"max_len": min(DEFAULT_MAX_NEW, config.max_len) if max_new is None else max_new,
              "beam_size": min(DEFAULT_BEAM_SIZE, config.tgt_vocab - 1) if beam_size is None else beam_size,
              "length_penalty": 0.0 if length_penalty is None else length_penalty}
    try:
        check_search_args(config, **chosen, max_len_name="max_new")
    except (TypeError, ValueError) as err:  # "max_len: expected ..." -> "max_new: expected ..."
        name, _, rest = str(err).partition(":")
        raise type(err)(f"{'max_new' if name == 'max_len' else name}:{rest}") from None
    return chosen


def _write(config, weights, path, beam_size=None, length_penalty=None, max_new=None,
           jit_compile=None) -> str:
    # Every argument checked before anything is built or written: a refusal leaves ``path`` as it was.
    check_path(path)
    check_config(config)
    check_flags(jit_compile=jit_compile)  # True, False or None (tf_impl's default); never "false"
    jit_compile = None if jit_compile is None else bool(jit_compile)
    chosen = settings(config, beam_size, length_penalty, max_new)
    tf_impl = backend("tf_impl")
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    backend("tf_impl.saved_model").export_saved_model(model, path, jit_compile=jit_compile, **chosen)
    _EXPORTED.clear()
    _EXPORTED[str(path)] = model
    xla = {None: "on (tf_impl's default)", True: "on", False: "off"}[jit_compile]
    limit = "" if max_new is not None else f" (--max-new; the model's max_len is {config.max_len})"
    return (f"signatures serving_default (greedy) and beam_search (beam size {chosen['beam_size']}, "
            f"length penalty {chosen['length_penalty']}), up to {chosen['max_len']} new tokens"
            f"{limit}, XLA: {xla}")


SAVED_MODEL = Format(
    "saved-model", "saved_model", "a TensorFlow SavedModel directory that decodes (greedy and beam "
    "search signatures)", write=_write,
    write_options=(BEAM_SIZE, LENGTH_PENALTY, MAX_NEW, JIT_COMPILE), runs_in="saved-model")

FORMATS = (SAVED_MODEL,)
