"""Encoder and decoder layers, in either norm placement (docs/design.md, convention 7).

Pre-norm (``norm_first=True``, tensor2tensor and the Annotated Transformer) computes
``x + dropout(sublayer(norm(x)))``; post-norm (the paper) computes ``norm(x + dropout(sublayer(x)))``.
Pre-norm keeps an identity path through the whole stack, which is why it trains without warm-up
tricks at depth; the paper's post-norm is kept for fidelity and for weights trained that way.

When a ``trace`` dict is given, each layer records its intermediates under the names of
`shared.reference` (``{prefix}.self_attn_norm``, ``{prefix}.self_attn.weights`` ...). Layers that
take a ``trace`` switch off Keras' conversion of call arguments: it rebuilds every dict argument,
so the layer would record into a copy (the model converts its inputs once, at the top).
"""
from __future__ import annotations

from typing import Callable

import keras
import tensorflow as tf

from shared import TransformerConfig

from .attention import MultiHeadAttention
from .cache import LayerCache, StepWeights, projection
from .feed_forward import FeedForward
from .norm import LayerNorm

Trace = dict[str, tf.Tensor]
Sublayer = Callable[[tf.Tensor], tuple[tf.Tensor, tf.Tensor | None]]


def record(trace: Trace | None, name: str, value: tf.Tensor) -> None:
    if trace is not None:
        trace[name] = value


def sublayer_connection(x: tf.Tensor, sublayer: Sublayer, norm: LayerNorm,
                        dropout: keras.layers.Dropout | None, norm_first: bool, trace: Trace | None,
                        name: str, training: bool) -> tf.Tensor:
    """One residual sublayer; ``sublayer`` maps its input to ``(output, attention weights or None)``.
    ``dropout`` None: none (a decoding step, where no layer call is spent on an inactive one).
    ``training`` is checked by the sublayers it is passed to first (`tf_impl.inputs.check_training`)."""
    if norm_first:
        normed = norm(x)
        record(trace, f"{name}_norm", normed)
        out, weights = sublayer(normed)
    else:
        out, weights = sublayer(x)
    if out.dtype != x.dtype:  # mixed precision: bfloat16 output, float32 residual stream (torch promotes)
        out = tf.cast(out, x.dtype)
    if weights is not None:
        record(trace, f"{name}.weights", weights)
    record(trace, f"{name}.output", out)
    if dropout is not None:
        out = dropout(out, training=training)
    if norm_first:
        result = x + out
    else:
        result = norm(x + out)
        record(trace, f"{name}_norm", result)
    record(trace, f"{name}.residual", result)
    return result


def norm_layer(config: TransformerConfig, name: str) -> LayerNorm:
    return LayerNorm(config.d_model, config.norm_style, config.norm_eps, dtype=config.dtype, name=name)


class _TracingLayer(keras.layers.Layer):
    """A layer built from a `TransformerConfig` whose call takes a ``trace`` dict (see module doc)."""

    def __init__(self, config: TransformerConfig, **kwargs):
        kwargs.setdefault("dtype", config.dtype)
        super().__init__(**kwargs)
        self.config = config
        self._convert_input_args = False  # keep `trace` the caller's dict (see the module docstring)

    def get_config(self) -> dict:
        return {**super().get_config(), "config": self.config.to_dict()}

    @classmethod
    def from_config(cls, config: dict):
        config = dict(config)
        return cls(TransformerConfig.from_dict(config.pop("config")), **config)


