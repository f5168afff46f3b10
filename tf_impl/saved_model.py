"""Export a `tf_impl.Transformer` as a TensorFlow SavedModel that decodes, for TF Serving or any
TensorFlow program: ``tf.saved_model.load(path)`` needs neither this project nor torch.

Two signatures, both taking ``src``, int64 source ids ``(batch, src_len)`` (any batch size, any
length up to ``config.max_len``, padded with ``config.pad_id``; the source mask is ``src != pad_id``,
all True for a model made with ``mask_padding=False``, `shared.masks.padding_id`). int64, the
project's id dtype: TensorFlow converts a NumPy array or a list to the signature's dtype before
the signature sees it, and an int32 input wrapped an id of 2**32 + 5 to 5, a plausible token. It
truncates floats the same way (5.7 to 5): send integer ids; an int32 tensor is refused by
TensorFlow (``tf.cast(src, tf.int64)`` first).

=================== ============================================================================
``serving_default`` greedy decoding: ``tf_impl.greedy_decode(model, src, max_len)``
``beam_search``     ``tf_impl.beam_search(model, src, max_len, beam_size, length_penalty)``, beam
                    size and length penalty fixed at export
=================== ============================================================================

Outputs (``T`` = the export's ``max_len``, new tokens at most, EOS included):

* ``tokens`` int32 ``(batch, T)``: the decoded ids without the start token; a row that emitted EOS
  within ``T`` tokens holds pad after it (always ``T`` columns);
* ``lengths`` int32 ``(batch,)``: tokens generated, EOS included (``T`` when no EOS came);
* ``log_probs`` ``(batch, T)`` (greedy: each token's log-probability, 0 after EOS) or ``scores``
  ``(batch,)`` (beam search: the ranking score of the returned hypothesis), in the model's dtype.

They are the results of tf_impl's own decoding: each signature calls the compiled program of
`tf_impl.greedy_decode` / `tf_impl.beam_search` (`tf_impl.decoding.greedy_decode_tensors`,
`beam_search_tensors`: the same ``tf.function``, with tf_impl's default ``jit_compile``), so a
change to tf_impl's search flows into the next export, and the loaded SavedModel returns the same
tokens, lengths and scores as tf_impl on the same source, bit for bit
(parity_tests/test_saved_model.py checks it in a process where neither this project nor torch can
be imported).

**XLA.** By default the decoding loop is compiled with XLA (``jit_compile=True``, tf_impl's
measured default for cached decoding), so it is compiled again for each new ``(batch, src_len)``
shape the served model meets (measured on 2 busy cores: 2 s for ``tiny``, 14 s for ``base``, about
as long as tf_impl's first call; benchmarks/saved_model.py): pad requests to a few fixed
shapes. ``jit_compile=False`` exports the plain graph loop instead (reproducing
``greedy_decode(..., jit_compile=False)``).

**Bad input.** Under XLA an assertion compiles to nothing and an id out of range embeds as NaN
(`tf_impl.inputs`), so nothing inside the loop can raise, and a NaN row would stop the loop for
the whole batch. The signatures therefore check ``src`` before decoding, with plain graph ops
outside the XLA program, and never return plausible tokens for bad input. A row is *invalid* when

* it holds an id outside ``[0, src_vocab)`` (that row only), or
* ``src_len`` is 0 or greater than ``config.max_len`` (every row);

an invalid row is decoded as an all-padding source (so that it cannot disturb the others: they
come out exactly as tf_impl decodes that batch with the bad row padded) and returned as the
sentinel: ``lengths == -1`` (`INVALID`), ``tokens`` all ``-1``, ``log_probs`` / ``scores`` NaN.
If the model itself produces NaN or +inf logits for a valid source (weights that overflow), where
`tf_impl.greedy_decode` raises, every row of that batch is returned as the sentinel. A batch of 0
rows returns empty outputs. A client checks ``lengths >= 0`` per row.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import tensorflow as tf

from shared.decoding import check_flags, check_search_args
from shared.messages import type_shown
from shared.paths import check_path
from shared.saving import check_replaceable, replace_directory
from shared.weights import check_weights

from .checkpoints import load_checkpoint
from .decoding import beam_search, beam_search_tensors, greedy_decode, greedy_decode_tensors
from .model import Transformer, check_model

INVALID = -1  # lengths and tokens of a row whose source was refused
SIGNATURES = ("serving_default", "beam_search")
# What tf.saved_model.save writes for an export (``assets/`` empty: an export has no assets); an
# existing directory holding anything else is not replaced, nor one holding only these names
# without a saved_model.pb TensorFlow wrote (`is_saved_model`). Not ``assets.extra/``, which
# TensorFlow never writes: by its convention a user's (TF Serving's warm-up requests).
SAVED_MODEL_ENTRIES = {"saved_model.pb", "variables", "assets", "fingerprint.pb"}
SAVED_MODEL_PB = "saved_model.pb"


def read_saved_model_pb(file: Path):
    """The ``SavedModel`` protocol buffer in ``file``; ``ValueError`` when it is not one."""
    from google.protobuf.message import DecodeError
    from tensorflow.core.protobuf import saved_model_pb2

    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(Path(file).read_bytes())
    except DecodeError as err:
        raise ValueError(f"{str(file)!r}: not a SavedModel protocol buffer ({err})") from None
    return proto


def is_saved_model(proto) -> bool:
    """Whether ``proto`` (`read_saved_model_pb`) is what TensorFlow writes: schema version 1 and at
    least one meta graph, each with its tags (``serve`` for ``tf.saved_model.save``). Protocol
    buffers are lenient (an empty file parses, as an empty message), so parsing alone proves
    nothing; a folder of a user's ``assets/`` or ``variables/`` has no such file at all."""
    return (proto.saved_model_schema_version == 1 and len(proto.meta_graphs) > 0
            and all(len(m.meta_info_def.tags) > 0 for m in proto.meta_graphs))


