"""Input checks and default masks for the TensorFlow backend.

Every check goes through `shared.checks` with the tensor's static metadata (rank, dtype, the shape
where it is known), so a bad input fails here with the same type and message as in the NumPy
reference and the torch backend.

Token id *values* are checked before any lookup, because TensorFlow does not fail on an id outside
the table everywhere: ``tf.gather`` raises on CPU, returns zeros on GPU and clamps under XLA, so an
unchecked bad id can silently become a wrong answer. How the check runs depends on where the call is
traced:

* eagerly: ``min``/``max`` are read back and `shared.checks.check_ids_range` raises the reference's
  ``ValueError``;
* inside ``tf.function`` (graph mode): a ``tf.debugging.Assert`` with the same message text (values
  filled in at run time) guards the lookup, and a bad id raises ``tf.errors.InvalidArgumentError``;
* under XLA (``jit_compile=True``): XLA compiles every ``Assert`` to a no-op (TF 2.21, see
  tensorflow/tensorflow#118075 for the same with ``check_numerics``), so nothing can raise inside
  the compiled program. `TokenEmbedding` therefore never looks up a bad id: the embedding of every
  out-of-range id is NaN, so the logits of that batch row are NaN, on every device, instead of a
  plausible wrong number. ``Transformer.predict`` checks its arrays eagerly before dispatch, so it
  raises the ``ValueError`` even when the model is compiled with XLA.

Masks are boolean, ``True`` = may attend, broadcastable to ``(batch, heads, q_len, k_len)``.
"""
from __future__ import annotations

import tensorflow as tf

from shared import checks


def in_xla_context() -> bool:
    """True while tracing a function compiled with XLA (``jit_compile=True``), where asserts are dropped."""
    return tf.__internal__.get_enclosing_xla_context() is not None


def to_tensor(name: str, value) -> tf.Tensor:
    """A tensor as it is (any dtype), or an array-like converted without casting."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name}: expected a tensor or array, got {type(value).__name__} ({err})") from None


def dims(x: tf.Tensor, n: int) -> list:
    """The first ``n`` sizes of ``x``: Python ints where known at trace time (always, eagerly), else
    scalar tensors. Cheaper than indexing ``tf.shape(x)`` on every call."""
    static = x.shape.as_list()[:n]
    if all(d is not None for d in static):
        return static
    dynamic = tf.shape(x)
    return [d if d is not None else dynamic[i] for i, d in enumerate(static)]


def _static_shape(x: tf.Tensor, fill: tuple[int, ...]) -> tuple[int, ...]:
    """The static shape with unknown dimensions replaced by ``fill`` (values that pass the static
    checks; the unknown ones are checked at run time or by the ops that consume them)."""
    dims = x.shape.as_list()
    return tuple(d if d is not None else f for d, f in zip(dims, fill + (1,) * len(dims)))


def _graph_assert(condition: tf.Tensor, message: str, values: tuple[tf.Tensor, ...]) -> tf.Operation:
    """An Assert carrying ``message`` with ``{}`` placeholders filled by ``values`` at run time."""
    return tf.debugging.Assert(condition, [tf.strings.format(message, values)])


def check_ids(name: str, ids, vocab: int, max_len: int) -> tf.Tensor:
    """Token ids: an integer tensor of shape (batch, seq), 1 <= seq <= max_len, values in [0, vocab).

    Returns:
        ``ids`` as an int32/int64 tensor; in graph mode it carries the run-time checks as control
        dependencies, so use the returned tensor for the lookup.

    Raises:
        TypeError: not an integer dtype.
        ValueError: wrong rank, empty, longer than ``max_len``, or (eagerly) an id outside ``[0, vocab)``.
        tf.errors.InvalidArgumentError: in graph mode, an id outside ``[0, vocab)`` or a run-time
            length over ``max_len``, with the same message text.
    """
    ids = to_tensor(name, ids)
    if ids.shape.rank is None:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got unknown rank")
    checks.check_ids(name, _static_shape(ids, (1, 1)), ids.dtype.name, ids.dtype.is_integer, max_len)
    if tf.executing_eagerly():
        lo, hi = (int(v) for v in tf.stack([tf.reduce_min(ids), tf.reduce_max(ids)]).numpy())
        checks.check_ids_range(name, vocab, lo, hi)
    elif not in_xla_context():  # under XLA an Assert is a no-op (and string ops do not compile)
        lo, hi = tf.reduce_min(ids), tf.reduce_max(ids)
        guards = [_graph_assert(tf.logical_and(lo >= 0, hi < vocab),
                                checks.ids_range_message(name, vocab, "{}", "{}"), (lo, hi))]
        if ids.shape[1] is None:  # length only known at run time
            length = tf.shape(ids)[1]
            guards.append(_graph_assert(
                tf.logical_and(length >= 1, length <= max_len),
                f"{name}: expected at most max_len={max_len} tokens (and at least 1), got {{}}", (length,)))
        with tf.control_dependencies(guards):
            ids = tf.identity(ids)
    if ids.dtype not in (tf.int32, tf.int64):  # gathers take int32/int64 indices only
        ids = tf.cast(ids, tf.int64)
    return ids


def check_mask(name: str, mask, batch: int | None, n_heads: int, q_len: int | None,
               k_len: int | None) -> tf.Tensor:
    """A bool tensor (True = may attend) broadcastable to ``(batch, n_heads, q_len, k_len)``, with the
    key axis exactly ``k_len``. A size unknown at trace time (``None``, on either side) cannot be
    compared there and is taken as matching; a mismatch then fails in the op that broadcasts the mask.

    Returns:
        ``mask`` as a tensor.

    Raises:
        TypeError: not a tensor or array, or not bool.
        ValueError: not rank 4, or a shape that does not broadcast.
    """
    if not (isinstance(mask, (tf.Tensor, tf.Variable)) or hasattr(mask, "__array__")):
        raise TypeError(f"{name}: expected a tf bool tensor, got {type(mask).__name__}")
    mask = to_tensor(name, mask)
    if mask.shape.rank is None:
        raise ValueError(f"{name}: expected a rank-4 mask, got unknown rank")
    expected = (batch, n_heads, q_len, k_len)
    dims = mask.shape.as_list()
    shape = tuple(d if d is not None else (expected[i] if i < 4 and expected[i] is not None else 1)
                  for i, d in enumerate(dims))
    sizes = tuple(e if e is not None else (shape[i] if i < len(shape) else 1)
                  for i, e in enumerate(expected))
    checks.check_mask(name, shape, mask.dtype.name, mask.dtype == tf.bool, *sizes)
    return mask


def make_src_mask(src: tf.Tensor, pad_id: int) -> tf.Tensor:
    """Source mask ``(batch, 1, 1, src_len)``: True where the key token is not padding."""
    return (src != pad_id)[:, None, None, :]


def make_tgt_mask(tgt: tf.Tensor, pad_id: int, first_is_real: bool = False) -> tf.Tensor:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: the key is not padding AND key <= query.

    ``first_is_real`` (`shared.masks.start_is_pad(config)`): column 0 is the decoder start token,
    never padding; padding comes from ``tgt != pad_id`` for positions 1.. only (`shared.masks`)."""
    positions = tf.range(dims(tgt, 2)[1])
    subsequent = positions[:, None] >= positions[None, :]  # (T, T), lower-triangular
    keys = tgt != pad_id  # (B, T)
    if first_is_real:
        keys = tf.logical_or(keys, positions == 0)
    return tf.logical_and(keys[:, None, None, :], subsequent)  # (B, 1, T, T)
