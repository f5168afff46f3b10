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
  plausible wrong number. Keras' ``predict``, ``fit`` and ``evaluate`` check every batch before
  a step takes it (``Transformer._checked``): arrays, a generator's, a ``PyDataset``'s and a torch
  ``DataLoader``'s batches with NumPy (the ``ValueError``), a ``tf.data.Dataset`` in its own
  pipeline, in graph mode (the ``InvalidArgumentError``).

Shapes get the same treatment. A size unknown at trace time (an ``input_signature`` with ``None``
dimensions, ``tf.function(reduce_retracing=True)``) cannot be checked while tracing, so every check
that eager mode makes on it (ids non-empty and at most ``max_len`` long, a mask's every axis, equal
batch sizes) is made at run time instead (`runtime_check`): an ``Assert`` with the eager message in
graph mode; under XLA, where the ``Assert`` would compile to nothing, the condition is collected by
`guarded` and the outputs of the call are made NaN when it fails (`poison`). A check that must run
at run time under XLA outside a `guarded` block refuses to trace.

Masks are boolean, ``True`` = may attend, broadcastable to ``(batch, heads, q_len, k_len)``.
"""
from __future__ import annotations

import contextlib
import threading

import numpy as np
import tensorflow as tf

from shared import checks
from shared.checks import batch_ids
from shared.masks import check_mask_ids, check_pad_id


def in_xla_context() -> bool:
    """True while tracing a function compiled with XLA (``jit_compile=True``), where asserts are dropped."""
    return tf.__internal__.get_enclosing_xla_context() is not None


def to_tensor(name: str, value) -> tf.Tensor:
    """A tensor as it is (any dtype), or an array-like converted without casting."""
    if isinstance(value, (tf.Tensor, tf.Variable)):
        return value
    if (lengths := checks.ragged_rows(value)) is not None:  # TF: "non-rectangular Python sequence"
        raise ValueError(checks.ragged_message(name, lengths))
    try:
        return tf.convert_to_tensor(value)
    except (TypeError, ValueError) as err:  # TF's reason kept, but for an array of objects (no news)
        reason = "" if checks.is_object_array(value) else f" ({err})"
        raise TypeError(checks.not_an_array_message(name, value) + reason) from None


def check_training(training) -> None:
    """Keras' ``training``: True, False, None (Keras' default, the calling context's) or a bool
    tensor; anything else is refused as `shared.checks.check_flag` refuses it ("no" turned dropout
    on). torch_impl has no such argument (``model.train()``)."""
    if training is None or (isinstance(training, (tf.Tensor, tf.Variable)) and training.dtype == tf.bool):
        return
    checks.check_flag(training, "training")


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


# Conditions collected while tracing under XLA, one list per `guarded` block (per thread: two
# threads may trace at once).
_guards = threading.local()


@contextlib.contextmanager
def as_raised():
    """An error raised inside reaches the caller of ``Transformer.__call__`` as it was raised:
    Keras' ``Layer.__call__`` re-raises an error from ``call`` as a new one, its text wrapped in
    "Exception encountered when calling Transformer.call()", terminal bold and the arguments
    (`keras.src.utils.traceback_utils.inject_argument_info_in_traceback`), unless the error
    carries the mark Keras puts on one it has wrapped already. Marked, a refusal reads as
    torch_impl's and the reference's, word for word."""
    try:
        yield
    except Exception as error:
        error._keras_call_info_injected = True
        raise


@contextlib.contextmanager
def guarded():
    """While tracing under XLA, collect the run-time conditions of the checks made inside; yields
    the list, for `poison`. Eagerly and in graph mode it stays empty (the checks raise or assert)."""
    stack = _guards.__dict__.setdefault("stack", [])
    stack.append([])
    try:
        yield stack[-1]
    finally:
        stack.pop()


def poison(x: tf.Tensor, conditions: list) -> tf.Tensor:
    """``x``, or NaN everywhere when any of ``conditions`` (scalar bool tensors) is false: what a
    failed check gives under XLA, where nothing can raise (like the NaN embedding of a bad id)."""
    if not conditions:
        return x
    ok = tf.reduce_all(tf.stack(conditions))
    return tf.where(ok, x, tf.constant(np.nan, x.dtype))


def runtime_check(x: tf.Tensor, conditions: list[tuple[tf.Tensor, str, tuple]]) -> tf.Tensor:
    """Checks on sizes known only at run time: each ``(ok, message, values)`` (a scalar bool, the
    eager message with ``{}`` for each of ``values``) must hold. In graph mode an ``Assert`` raising
    ``tf.errors.InvalidArgumentError`` with the message, on the returned ``x``; under XLA the
    condition goes to the enclosing `guarded` block (refusing to trace without one). Eagerly there is
    nothing to do: every size is known and was checked statically."""
    if not conditions or tf.executing_eagerly():
        return x
    if in_xla_context():
        stack = _guards.__dict__.get("stack")
        if not stack:
            raise ValueError(f"{conditions[0][1].split(':')[0]}: under XLA (jit_compile=True) this "
                             "check needs sizes known at trace time; give static shapes (no None in "
                             "the input_signature, no reduce_retracing) or call it inside the model")
        stack[-1].extend(ok for ok, _, _ in conditions)
        return x
    with tf.control_dependencies([_graph_assert(ok, message, values)
                                  for ok, message, values in conditions]):
        return tf.identity(x)


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
    # Arrays and lists through the conversion torch_impl's `_as_ids` makes (`shared.checks.batch_ids`):
    # None, objects, text and Python floats named as there, not in TensorFlow's words or dtypes.
    ids = ids if isinstance(ids, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(batch_ids(name, ids))
    if ids.shape.rank is None:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got unknown rank")
    checks.check_ids(name, _static_shape(ids, (1, 1)), ids.dtype.name, ids.dtype.is_integer, max_len)
    if tf.executing_eagerly():
        lo, hi = (int(v) for v in tf.stack([tf.reduce_min(ids), tf.reduce_max(ids)]).numpy())
        checks.check_ids_range(name, vocab, lo, hi)
    else:
        batch, length = tf.shape(ids)[0], tf.shape(ids)[1]
        conditions = []
        if None in ids.shape.as_list():  # sizes only known at run time: the eager checks, then
            conditions += [(tf.logical_and(batch >= 1, length >= 1),
                            checks.empty_message(name, "{}", "{}"), (batch, length)),
                           (length <= max_len, checks.too_long_message(name, max_len, "{}"), (length,))]
        ids = runtime_check(ids, conditions)
        if not in_xla_context():  # under XLA a bad id embeds as NaN (`TokenEmbedding`) instead
            lo, hi = tf.reduce_min(ids), tf.reduce_max(ids)
            ids = runtime_check(ids, [(tf.logical_and(lo >= 0, hi < vocab),
                                       checks.ids_range_message(name, vocab, "{}", "{}"), (lo, hi))])
    if ids.dtype not in (tf.int32, tf.int64):  # gathers take int32/int64 indices only
        ids = tf.cast(ids, tf.int64)
    return ids


def check_mask(name: str, mask, batch, n_heads: int, q_len, k_len) -> tf.Tensor:
    """A bool tensor (True = may attend) broadcastable to ``(batch, n_heads, q_len, k_len)``, with the
    key axis exactly ``k_len``. ``batch``, ``q_len``, ``k_len``: ints, or scalar tensors for sizes
    known only at run time (`dims`). What cannot be compared at trace time is checked at run time
    (`runtime_check`), with the same message.

    Returns:
        ``mask`` as a tensor (in graph mode carrying the run-time checks: use it).

    Raises:
        TypeError: not a tensor or array, or not bool.
        ValueError: not rank 4, or a shape that does not broadcast.
        tf.errors.InvalidArgumentError: in graph mode, a shape that does not broadcast at run time.
    """
    if not isinstance(mask, (tf.Tensor, tf.Variable)):  # an array: refused in the shared words, or bool
        mask = checks.mask_array(name, mask)
    mask = to_tensor(name, mask)
    if mask.shape.rank is None:
        raise ValueError(f"{name}: expected a rank-4 mask, got unknown rank")
    expected = (batch, n_heads, q_len, k_len)
    known = [e if isinstance(e, int) else None for e in expected]
    static = mask.shape.as_list()
    # Statically: unknown sizes (either side) are taken as matching; they are checked below.
    shape = tuple(d if d is not None else (known[i] if i < 4 and known[i] is not None else 1)
                  for i, d in enumerate(static))
    sizes = tuple(e if e is not None else (shape[i] if i < len(shape) else 1)
                  for i, e in enumerate(known))
    checks.check_mask(name, shape, mask.dtype.name, mask.dtype == tf.bool, *sizes)
    if all(isinstance(e, int) for e in expected) and None not in static:
        return mask
    dynamic = tf.shape(mask)
    got = [static[i] if static[i] is not None else dynamic[i] for i in range(4)]
    ok = tf.constant(True)
    for i in range(4):
        match = tf.equal(got[i], expected[i])
        ok = tf.logical_and(ok, tf.logical_or(match, tf.equal(got[i], 1)) if i < 3 else match)
    # The message of shared.checks, every size a placeholder (filled in at run time).
    as_tensor = [tf.cast(v, tf.int32) for v in (q_len, k_len, batch, n_heads, q_len, k_len, *got)]
    message = (f"{name}: expected a mask broadcastable to "
               f"{checks.mask_expectation('{}', '{}', '{}', '{}')}, got shape ({{}}, {{}}, {{}}, {{}})")
    return runtime_check(mask, [(ok, message, tuple(as_tensor))])


def check_same_batch(src: tf.Tensor, tgt: tf.Tensor, name: str = "tgt") -> tf.Tensor:
    """``tgt`` (ids or memory) must have the batch size of ``src``, the error naming ``name``;
    returns ``tgt`` (in graph mode carrying the run-time check when a batch size is unknown at
    trace time)."""
    a, b = src.shape[0], tgt.shape[0]
    if a is not None and b is not None:
        checks.check_same_batch(src.shape, tgt.shape, name)
        return tgt
    a, b = tf.shape(src)[0], tf.shape(tgt)[0]
    return runtime_check(tgt, [(tf.equal(a, b), checks.same_batch_message(name, "{}", "{}"), (a, b))])


def _mask_ids(name: str, ids) -> tf.Tensor:
    """The ids of a ``make_*_mask`` helper as a tensor (arrays and lists converted as `check_ids`
    converts them) of an integer dtype and rank 2 (`shared.masks.check_mask_ids`)."""
    ids = ids if isinstance(ids, (tf.Tensor, tf.Variable)) else tf.convert_to_tensor(batch_ids(name, ids))
    if ids.shape.rank is None:
        raise ValueError(f"{name}: expected token ids of shape (batch, seq), got unknown rank")
    check_mask_ids(name, ids.shape, ids.dtype.name, ids.dtype.is_integer)
    return ids


def _not_pad(ids: tf.Tensor, pad_id: int | None) -> tf.Tensor:
    """``ids != pad_id`` as numbers, all True for a ``pad_id`` of None or one that no id of the
    dtype can equal (compared in the ids' own dtype, ``pad_id`` 300 would wrap to 44 in uint8;
    torch_impl's masks and the reference's compare as numbers)."""
    if pad_id is None or not ids.dtype.min <= pad_id <= ids.dtype.max:
        return tf.ones_like(ids, dtype=tf.bool)
    return ids != pad_id


def make_src_mask(src: tf.Tensor, pad_id: int | None) -> tf.Tensor:
    """Source mask ``(batch, 1, 1, src_len)``: True where the key token is not padding; all True
    when ``pad_id`` is None (``config.mask_padding=False``, `shared.masks.padding_id`).

    Raises:
        TypeError: ``pad_id`` neither an int nor None, or ``src`` no integer ids (the reference's
            messages, before any work).
        ValueError: ``src`` not of rank 2."""
    check_pad_id(pad_id)
    src = _mask_ids("src", src)
    return _not_pad(src, pad_id)[:, None, None, :]


def make_tgt_mask(tgt: tf.Tensor, pad_id: int | None, first_is_real: bool = False) -> tf.Tensor:
    """Target mask ``(batch, 1, tgt_len, tgt_len)``: the key is not padding AND key <= query.

    ``first_is_real`` (`shared.masks.start_is_pad(config)`): column 0 is the decoder start token,
    never padding; padding comes from ``tgt != pad_id`` for positions 1.. only (`shared.masks`).
    ``pad_id=None`` (`shared.masks.padding_id`): no key is padding, the subsequent mask alone.

    Raises:
        TypeError: ``pad_id`` neither an int nor None, or ``tgt`` no integer ids (the reference's
            messages, before any work).
        ValueError: ``tgt`` not of rank 2."""
    check_pad_id(pad_id)
    checks.check_flag(first_is_real, "first_is_real")  # "no" read for its truth made column 0 real
    tgt = _mask_ids("tgt", tgt)
    positions = tf.range(dims(tgt, 2)[1])
    subsequent = positions[:, None] >= positions[None, :]  # (T, T), lower-triangular
    keys = _not_pad(tgt, pad_id)  # (B, T)
    if first_is_real:
        keys = tf.logical_or(keys, positions == 0)
    return tf.logical_and(keys[:, None, None, :], subsequent)  # (B, 1, T, T)