def check_replaceable_export(path: str | os.PathLike) -> None:
    """``path`` may receive an export: absent, an empty directory, or a SavedModel TensorFlow
    wrote (its ``saved_model.pb`` beside only `SAVED_MODEL_ENTRIES`, ``assets/`` empty); else
    ``FileExistsError`` naming it, nothing changed (`shared.saving.check_replaceable`). A
    SavedModel with assets (a vocabulary) is not an export of this project, and replacing it would
    delete them."""
    check_replaceable(path, SAVED_MODEL_ENTRIES, "a SavedModel directory", is_saved_model,
                      marker=SAVED_MODEL_PB, read=read_saved_model_pb)
    assets = Path(path) / "assets"
    if assets.is_dir() and not assets.is_symlink() and any(assets.iterdir()):
        raise FileExistsError(f"{str(path)!r} is a SavedModel with files in assets/, which an export "
                              "does not write; refusing to overwrite it (expected a new path, an "
                              "empty directory or a SavedModel without assets)")


def checked_source(src: tf.Tensor, config) -> tuple[tf.Tensor, tf.Tensor]:
    """The source a signature decodes, and which rows are valid (module docstring, "Bad input").

    Shape: src ``(B, S)`` int64 -> ids ``(B, S')`` int64 with ``S' = min(max(S, 1), max_len)``
    (``S`` itself for a valid length), invalid rows all ``pad_id``; valid ``(B,)`` bool.
    """
    pad = tf.constant(config.pad_id, src.dtype)
    width = tf.shape(src)[1]
    in_range = tf.reduce_all(tf.logical_and(src >= 0, src < config.src_vocab), axis=1)  # (B,)
    valid = tf.logical_and(in_range, tf.logical_and(width >= 1, width <= config.max_len))
    ids = tf.where(valid[:, None], src, pad)[:, : config.max_len]  # (B, <= max_len)
    ids = tf.pad(ids, [[0, 0], [0, tf.maximum(1 - width, 0)]], constant_values=config.pad_id)
    return ids, valid


def _flagged(outputs: dict, valid: tf.Tensor, score: str) -> dict[str, tf.Tensor]:
    """The signature's outputs: invalid rows, or every row after a NaN step, as the sentinel."""
    ok = tf.logical_and(valid, outputs["bad_step"] < 0)  # (B,)
    values = outputs[score]
    mask = ok[:, None] if values.shape.rank == 2 else ok
    return {"tokens": tf.where(ok[:, None], tf.cast(outputs["tokens"], tf.int32), INVALID),
            "lengths": tf.where(ok, tf.cast(outputs["lengths"], tf.int32), INVALID),
            score: tf.where(mask, values, tf.constant(np.nan, values.dtype))}


def signatures(model: Transformer, max_len: int, beam_size: int, length_penalty: float,
               jit_compile: bool | None = None) -> dict[str, tf.types.experimental.ConcreteFunction]:
    """The two signature functions (module docstring), traced for ``src`` of shape ``(None, None)``."""
    check_model(model)
    config = model.config
    spec = tf.TensorSpec((None, None), tf.int64, name="src")

    @tf.function(input_signature=[spec], autograph=False)
    def greedy(src):
        ids, valid = checked_source(src, config)
        return _flagged(greedy_decode_tensors(model, ids, max_len, jit_compile=jit_compile), valid,
                        "log_probs")

    @tf.function(input_signature=[spec], autograph=False)
    def beam(src):
        ids, valid = checked_source(src, config)
        out = beam_search_tensors(model, ids, max_len, beam_size, length_penalty,
                                  jit_compile=jit_compile)
        return _flagged(out, valid, "scores")

    return {"serving_default": greedy.get_concrete_function(),
            "beam_search": beam.get_concrete_function()}


