"""The key/value cache of incremental decoding: what one decoding step keeps for the next.

Per decoder layer, cross-attention keys and values are computed once per source (they depend only
on the encoder memory) and self-attention keys and values grow by one position a step. Rows are
``n = item * beams + beam`` (``beams = 1`` for greedy), the row order of `shared.decoding`.

The layout and names are torch_impl.cache's: buffers ``(N, H, capacity, d_k)`` preallocated for
``capacity`` positions. What differs is what TensorFlow needs: tensors are immutable and a
compiled loop (``tf.while_loop``, XLA) carries its state as a nested structure of fixed-shape
tensors. So a cache is a ``NamedTuple`` of tensors, ``length`` is a scalar int32 tensor, and every
update returns a new cache (`MultiHeadAttention.extend` returns the new buffers, `DecoderLayer.step`
the layer cache, `Transformer.decode_step` ``(logits, cache)``, `DecoderCache.reorder_beams` the
reordered cache) instead of changing it in place; torch_impl returns its caches the same way, so
the calling code is the same in both.

Fixed shapes throughout, eagerly as compiled, so both run the same ops:

* the new key/value goes to position ``length`` with ``tf.tensor_scatter_nd_update`` (`write_position`);
* self-attention reads the whole buffer, masked to positions ``<= length`` (`filled_mask`);
* beam reordering gathers whole rows (scratch positions included: a slice ``:length`` would have a
  shape that changes every step, which XLA cannot compile).

Used through `tf_impl.Transformer.init_cache` and `.decode_step`; `tf_impl.search` gives the loops
that drive them.
"""
from __future__ import annotations

from typing import NamedTuple

import keras
import tensorflow as tf

from shared.checks import check_beam_rows, check_beam_rows_items

from .inputs import runtime_check, to_tensor

# The Keras classes tf_impl builds its models from. With tf_impl's own classes, the only layer
# types whose weights a decoding step may read instead of calling them (`_as_built`).
_BUILT_FROM = frozenset({keras.layers.Dense, keras.layers.Dropout})


def _as_built(layer: keras.layers.Layer) -> bool:
    """Whether every sublayer of ``layer`` computes what reading its weights computes, so that
    decoding may read them (`StepWeights`) instead of calling the layers:
    - each of a type tf_impl builds (`_BUILT_FROM`, or a class of tf_impl's own), not a
      replacement nor a subclass;
    - none quantized (``Model.quantize``: a Dense's ``kernel`` is then its int8 or int4 values,
      which its call rescales). A Dense with LoRA enabled (``enable_lora``) is as built: its
      ``kernel`` includes the adapter.
    Otherwise the layers are called, as torch_impl calls its modules (`torch_impl.cache.
    _as_built`): the same results, slower."""
    for sub in layer._flatten_layers(include_self=False):
        if not (type(sub) in _BUILT_FROM or type(sub).__module__.startswith("tf_impl.")):
            return False
        if getattr(sub, "quantization_mode", None) is not None:
            return False
    return True


# A cache's weights where its steps call the layers (a model not as built, `_as_built`): an empty
# structure, which ``tf.while_loop``'s state can carry (None it cannot).
NO_WEIGHTS = ()


def projection(weights, name: str) -> tuple | None:
    """The ``(kernel, bias)`` named ``name`` (``"qkv"``, ``"cross_kv"``, ``"inner"``, ...: the
    ``NAME_kernel`` and ``NAME_bias`` fields) of a layer's laid-out weights (`StepWeights`,
    `EncoderWeights`), or None where a cache keeps `NO_WEIGHTS` (a model not as built: the layers
    are called)."""
    return (getattr(weights, f"{name}_kernel"), getattr(weights, f"{name}_bias")) if weights else None


class StepWeights(NamedTuple):
    """One decoder layer's weights laid out for a decoding step, as torch_impl.cache's: kernels
    ``(in, out)`` (the Keras layout already), the self-attention's query, key and value stacked
    into one kernel so that a step projects its token with one product instead of three, and the
    cross-attention's key and value into another (the cache's source keys and values, one product
    per layer and source). Taken when the cache is made (inside a compiled decode: once per call,
    before the loop)."""
    qkv_kernel: tf.Tensor  # (d, 3 * H * d_k): query | key | value
    qkv_bias: tf.Tensor
    self_output_kernel: tf.Tensor  # (H * d_k, d)
    self_output_bias: tf.Tensor
    cross_query_kernel: tf.Tensor  # (d, H * d_k)
    cross_query_bias: tf.Tensor
    cross_kv_kernel: tf.Tensor  # (d, 2 * H * d_k): key | value, applied to the encoder memory
    cross_kv_bias: tf.Tensor
    cross_output_kernel: tf.Tensor  # (H * d_k, d)
    cross_output_bias: tf.Tensor
    inner_kernel: tf.Tensor  # (d, d_ff)
    inner_bias: tf.Tensor
    outer_kernel: tf.Tensor  # (d_ff, d)
    outer_bias: tf.Tensor


