"""Multi-head scaled dot-product attention with a boolean mask.

Masks are boolean, ``True`` = may attend (docs/design.md, convention 2), broadcastable to
``(batch, heads, q_len, k_len)``. They are used as they are, with ``tf.where``; never as an additive
0/-inf mask, and never through Keras' own mask plumbing, which casts any mask to bool (an additive
mask would be silently inverted).

A masked key gets exactly zero weight and a query with no allowed key (an all-padding sequence) gets
all-zero weights and a zero context (docs/design.md, convention 3): masked scores are set to the
dtype's lowest finite value, so ``exp(lowest - row_max)`` underflows to exactly 0 wherever the row
has an allowed key; a row with none comes out of the softmax uniform (not NaN) and is zeroed after.
Everything is elementwise or a matmul, so it compiles with XLA and fuses into the softmax.
"""
from __future__ import annotations

import math

import keras
import tensorflow as tf

from shared.checks import check_flag, check_position, check_step_kernels

from .cache import dense, filled_mask, write_position
from .inputs import check_training, dims


def masked_softmax(scores: tf.Tensor, mask: tf.Tensor | None) -> tf.Tensor:
    """Softmax over the last axis where ``mask`` is True; masked entries are exactly 0 and a row with
    no allowed entry is all zeros (not NaN, not uniform).

    Shape: scores ``(B, H, Q, K)``; mask bool, broadcastable to it.
    """
    if mask is None:
        return tf.nn.softmax(scores, axis=-1)
    lowest = tf.constant(scores.dtype.min, scores.dtype)
    weights = tf.nn.softmax(tf.where(mask, scores, lowest), axis=-1)
    # A where, not a multiply: it also zeroes the gradient of an all-blocked row.
    return tf.where(mask, weights, tf.zeros((), scores.dtype))


def _scores(q: tf.Tensor, k: tf.Tensor, d_k: int) -> tf.Tensor:
    """Scaled scores ``q k^T / sqrt(d_k)``, ``(B, H, Q, d_k) x (B, H, K, d_k) -> (B, H, Q, K)``. In
    a half precision (`shared.precision`) they are computed in float32 from the half query and key
    (their products are exact in float32) and scaled in float32: torch's SDPA kernels' rounding.
    Otherwise the query is scaled first (the same product as scaling the scores, cheaper)."""
    if q.dtype in (tf.bfloat16, tf.float16):
        scores = tf.matmul(tf.cast(q, tf.float32), tf.cast(k, tf.float32), transpose_b=True)
        return scores * tf.constant(1.0 / math.sqrt(d_k), tf.float32)
    return tf.matmul(q * tf.constant(1.0 / math.sqrt(d_k), q.dtype), k, transpose_b=True)


