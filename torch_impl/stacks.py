"""The encoder and decoder stacks: ``n`` layers and, when the config says so, a final layer norm."""
from __future__ import annotations

import torch
from torch import nn

from shared import TransformerConfig

from .cache import (NO_WEIGHTS, DecoderCache, EncoderWeights, LayerCache, StepWeights, fold_buffers,
                    folds_source, prepare_mask, projection)
from .layers import DecoderLayer, EncoderLayer, Trace, record
from .norm import LayerNorm


def _final_norm(config: TransformerConfig) -> LayerNorm | None:
    if not config.final_norm:
        return None
    return LayerNorm(config.d_model, config.norm_style, config.norm_eps, getattr(torch, config.dtype))


class Encoder(nn.Module):
    """``layers`` (a ModuleList of `EncoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, S, d)`` (embedded source), src_mask bool (True = may attend) broadcastable to
    ``(B, H, S, S)`` -> memory ``(B, S, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(EncoderLayer(config) for _ in range(config.n_encoder_layers))
        self.final_norm = _final_norm(config)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, src_mask, trace, f"encoder.layers.{i}")
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "encoder.final_norm", x)
        return x

    def infer(self, x: torch.Tensor, mask: torch.Tensor, weights: list[EncoderWeights],
              dtype: torch.dtype) -> torch.Tensor:
        """`forward` in inference (a decode's encoder pass, the forward pass without gradients):
        every layer's `EncoderLayer.infer` with its ``weights`` (`infer_weights`, laid out), the
        mask made ready once for all layers in ``dtype``, the products' (a half precision's where
        the weights are half, as attention's query, key and value then are). Same shapes, same
        values to rounding."""
        mask, keep = prepare_mask(mask, dtype)
        for layer, layer_weights in zip(self.layers, weights):
            x = layer.infer(x, mask, keep, layer_weights)
        return x if self.final_norm is None else self.final_norm(x)

    def infer_weights(self) -> list[EncoderWeights]:
        """Every layer's weights as `infer` reads them (`torch_impl.cache.EncoderWeights`)."""
        return [layer.infer_weights() for layer in self.layers]


class Decoder(nn.Module):
    """``layers`` (a ModuleList of `DecoderLayer`) then the optional ``final_norm``.

    Shape: x ``(B, T, d)`` (embedded target), memory ``(B, S, d)``, src_mask broadcastable to
    ``(B, H, T, S)``, tgt_mask to ``(B, H, T, T)`` (bool, True = may attend) -> ``(B, T, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.layers = nn.ModuleList(DecoderLayer(config) for _ in range(config.n_decoder_layers))
        self.final_norm = _final_norm(config)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor, trace: Trace | None = None) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x, memory, src_mask, tgt_mask, trace, f"decoder.layers.{i}")
        if self.final_norm is not None:
            x = self.final_norm(x)
            record(trace, "decoder.final_norm", x)
        return x

    def init_cache(self, memory: torch.Tensor, src_mask: torch.Tensor, capacity: int, beams: int,
                   weights: list[StepWeights] | None,
                   generator: tuple[torch.Tensor, torch.Tensor] | None) -> DecoderCache:
        """An empty cache for ``capacity`` positions: cross-attention keys/values of ``memory``
        computed once and kept once per item, not per beam (`DecoderCache`), and for one item's
        short source on the CPU each layer's cross-attention folded into it (`folds_source`,
        `torch_impl.cache.CrossFold`); the source mask prepared once; ``weights``
        (`step_weights`) and ``generator`` (kernel (d, V), bias) kept for the steps (None: a model
        not as built, whose steps call the modules: `torch_impl.cache._as_built`; the cache then
        holds `torch_impl.cache.NO_WEIGHTS`).

        Shape: memory ``(B, S, d)``, src_mask ``(B|1, 1|H, 1, S)`` -> a cache of ``N = B * beams`` rows.
        """
        n = memory.shape[0] * beams
        layers = []
        for layer, layer_weights in zip(self.layers, weights or [NO_WEIGHTS] * len(self.layers)):
            attn = layer.self_attn
            kv = projection(layer_weights, "cross_kv")  # None: the layers' own
            k, v = layer.cross_attn.keys_values(memory, kv)  # (B, H, S, d_k), once per source
            # keys and values (2, N, H, capacity, d_k) in the keys' dtype: the model's, or half
            # under autocast
            empty = k.new_zeros(2, n, attn.n_heads, capacity, attn.d_k)
            layers.append(LayerCache(empty, k, v, layer_weights,
                                     layer._step_norms() if layer_weights else NO_WEIGHTS))
        # once per source, not per layer and step; src_keep in the dtype of the context it scales
        mask, keep = prepare_mask(src_mask, layers[0].cross_key.dtype if layers else memory.dtype)
        if weights and folds_source(*memory.shape, layers[0].cross_key.shape[3], memory.device,
                                    layers[0].cross_key.dtype, self.layers[0].cross_attn.query.weight.dtype):
            _, heads, length, _ = layers[0].cross_key.shape
            outs = fold_buffers(len(layers), memory.shape[2], heads, length, layers[0].cross_key.dtype,
                                memory.device)
            for layer, c, out in zip(self.layers, layers, outs):  # one item's short source (`CrossFold`)
                c.cross_fold = layer.cross_attn.fold_source(c.cross_key, c.cross_value, mask, keep, out)
        return DecoderCache(layers, mask, keep, generator or NO_WEIGHTS, 0)

    def infer(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
              tgt_mask: torch.Tensor, weights: list[StepWeights], dtype: torch.dtype) -> torch.Tensor:
        """`forward` in inference (the forward pass without gradients): every layer's
        `DecoderLayer.infer` with its ``weights`` (`step_weights`, laid out), both masks made ready
        once for all layers in ``dtype``, the products' (as `Encoder.infer`). Same shapes, same
        values to rounding."""
        src_mask, src_keep = prepare_mask(src_mask, dtype)
        tgt_mask, tgt_keep = prepare_mask(tgt_mask, dtype)
        for layer, layer_weights in zip(self.layers, weights):
            x = layer.infer(x, memory, src_mask, src_keep, tgt_mask, tgt_keep, layer_weights)
        return x if self.final_norm is None else self.final_norm(x)

    def step_weights(self) -> list[StepWeights]:
        """Every layer's weights as a decoding step and `infer` read them
        (`torch_impl.cache.StepWeights`)."""
        return [layer.step_weights() for layer in self.layers]

    def step(self, x: torch.Tensor, cache: DecoderCache) -> tuple[torch.Tensor, DecoderCache]:
        """`forward` for the target position ``cache.length`` only, reading and filling ``cache``.
        Shape: x ``(N, d)`` embedded tokens, one row each (`DecoderLayer.step`) -> ``((N, d), the
        cache with every layer's self-attention keys/values written and ``length`` advanced)``
        (in place, and returned)."""
        layers = []
        for layer, layer_cache in zip(self.layers, cache.layers):
            x, layer_cache = layer.step(x, layer_cache, cache.length, cache.src_mask, cache.src_keep)
            layers.append(layer_cache)
        if self.final_norm is not None:
            x = self.final_norm(x)
        return x, cache.advanced(layers)