def dense(x: tf.Tensor, kernel: tf.Tensor, bias: tf.Tensor) -> tf.Tensor:
    """``x @ kernel + bias`` with an ``(in, out)`` kernel: ``(N, L, in) -> (N, L, out)``, as one
    2-D product. In a half precision the kernel is half (`Transformer._step_weights`) and ``x``
    (the float32 residual stream) is cast to it, as torch's autocast casts its operands."""
    if x.dtype != kernel.dtype:
        x = tf.cast(x, kernel.dtype)
    n, length = tf.shape(x)[0], tf.shape(x)[1]
    flat = tf.matmul(tf.reshape(x, [-1, kernel.shape[0]]), kernel) + bias
    return tf.reshape(flat, [n, length, kernel.shape[1]])


def prepare_mask(mask: tf.Tensor, dtype: tf.DType) -> tuple[tf.Tensor, tf.Tensor]:
    """A cross-attention mask made ready once per source rather than in every layer at every step:
    ``(mask | no key at all, has a key)``; a row with no allowed key attends every key and its
    output is multiplied by 0 (docs/design.md, convention 3).

    Shape: mask bool ``(N|1, 1|H, 1, S)`` -> ``(the same shape, (N|1, 1|H, 1, 1) in dtype)``.
    """
    has_key = tf.reduce_any(mask, axis=-1, keepdims=True)
    return tf.logical_or(mask, tf.logical_not(has_key)), tf.cast(has_key, dtype)


class LayerCache(NamedTuple):
    """One decoder layer's cached keys and values, per head.

    Shape:
        self_key, self_value: ``(N, H, capacity, d_k)``; positions ``0 .. length - 1`` of the owning
            `DecoderCache` are filled, the rest is scratch.
        cross_key, cross_value: ``(B, H, S, d_k)``, from the encoder memory, never changed: once
            per source item, not per beam (the owning `DecoderCache`'s N rows are B items of
            ``N / B`` beams, and each item's rows attend its keys as that item's queries).
        weights: the layer's weights as a step reads them (`StepWeights`); `NO_WEIGHTS` for a
            model not as built (`_as_built`): its steps call the layers.
    """
    self_key: tf.Tensor
    self_value: tf.Tensor
    cross_key: tf.Tensor
    cross_value: tf.Tensor
    weights: StepWeights | tuple[()]

    def updated(self, self_key: tf.Tensor, self_value: tf.Tensor) -> "LayerCache":
        """This layer's cache holding the self-attention buffers of a step (those
        `MultiHeadAttention.extend` returns): a new cache (torch_impl updates its own in place)."""
        return self._replace(self_key=self_key, self_value=self_value)


