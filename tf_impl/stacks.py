"""The encoder and decoder stacks: ``n`` layers and, when the config says so, a final layer norm."""
from __future__ import annotations

import tensorflow as tf

from shared import TransformerConfig

from .cache import (NO_WEIGHTS, DecoderCache, LayerCache, StepWeights, filled_mask, prepare_mask,
                    projection)
from .inputs import dims
from .layers import DecoderLayer, EncoderLayer, Trace, _TracingLayer, norm_layer, record
from .norm import LayerNorm


def _final_norm(config: TransformerConfig) -> LayerNorm | None:
    return norm_layer(config, "final_norm") if config.final_norm else None


class Encoder(_TracingLayer):
    """``layers`` (a list of `EncoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, S, d)`` (embedded source), src_mask bool (True = may attend) broadcastable to
    ``(B, H, S, S)`` -> memory ``(B, S, d)``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(config, **kwargs)
        self.layers = [EncoderLayer(config, name=f"layers_{i}") for i in range(config.n_encoder_layers)]
        self.final_norm = _final_norm(config)
        self.built = True

    def call(self, x: tf.Tensor, src_mask: tf.Tensor, trace: Trace | None = None,
             training: bool = False) -> tf.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, src_mask, trace=trace, prefix=f"encoder.layers.{i}", training=training)
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "encoder.final_norm", x)
        return x


class Decoder(_TracingLayer):
    """``layers`` (a list of `DecoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, T, d)`` (embedded target), memory ``(B, S, d)``, src_mask broadcastable to
    ``(B, H, T, S)``, tgt_mask to ``(B, H, T, T)`` (bool, True = may attend) -> ``(B, T, d)``.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        super().__init__(config, **kwargs)
        self.layers = [DecoderLayer(config, name=f"layers_{i}") for i in range(config.n_decoder_layers)]
        self.final_norm = _final_norm(config)
        self.built = True

    def call(self, x: tf.Tensor, memory: tf.Tensor, src_mask: tf.Tensor, tgt_mask: tf.Tensor,
             trace: Trace | None = None, training: bool = False) -> tf.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask, trace=trace, prefix=f"decoder.layers.{i}",
                      training=training)
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "decoder.final_norm", x)
        return x

    def init_cache(self, memory: tf.Tensor, src_mask: tf.Tensor, capacity: int, beams: int,
                   weights: list[StepWeights] | None,
                   generator: tuple[tf.Tensor, tf.Tensor] | None) -> DecoderCache:
        """An empty cache for ``capacity`` positions: cross-attention keys/values of ``memory``
        computed once and kept once per item, not per beam (`DecoderCache`); the source mask
        prepared once; ``weights`` (`step_weights`) and ``generator`` (kernel (d, V), bias) kept
        for the steps (None: a model not as built, whose steps call the layers:
        `tf_impl.cache._as_built`; the cache then holds `tf_impl.cache.NO_WEIGHTS`).

        Shape: memory ``(B, S, d)``, src_mask ``(B|1, 1|H, 1, S)`` -> a cache of ``N = B * beams`` rows.
        """
        n = dims(memory, 1)[0] * beams
        layers = []
        for layer, layer_weights in zip(self.layers, weights or [NO_WEIGHTS] * len(self.layers)):
            attn = layer.self_attn
            kv = projection(layer_weights, "cross_kv")  # None: the layers' own
            k, v = layer.cross_attn.keys_values(memory, kv)  # (B, H, S, d_k), once per source
            # (N, H, capacity, d_k) in the keys' dtype: the model's, or half under a mixed policy
            empty = tf.zeros([n, attn.n_heads, capacity, attn.d_k], k.dtype)
            layers.append(LayerCache(empty, empty, k, v, layer_weights))
        # once per source, not per layer and step; src_keep in the dtype of the context it scales
        mask, keep = prepare_mask(src_mask, layers[0].cross_key.dtype if layers else memory.dtype)
        return DecoderCache(tuple(layers), mask, keep, generator or NO_WEIGHTS, tf.constant(0, tf.int32))

    def step_weights(self) -> list[StepWeights]:
        """Every layer's weights as a decoding step reads them (`tf_impl.cache.StepWeights`)."""
        return [layer.step_weights() for layer in self.layers]

    def step(self, x: tf.Tensor, cache: DecoderCache) -> tuple[tf.Tensor, DecoderCache]:
        """`call` for the target position ``cache.length`` only, reading and filling ``cache``.
        Shape: x ``(N, 1, d)`` embedded token -> ``((N, 1, d), the cache with every layer's
        self-attention keys/values written and ``length`` advanced)`` (a new cache)."""
        layers = []
        self_mask = filled_mask(cache.capacity, cache.length) if cache.layers else None  # every layer's
        for layer, layer_cache in zip(self.layers, cache.layers):
            x, layer_cache = layer.step(x, layer_cache, cache.length, cache.src_mask, cache.src_keep,
                                        self_mask)
            layers.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, cache.advanced(layers)