class EncoderLayer(_TracingLayer):
    """Self-attention then feed-forward, each in a residual connection.

    Shape: x ``(B, S, d)``, src_mask bool (True = may attend) broadcastable to ``(B, H, S, S)`` ->
    ``(B, S, d)``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(config, **kwargs)
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.head_dim, dtype=c.dtype,
                                            name="self_attn")
        self.self_attn_norm = norm_layer(c, "self_attn_norm")
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout, c.activation, dtype=c.dtype, name="ffn")
        self.ffn_norm = norm_layer(c, "ffn_norm")
        self.dropout = keras.layers.Dropout(c.dropout, dtype=c.dtype)
        self.built = True

    def call(self, x: tf.Tensor, src_mask: tf.Tensor, trace: Trace | None = None,
             prefix: str = "encoder.layer", training: bool = False) -> tf.Tensor:
        # src_mask, not Keras' "mask": an argument of that name is filled from the input's Keras
        # mask (an Embedding's mask_zero) when None, and `layer(x, None)` was "got multiple values"
        want = trace is not None
        x = sublayer_connection(
            x, lambda h: self.self_attn(h, h, src_mask, return_weights=want, training=training),
            self.self_attn_norm, self.dropout, self.norm_first, trace, f"{prefix}.self_attn", training)
        return sublayer_connection(
            x, lambda h: (self.ffn(h, training=training), None), self.ffn_norm, self.dropout,
            self.norm_first, trace, f"{prefix}.ffn", training)


class DecoderLayer(_TracingLayer):
    """Masked self-attention, cross-attention over the encoder memory, then feed-forward.

    Shape: x ``(B, T, d)``, memory ``(B, S, d)``, src_mask broadcastable to ``(B, H, T, S)``,
    tgt_mask broadcastable to ``(B, H, T, T)`` (bool, True = may attend) -> ``(B, T, d)``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(config, **kwargs)
        c = config
        self.norm_first = c.norm_first
        self.self_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.head_dim, dtype=c.dtype,
                                            name="self_attn")
        self.self_attn_norm = norm_layer(c, "self_attn_norm")
        self.cross_attn = MultiHeadAttention(c.d_model, c.n_heads, c.dropout, c.head_dim, dtype=c.dtype,
                                             name="cross_attn")
        self.cross_attn_norm = norm_layer(c, "cross_attn_norm")
        self.ffn = FeedForward(c.d_model, c.d_ff, c.dropout, c.activation, dtype=c.dtype, name="ffn")
        self.ffn_norm = norm_layer(c, "ffn_norm")
        self.dropout = keras.layers.Dropout(c.dropout, dtype=c.dtype)
        self.built = True

    def call(self, x: tf.Tensor, memory: tf.Tensor, src_mask: tf.Tensor, tgt_mask: tf.Tensor,
             trace: Trace | None = None, prefix: str = "decoder.layer", training: bool = False) -> tf.Tensor:
        want = trace is not None
        x = sublayer_connection(
            x, lambda h: self.self_attn(h, h, tgt_mask, return_weights=want, training=training),
            self.self_attn_norm, self.dropout, self.norm_first, trace, f"{prefix}.self_attn", training)
        x = sublayer_connection(
            x, lambda h: self.cross_attn(h, memory, src_mask, return_weights=want, training=training),
            self.cross_attn_norm, self.dropout, self.norm_first, trace, f"{prefix}.cross_attn", training)
        return sublayer_connection(
            x, lambda h: (self.ffn(h, training=training), None), self.ffn_norm, self.dropout,
            self.norm_first, trace, f"{prefix}.ffn", training)

    def step(self, x: tf.Tensor, cache: LayerCache, position: tf.Tensor, src_mask: tf.Tensor,
             src_keep: tf.Tensor, self_mask: tf.Tensor | None = None) -> tuple[tf.Tensor, LayerCache]:
        """`call` for one new target position, with cached keys and values (inference only: no
        dropout): self-attention writes its key/value at ``position`` and attends to positions
        ``0 .. position`` (see `MultiHeadAttention.extend`, with the cache's fused projection);
        cross-attention uses the cached source keys/values and the prepared mask.

        Shape: x ``(N, 1, d)``; the cache's cross keys, src_mask (bool) and src_keep
        (`tf_impl.cache.prepare_mask`) of ``B`` items, ``N = B * beams`` -> ``((N, 1, d), the
        layer's cache with its self-attention keys/values updated)``. ``self_mask``: the step's
        `tf_impl.cache.filled_mask`, made once for every layer (`Decoder.step`). A cache without
        weights (`tf_impl.cache.NO_WEIGHTS`, a model not as built) has the step call the layers.
        """
        kept, w = {}, cache.weights

        def self_attn(h: tf.Tensor):
            out, kept["key"], kept["value"] = self.self_attn.extend(
                h, cache.self_key, cache.self_value, position, projection(w, "qkv"),
                projection(w, "self_output"), self_mask)
            return out, None

        def cross_attn(h: tf.Tensor):
            return self.cross_attn.attend_prepared(h, cache.cross_key, cache.cross_value, src_mask,
                                                   src_keep, projection(w, "cross_query"),
                                                   projection(w, "cross_output")), None

        def ffn(h: tf.Tensor):
            return self.ffn.step(h, projection(w, "inner"), projection(w, "outer")), None

        x = sublayer_connection(x, self_attn, self.self_attn_norm, None, self.norm_first, None,
                                "self_attn", False)
        x = sublayer_connection(x, cross_attn, self.cross_attn_norm, None, self.norm_first, None,
                                "cross_attn", False)
        x = sublayer_connection(x, ffn, self.ffn_norm, None, self.norm_first, None, "ffn", False)
        return x, cache.updated(kept["key"], kept["value"])

    def step_weights(self) -> StepWeights:
        """This layer's weights as `step` reads them (`tf_impl.cache.StepWeights`)."""
        qkv, qkv_bias, _, _, _, _, out, out_bias = self.self_attn.step_kernels()
        _, _, query, query_bias, kv, kv_bias, cross_out, cross_out_bias = self.cross_attn.step_kernels()
        return StepWeights(qkv, qkv_bias, out, out_bias, query, query_bias, kv, kv_bias, cross_out,
                           cross_out_bias, *self.ffn.step_kernels())