def export_saved_model(model: Transformer | str | os.PathLike, path: str | os.PathLike, *,
                       max_len: int | None = None, beam_size: int = 4, length_penalty: float = 0.0,
                       jit_compile: bool | None = None) -> Path:
    """Write a SavedModel directory at ``path`` (replaced crash-safely if it exists: the complete
    old directory or the complete new one, `shared.saving.replace_directory`).

    Args:
        model: a `tf_impl.Transformer`, or a checkpoint tf_impl reads (a neutral directory, a
            ``.weights.h5``).
        max_len: new tokens at most, EOS included, ``1 <= max_len <= config.max_len``; default
            ``config.max_len``. Both signatures return this many columns.
        beam_size: beams of the ``beam_search`` signature, ``1 <= beam_size <= tgt_vocab - 1``.
        length_penalty: its GNMT alpha >= 0 (`tf_impl.beam_search`).
        jit_compile: XLA for the decoding loop; ``None`` = tf_impl's default (module docstring).

    Returns the path. Raises ``TypeError`` / ``ValueError`` for an argument of the wrong type or
    out of range (``jit_compile`` is True, False or None, never read for its truth: "false" is
    refused), `shared.weights.WeightsError` for NaN or Inf weights (as `save_checkpoint`), and
    ``FileExistsError`` for a ``path`` that exists and is not an export's (`check_replaceable_export`:
    a folder holding only ``assets/`` is a user's, as is a SavedModel with assets), before writing
    anything.
    """
    if not isinstance(model, (Transformer, str, os.PathLike)):
        raise TypeError(f"model: expected a tf_impl.Transformer or a checkpoint path, got "
                        f"{type_shown(model)}")
    check_path(path)
    check_flags(jit_compile=jit_compile)  # True, False or None (tf_impl's default), as the decoders
    jit_compile = None if jit_compile is None else bool(jit_compile)
    if not isinstance(model, Transformer):
        check_path(model, "model")  # named: load_checkpoint's own check says "path"
        model = load_checkpoint(model)
    max_len = model.config.max_len if max_len is None else max_len
    check_search_args(model.config, max_len, beam_size, length_penalty)
    # as save_checkpoint's: NaN or Inf weights (a diverged run) would answer every request with
    # the sentinel
    check_weights(model.config, model.export_weights(), source="export_saved_model: weights")
    # Python numbers from here, as the decoders take them: a NumPy int64 traced into the program
    # meets int32 tensors, and JSON (decoding_json) stores no NumPy scalar.
    max_len, beam_size, length_penalty = int(max_len), int(beam_size), float(length_penalty)
    path = Path(path)
    check_replaceable_export(path)
    functions = signatures(model, max_len, beam_size, length_penalty, jit_compile)
    root = tf.Module()
    # The weights the functions read, tracked so that the SavedModel stores them (the Keras
    # objects themselves are not saved: the signatures are the whole served API).
    root.weights = [getattr(v, "value", v) for v in model.variables]
    # What the export was made of, readable in the serving process: loaded.config_json.numpy().
    root.config_json = tf.Variable(model.config.to_json(), trainable=False, name="config_json")
    root.decoding_json = tf.Variable(json.dumps({
        "max_len": max_len, "beam_size": beam_size, "length_penalty": length_penalty,
        "jit_compile": jit_compile, "invalid": INVALID}), trainable=False, name="decoding_json")

    def fill(folder: Path) -> None:
        tf.saved_model.save(root, str(folder), signatures=functions)

    return replace_directory(path, fill)


def compare_export(model: Transformer, path: str | os.PathLike, src) -> dict[str, dict[str, bool]]:
    """Load the SavedModel at ``path`` (``tf.saved_model.load``), call both signatures on ``src``
    and compare them with tf_impl's own decoding by ``model``, with the settings stored in the
    export (``decoding_json``), of the same source as the signatures decode it (invalid rows as
    padding). The check of ``twins convert --to saved-model --verify``.

    Shape: src ``(B, S)`` integer ids, ``1 <= S <= config.max_len``; rows with an id out of range
    are allowed and must come back as the sentinel.

    Returns ``{signature: {"tokens": equal, "lengths": equal, score name: equal bit for bit,
    "invalid": the invalid rows, and only they, carry the sentinel}}``.
    """
    check_model(model)
    loaded = tf.saved_model.load(str(path))
    settings = json.loads(loaded.decoding_json.numpy())
    src = np.asarray(src)
    ids, valid = (t.numpy() for t in checked_source(tf.constant(src, tf.int64), model.config))
    kwargs = {"max_len": settings["max_len"], "jit_compile": settings["jit_compile"]}
    expected = {"serving_default": greedy_decode(model, ids, **kwargs),
                "beam_search": beam_search(model, ids, beam_size=settings["beam_size"],
                                           length_penalty=settings["length_penalty"], **kwargs)}
    report = {}
    for name, want in expected.items():
        got = {k: v.numpy() for k, v in loaded.signatures[name](src=tf.constant(src, tf.int64)).items()}
        score = "log_probs" if name == "serving_default" else "scores"
        report[name] = {
            "tokens": bool(np.array_equal(got["tokens"][valid], want.tokens[valid])),
            "lengths": bool(np.array_equal(got["lengths"][valid], want.lengths[valid])),
            score: bool(np.array_equal(got[score][valid], getattr(want, score)[valid])),
            "invalid": bool((got["lengths"] == INVALID).tolist() == (~valid).tolist()
                            and (got["tokens"][~valid] == INVALID).all()),
        }
    return report