class MultiHeadAttention(keras.layers.Layer):
    """Attention of ``query_in`` over ``memory`` with ``n_heads`` heads of width ``d_k`` (``head_dim``,
    or ``d_model // n_heads`` when that is None), scores scaled by ``1 / sqrt(d_k)``.

    Four projections with bias, ``keras.layers.Dense`` sublayers named ``query``, ``key``, ``value``
    (``d_model -> n_heads * d_k``) and ``output`` (``n_heads * d_k -> d_model``), whose kernels
    ``(in, out)`` are the canonical layout (no transpose on import/export).

    Args:
        d_model: model width, divisible by ``n_heads`` unless ``head_dim`` is given.
        n_heads: number of heads.
        dropout: probability of dropping an attention weight (training only).
        head_dim: per-head width (``config.head_dim``); None = ``d_model // n_heads``.
    """

    @property
    def output(self) -> keras.layers.Dense:
        """The output projection (``output`` as in torch_impl and the canonical names). It overrides
        Keras' ``Layer.output``, which only means something for a layer inside a functional-API
        graph; the Dense itself lives in ``_output``, because Keras' saving skips any attribute
        that a plain ``Layer`` also has, ``output`` included."""
        return self._output

    def __init__(self, d_model: int, n_heads: int, dropout: float, head_dim: int | None = None,
                 **kwargs):
        super().__init__(**kwargs)
        if head_dim is None and d_model % n_heads:
            raise ValueError(
                f"MultiHeadAttention: d_model={d_model} expected a multiple of n_heads={n_heads}")
        d_k = head_dim if head_dim is not None else d_model // n_heads
        self.d_model, self.n_heads, self.d_k, self.rate = d_model, n_heads, d_k, float(dropout)
        self.head_dim = head_dim
        inner = n_heads * d_k
        for name in ("query", "key", "value", "output"):
            units, fan_in = (d_model, inner) if name == "output" else (inner, d_model)
            dense = keras.layers.Dense(units, dtype=self.dtype_policy, name=name)
            dense.build((None, fan_in))
            setattr(self, "_output" if name == "output" else name, dense)
        self.dropout = keras.layers.Dropout(dropout, dtype=self.dtype_policy)
        self.built = True

    def _heads(self, x: tf.Tensor) -> tf.Tensor:
        b, length = dims(x, 2)
        x = tf.reshape(x, [b, length, self.n_heads, self.d_k])  # (B, L, H, d_k)
        return tf.transpose(x, [0, 2, 1, 3])  # (B, H, L, d_k)

    def call(self, query_in: tf.Tensor, memory: tf.Tensor, mask: tf.Tensor | None,
             return_weights: bool = False, training: bool = False) -> tuple[tf.Tensor, tf.Tensor | None]:
        """Attend from each query position to the memory positions its mask allows.

        Args:
            query_in: ``(B, Q, d_model)``; memory: ``(B, K, d_model)`` (``query_in`` for self-attention).
            mask: bool, ``True`` = may attend, broadcastable to ``(B, H, Q, K)``; ``None`` = all keys.
            return_weights: also return the attention weights (before dropout).
            training: apply dropout to the attention weights.

        Returns:
            output ``(B, Q, d_model)``, and the weights ``(B, H, Q, K)`` or ``None``.
        """
        k, v = self.keys_values(memory)
        return self.attend(query_in, k, v, mask, return_weights, training)

    def keys_values(self, memory: tf.Tensor, kv: tuple | None = None) -> tuple[tf.Tensor, tf.Tensor]:
        """Per-head keys and values of ``memory (B, K, d_model)``, each ``(B, H, K, d_k)``: what a
        decoding cache (`tf_impl.cache`) keeps instead of recomputing. With ``kv``, the stacked
        ``(kernel (d, 2 * H * d_k), bias)`` of `step_kernels`, both from one product; the same to
        rounding."""
        if kv is None:
            return self._heads(self.key(memory)), self._heads(self.value(memory))
        b, length = dims(memory, 2)
        kv = tf.reshape(dense(memory, *kv), [b, length, 2, self.n_heads, self.d_k])
        k, v = tf.unstack(tf.transpose(kv, [2, 0, 3, 1, 4]))  # (B, H, K, d_k) each
        return k, v

    def attend(self, query_in: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor | None,
               return_weights: bool = False, training: bool = False) -> tuple[tf.Tensor, tf.Tensor | None]:
        """`call` with the keys and values given (``(B, H, K, d_k)``, from `keys_values` or a
        cache); the other arguments and the result are those of `call`."""
        check_flag(return_weights, "return_weights")
        check_training(training)
        b, q_len = dims(query_in, 2)
        q = self._heads(self.query(query_in))  # (B, H, Q, d_k)
        # Mixed precision (tf_impl.precision): softmax in float32 (`_scores`), the weights back
        # to the half dtype for the product with the values: torch's SDPA kernels' rounding.
        weights = masked_softmax(_scores(q, k, self.d_k), mask)  # (B, H, Q, K)
        context = tf.matmul(tf.cast(self.dropout(weights, training=training), v.dtype), v)  # (B, H, Q, d_k)
        context = tf.reshape(tf.transpose(context, [0, 2, 1, 3]),
                             [b, q_len, self.n_heads * self.d_k])  # (B, Q, H*d_k)
        return self.output(context), (weights if return_weights else None)  # (B, Q, d)

    def step_kernels(self) -> tuple[tf.Tensor, ...]:
        """``(query | key | value kernel (d, 3 * H * d_k), its bias, query kernel (d, H * d_k), its
        bias, key | value kernel (d, 2 * H * d_k), its bias, output kernel (H * d_k, d), its
        bias)``: `tf_impl.cache.StepWeights`' layout."""
        qkv, kv = (self.query, self.key, self.value), (self.key, self.value)
        return (tf.concat([d.kernel for d in qkv], axis=1), tf.concat([d.bias for d in qkv], axis=0),
                tf.convert_to_tensor(self.query.kernel), tf.convert_to_tensor(self.query.bias),
                tf.concat([d.kernel for d in kv], axis=1), tf.concat([d.bias for d in kv], axis=0),
                tf.convert_to_tensor(self.output.kernel), tf.convert_to_tensor(self.output.bias))

    def attend_prepared(self, query_in: tf.Tensor, k: tf.Tensor, v: tf.Tensor, mask: tf.Tensor,
                        keep: tf.Tensor, query: tuple | None, output: tuple | None) -> tf.Tensor:
        """`attend` of one decoding step (the cross-attention of a cached step): the query and
        output projections given as ``(kernel (in, out), bias)`` (`step_kernels`), the mask made
        ready once (`tf_impl.cache.prepare_mask`: every row may attend some key, ``keep`` zeroes
        the rows that had none), no dropout, no weights. Shape: query_in ``(N, 1, d_model)``, k/v
        ``(B, H, S, d_k)``, mask ``(B|1, 1|H, 1, S)``, keep ``(B|1, 1|H, 1, 1)`` -> ``(N, 1,
        d_model)``, N = B * beams (`tf_impl.cache.DecoderCache`: the keys kept once per item, not
        per beam). With ``query`` and ``output`` None (a model not as built:
        `tf_impl.cache._as_built`) the projections are the layers, called."""
        n, items = dims(query_in, 1)[0], dims(k, 1)[0]
        q = self.query(query_in) if query is None else dense(query_in, *query)
        one_row_each = isinstance(n, int) and isinstance(items, int) and n == items
        if one_row_each:
            q = tf.reshape(q, [n, self.n_heads, 1, self.d_k])  # (N, H, 1, d_k)
        else:  # each item's rows (its beams) are its queries: (B, H, beams, d_k)
            q = tf.transpose(tf.reshape(q, [items, -1, self.n_heads, self.d_k]), [0, 2, 1, 3])
        scores = _scores(q, k, self.d_k)  # (B, H, beams, S)
        weights = tf.nn.softmax(tf.where(mask, scores, tf.constant(scores.dtype.min, scores.dtype)))
        context = tf.matmul(tf.cast(weights, v.dtype), v) * keep  # (B, H, beams, d_k)
        if not one_row_each:
            context = tf.transpose(context, [0, 2, 1, 3])  # (B, beams, H, d_k): rows item * beams + beam
        context = tf.reshape(context, [n, 1, self.n_heads * self.d_k])
        return self.output(context) if output is None else dense(context, *output)

    def extend(self, query_in: tf.Tensor, key_cache: tf.Tensor, value_cache: tf.Tensor,
               position: tf.Tensor, qkv: tuple | None = None, output: tuple | None = None,
               mask: tf.Tensor | None = None) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """Self-attention of one new position over itself and every earlier one, with a cache.

        The new key and value (projections of ``query_in``) are written at ``position`` of the
        preallocated ``key_cache``/``value_cache`` ``(N, H, capacity, d_k)``, and the query attends
        to positions ``0 .. position`` of the whole buffer (a fixed shape, also under XLA). No
        padding mask: in decoding pad is never generated and a finished row's output is ignored,
        so every earlier position of a live row is a real token, and the padding-AND-subsequent
        target mask of the full pass reduces to "all previous positions".

        Shape: query_in ``(N, 1, d_model)``, position int32 scalar -> ``(output (N, 1, d_model),
        key_cache, value_cache)``, the caches updated (tensors are immutable: new ones returned).
        With ``qkv`` and ``output`` (``(kernel (in, out), bias)`` of `step_kernels`, as a cache
        keeps them) the query, key and value come from one matrix product; the same to rounding.
        ``mask`` is the step's `tf_impl.cache.filled_mask`, made once for every layer by
        `Decoder.step` (made here when not given).
        """
        check_step_kernels(qkv, output)
        if not tf.is_tensor(position):
            check_position(position, key_cache.shape[2], mask)
        if mask is None:
            mask = filled_mask(key_cache.shape[2], position)  # (1, 1, 1, capacity)
        if qkv is None:
            k, v = self.keys_values(query_in)  # (N, H, 1, d_k)
            key_cache = write_position(key_cache, k[:, :, 0], position)
            value_cache = write_position(value_cache, v[:, :, 0], position)
            out, _ = self.attend(query_in, key_cache, value_cache, mask)
            return out, key_cache, value_cache
        n = dims(query_in, 1)[0]
        q, k, v = tf.unstack(tf.reshape(dense(query_in, *qkv), [n, 3, self.n_heads, self.d_k]), axis=1)
        key_cache = write_position(key_cache, k, position)  # (N, H, d_k) each
        value_cache = write_position(value_cache, v, position)
        weights = masked_softmax(_scores(q[:, :, None], key_cache, self.d_k), mask)  # (N, H, 1, C)
        context = tf.matmul(tf.cast(weights, value_cache.dtype), value_cache)  # (N, H, 1, d_k)
        context = tf.reshape(context, [n, 1, self.n_heads * self.d_k])
        return dense(context, *output), key_cache, value_cache

    def get_config(self) -> dict:
        return {**super().get_config(), "d_model": self.d_model, "n_heads": self.n_heads,
                "dropout": self.rate, "head_dim": self.head_dim}