class DecoderCache(NamedTuple):
    """The state of incremental decoding for ``N`` rows (a nested structure ``tf.while_loop`` carries).

    Attributes:
        layers: one `LayerCache` per decoder layer (a tuple).
        src_mask: bool, True = may attend, ``(B|1, 1|H, 1, S)``: the source padding, for
            cross-attention, prepared once (`prepare_mask`): a row with no key may attend every
            key, and ``src_keep`` zeroes its output after.
        src_keep: ``(B|1, 1|H, 1, 1)`` in the model dtype, 0 for an item with no source key, else 1.
        generator: the output projection as a step reads it, ``(matrix, bias (V,))``: the matrix
            ``(d, V)`` for one row, ``(V, d)`` used transposed for more (the faster layout for
            each under XLA, `tf_impl.Transformer._step_weights`); `NO_WEIGHTS` where the layers'
            are (the generator layer is called).
        length: int32 scalar tensor, positions already decoded; the next token goes to position
            ``length`` (and gets row ``length`` of the positional table).
    """
    layers: tuple[LayerCache, ...]
    src_mask: tf.Tensor
    src_keep: tf.Tensor
    generator: tuple[tf.Tensor, tf.Tensor] | tuple[()]
    length: tf.Tensor

    @property
    def capacity(self) -> int:
        """The most positions the self-attention buffers hold (``max_len`` of `init_cache`)."""
        return int(self.layers[0].self_key.shape[2]) if self.layers else 0

    @property
    def rows(self) -> int | None:
        """``N``, where known statically (always, eagerly)."""
        return (self.layers[0].self_key if self.layers else self.src_mask).shape[0]

    def advanced(self, layers) -> "DecoderCache":
        """The cache after one decoding step: ``layers`` (from each `DecoderLayer.step`) and one
        more position filled; a new cache (torch_impl updates its own in place)."""
        return self._replace(layers=tuple(layers), length=self.length + 1)

    def reorder_beams(self, rows: tf.Tensor) -> "DecoderCache":
        """The cache in which row ``n`` continues from row ``rows[n]`` (beam search's source beam).

        ``rows[n]`` must belong to the same source item as ``n`` (``rows[n] // beams == n // beams``),
        as beam search's are: cross-attention keys/values and the source mask are kept once per
        item, so they stay as they are. Checked (`shared.checks.check_beam_rows`; the values
        eagerly, where they can be read); beam search calls `_reorder_beams`, unchecked.

        Shape: rows ``(N,)`` integer.
        """
        rows = to_tensor("rows", rows)
        check_beam_rows(tuple(rows.shape) if rows.shape.is_fully_defined() else None, rows.dtype.name,
                        rows.dtype.is_integer, self.rows)
        if tf.executing_eagerly():
            items = self.layers[0].cross_key.shape[0] if self.layers else self.rows
            check_beam_rows_items(rows.numpy().tolist(), self.rows // items)
        if rows.dtype not in (tf.int32, tf.int64):  # tf.gather takes no other index dtype
            rows = tf.cast(rows, tf.int64)
        return self._reorder_beams(rows)

    def _reorder_beams(self, rows: tf.Tensor) -> "DecoderCache":
        """`reorder_beams` without the checks: ``rows`` ``(N,)`` int32/int64, each within its item."""
        layers = tuple(layer._replace(self_key=tf.gather(layer.self_key, rows),
                                      self_value=tf.gather(layer.self_value, rows))
                       for layer in self.layers)
        return self._replace(layers=layers)


def check_free_position(tokens: tf.Tensor, cache: DecoderCache) -> tf.Tensor:
    """``tokens``, checked to go to a free position of ``cache`` (``length < capacity``), in every
    TensorFlow mode: eagerly a ``ValueError``; in graph mode an ``Assert`` on ``tokens`` (a
    ``tf.errors.InvalidArgumentError`` with the same text); under XLA, where the ``Assert`` compiles to
    nothing and the scatter of `write_position` silently drops an out-of-range update, the condition
    joins the enclosing `tf_impl.inputs.guarded` block, whose outputs become NaN (`poison`).

    Shape: tokens ``(N,)``; the cache's ``length`` a scalar."""
    message = (f"cache: expected a free position, got a full cache ({cache.capacity} positions; "
               "init_cache(max_len=...) sets it)")
    if tf.executing_eagerly():
        if int(cache.length) >= cache.capacity:
            raise ValueError(message)
        return tokens
    return runtime_check(tokens, [(cache.length < cache.capacity, message, ())])


def write_position(buf: tf.Tensor, values: tf.Tensor, position: tf.Tensor) -> tf.Tensor:
    """``buf`` with ``buf[:, :, position] = values``: one scatter, not a one-hot blend of the whole
    buffer (TF forwards the input buffer where it can; XLA updates it in place in a loop).

    Shape: buf ``(N, H, C, d_k)``, values ``(N, H, d_k)``, position int32 scalar in ``[0, C)``.
    """
    n, h = tf.shape(buf)[0], tf.shape(buf)[1]
    rows, heads = tf.meshgrid(tf.range(n), tf.range(h), indexing="ij")  # (N, H) each
    at = tf.fill([n, h], tf.cast(position, tf.int32))
    return tf.tensor_scatter_nd_update(buf, tf.stack([rows, heads, at], axis=-1), values)


def filled_mask(capacity: int, position: tf.Tensor) -> tf.Tensor:
    """Bool ``(1, 1, 1, capacity)``, True = may attend: positions ``0 .. position``."""
    return (tf.range(capacity) <= tf.cast(position, tf.int32))[None, None, None, :]


def repeat_rows(x: tf.Tensor, beams: int) -> tf.Tensor:
    """Repeat each row ``beams`` times along axis 0: row ``b`` -> rows ``b * beams`` to
    ``b * beams + beams - 1``. A tensor with a batch axis of 1 broadcasts and is returned as is."""
    return x if beams == 1 or x.shape[0] == 1 else tf.repeat(x, beams, axis=0)
