"""Encoder and decoder layers, in either norm placement (docs/design.md, convention 7).

Pre-norm (``norm_first=True``, tensor2tensor and the Annotated Transformer) computes
``x + dropout(sublayer(norm(x)))``; post-norm (the paper) computes ``norm(x + dropout(sublayer(x)))``.
Pre-norm keeps an identity path through the whole stack, which is why it trains without warm-up
tricks at depth; the paper's post-norm is kept for fidelity and for weights trained that way.

When a ``trace`` dict is given, each layer records its intermediates under the names of
`shared.reference` (``{prefix}.self_attn_norm``, ``{prefix}.self_attn.weights`` ...), and attention
takes its explicit path so that the weights exist.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from shared import TransformerConfig
from shared.checks import check_position

from .attention import MultiHeadAttention, _attend_filled, _attend_folded, _attend_source, _write_position
from .cache import EncoderWeights, LayerCache, StepWeights, dense, projection
from .feed_forward import FeedForward, _relu
from .norm import LayerNorm, _normalize

Trace = dict[str, torch.Tensor]
Sublayer = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor | None]]


def record(trace: Trace | None, name: str, value: torch.Tensor) -> None:
    if trace is not None:
        trace[name] = value


def sublayer_connection(x: torch.Tensor, sublayer: Sublayer, norm: LayerNorm, dropout: nn.Dropout | None,
                        norm_first: bool, trace: Trace | None, name: str) -> torch.Tensor:
    """One residual sublayer; ``sublayer`` maps its input to ``(output, attention weights or None)``.
    ``dropout`` None: none (a decoding step, where no module call is spent on an inactive one)."""
    if norm_first:
        normed = norm(x)
        record(trace, f"{name}_norm", normed)
        out, weights = sublayer(normed)
    else:
        out, weights = sublayer(x)
    if weights is not None:
        record(trace, f"{name}.weights", weights)
    record(trace, f"{name}.output", out)
    if dropout is not None:
        out = dropout(out)
    if norm_first:
        result = x + out
    else:
        result = norm(x + out)
        record(trace, f"{name}_norm", result)
    record(trace, f"{name}.residual", result)
    return result


def norm_layer(config: TransformerConfig) -> LayerNorm:
    """A layer norm of the config's style, eps and dtype (docs/design.md, convention 6)."""
    return LayerNorm(config.d_model, config.norm_style, config.norm_eps, getattr(torch, config.dtype))


class EncoderLayer(nn.Module):
    """Self-attention then feed-forward, each in a residual connection.

    Shape: x ``(B, S, d)``, src_mask bool (True = may attend) broadcastable to ``(B, H, S, S)`` ->
    ``(B, S, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        dtype = getattr(torch, config.dtype)
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout,
                                           config.head_dim, dtype=dtype)
        self.self_attn_norm = norm_layer(config)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation, dtype=dtype)
        self.ffn_norm = norm_layer(config)
        self.dropout = nn.Dropout(config.dropout)

    def forward(self, x: torch.Tensor, src_mask: torch.Tensor, trace: Trace | None = None,
                prefix: str = "encoder.layer") -> torch.Tensor:
        want = trace is not None
        x = sublayer_connection(x, lambda h: self.self_attn(h, h, src_mask, want), self.self_attn_norm,
                                self.dropout, self.norm_first, trace, f"{prefix}.self_attn")
        return sublayer_connection(x, lambda h: (self.ffn(h), None), self.ffn_norm,
                                   self.dropout, self.norm_first, trace, f"{prefix}.ffn")

    def infer(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor,
              weights: EncoderWeights) -> torch.Tensor:
        """`forward` in inference, as decoding's encoder pass runs it: the kernels of
        `infer_weights` (in a `torch_impl.cache.lay_out` layout), the query, key and value from one
        product, no dropout, no module calls but the norms. Same values to rounding.

        Shape: x ``(B, S, d)``, mask and keep from `torch_impl.cache.prepare_mask` -> ``(B, S, d)``.
        """
        w = weights

        def self_attn(h: torch.Tensor):
            return self.self_attn.self_attend_prepared(h, mask, keep, projection(w, "qkv"),
                                                     projection(w, "output")), None

        def ffn(h: torch.Tensor):
            return self.ffn.step(h, projection(w, "inner"), projection(w, "outer")), None

        x = sublayer_connection(x, self_attn, self.self_attn_norm, None, self.norm_first, None,
                                "self_attn")
        return sublayer_connection(x, ffn, self.ffn_norm, None, self.norm_first, None, "ffn")

    def infer_weights(self) -> EncoderWeights:
        """This layer's weights as `infer` reads them (`torch_impl.cache.EncoderWeights`), ``(in,
        out)`` copies detached from autograd."""
        qkv, qkv_bias, _, _, _, _, out, out_bias = self.self_attn.step_kernels()
        return EncoderWeights(qkv, qkv_bias, out, out_bias, *self.ffn.step_kernels())


class DecoderLayer(nn.Module):
    """Masked self-attention, cross-attention over the encoder memory, then feed-forward.

    Shape: x ``(B, T, d)``, memory ``(B, S, d)``, src_mask broadcastable to ``(B, H, T, S)``,
    tgt_mask broadcastable to ``(B, H, T, T)`` (bool, True = may attend) -> ``(B, T, d)``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        dtype = getattr(torch, config.dtype)
        self.norm_first = config.norm_first
        self.self_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout,
                                           config.head_dim, dtype=dtype)
        self.self_attn_norm = norm_layer(config)
        self.cross_attn = MultiHeadAttention(config.d_model, config.n_heads, config.dropout,
                                           config.head_dim, dtype=dtype)
        self.cross_attn_norm = norm_layer(config)
        self.ffn = FeedForward(config.d_model, config.d_ff, config.dropout, config.activation, dtype=dtype)
        self.ffn_norm = norm_layer(config)
        self.dropout = nn.Dropout(config.dropout)
        # What `step` reads besides the cache, in one tuple (see there): pre-norm, the standard
        # norm style, eps, and the activation (None: the rectifier, inside the inner product).
        self._step_settings = (config.norm_first, config.norm_style == "standard", float(config.norm_eps),
                               None if self.ffn.activation is _relu else self.ffn.activation)

    def forward(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor, trace: Trace | None = None,
                prefix: str = "decoder.layer") -> torch.Tensor:
        want = trace is not None
        x = sublayer_connection(x, lambda h: self.self_attn(h, h, tgt_mask, want), self.self_attn_norm,
                                self.dropout, self.norm_first, trace, f"{prefix}.self_attn")
        x = sublayer_connection(x, lambda h: self.cross_attn(h, memory, src_mask, want),
                                self.cross_attn_norm, self.dropout, self.norm_first, trace,
                                f"{prefix}.cross_attn")
        return sublayer_connection(x, lambda h: (self.ffn(h), None), self.ffn_norm,
                                   self.dropout, self.norm_first, trace, f"{prefix}.ffn")

    def infer(self, x: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
              src_keep: torch.Tensor | None, tgt_mask: torch.Tensor, tgt_keep: torch.Tensor | None,
              weights: StepWeights) -> torch.Tensor:
        """`forward` in inference (no gradients, no dropout, no trace): the kernels of
        `step_weights` (in a `torch_impl.cache.lay_out` layout, half in a half precision), the
        query, key and value from one product, the cross-attention's key and value from another,
        no module calls but the norms. Same values to rounding.

        Shape: x ``(B, T, d)``, memory ``(B, S, d)``; each mask and keep from
        `torch_impl.cache.prepare_mask` (additive, made once for every layer), src_mask
        broadcastable to ``(B, H, T, S)``, tgt_mask to ``(B, H, T, T)`` -> ``(B, T, d)``.
        """
        w = weights
        k, v = self.cross_attn.keys_values(memory, projection(w, "cross_kv"))  # (B, H, S, d_k)

        def self_attn(h: torch.Tensor):
            return self.self_attn.self_attend_prepared(h, tgt_mask, tgt_keep, projection(w, "qkv"),
                                                     projection(w, "self_output")), None

        def cross_attn(h: torch.Tensor):
            return self.cross_attn.attend_prepared(h, k, v, src_mask, src_keep, projection(w, "cross_query"),
                                                 projection(w, "cross_output")), None

        def ffn(h: torch.Tensor):
            return self.ffn.step(h, projection(w, "inner"), projection(w, "outer")), None

        x = sublayer_connection(x, self_attn, self.self_attn_norm, None, self.norm_first, None,
                                "self_attn")
        x = sublayer_connection(x, cross_attn, self.cross_attn_norm, None, self.norm_first, None,
                                "cross_attn")
        return sublayer_connection(x, ffn, self.ffn_norm, None, self.norm_first, None, "ffn")

    def step(self, x: torch.Tensor, cache: LayerCache, position: int, src_mask: torch.Tensor,
             src_keep: torch.Tensor | None, self_mask: torch.Tensor | None = None
             ) -> tuple[torch.Tensor, LayerCache]:
        """`forward` for one new target position, with cached keys and values (inference only: no
        dropout): self-attention writes its key/value at ``position`` and attends to positions
        ``0 .. position`` (see `MultiHeadAttention.extend`, with the cache's fused projection);
        cross-attention uses the cached source keys/values and the prepared mask, or where the
        cache folded it into the source (`torch_impl.cache.CrossFold`), two products over it.

        Shape: x ``(N, d)``, the new position's rows (the step's products read rows: a ``(N, 1,
        d)`` axis would be a view a layer to make and undo); the cache's cross keys, src_mask and
        src_keep (`torch_impl.cache.prepare_mask`) of ``B`` items, ``N = B * beams`` -> ``((N,
        d), the layer's cache with its self-attention keys/values updated)`` (in place, and
        returned).
        With ``position`` a 0-d tensor (a CUDA graph's step), ``self_mask`` is its
        `torch_impl.cache.filled_mask`, made once for every layer. A cache without weights
        (`torch_impl.cache.NO_WEIGHTS`, a model not as built) has the step call the modules.
        """
        if not cache.weights:  # a model not as built: the modules are called, as in `forward`
            return self._step_modules(x, cache, position, src_mask, src_keep)
        # Where the cache keeps the weights, the step reads them and the norms' from the cache and
        # its settings from one tuple, and calls no module: at a few rows a step streams its
        # kernels from memory, which evicts the interpreter's own objects, so every attribute a
        # step reads between two products costs a cache miss, and a module call reads over a dozen
        # (docs/performance.md, "A step's Python").
        w, ((g1, b1), (g2, b2), (g3, b3)) = cache.weights, cache.norms
        pre, standard, eps, activation = self._step_settings
        n, heads, capacity, d_k = cache.self_key.shape
        if type(position) is not int or not 0 <= position < capacity or self_mask is not None:  # at a step's speed
            if not isinstance(position, torch.Tensor):
                check_position(position, capacity, self_mask)
        width = heads * d_k
        h = _normalize(x, g1, b1, standard, eps) if pre else x
        qkv = dense(h, w.qkv_kernel, w.qkv_bias).view(n, 3, heads, 1, d_k).transpose(0, 1)  # (3, N, H, 1, d_k)
        _write_position(cache.self_keys_values, qkv[1:], position)  # the key and value in one write
        context = _attend_filled(qkv[0], cache.self_key, cache.self_value, position, self_mask)
        out = dense(context.reshape(n, width), w.self_output_kernel, w.self_output_bias)
        x = x + out if pre else _normalize(x + out, g1, b1, standard, eps)
        h = _normalize(x, g2, b2, standard, eps) if pre else x
        if cache.cross_fold is not None:  # one item's short source, folded (`torch_impl.cache.CrossFold`)
            out = _attend_folded(h, cache.cross_fold)
        else:
            q = dense(h, w.cross_query_kernel, w.cross_query_bias)  # (N, H * d_k)
            context = _attend_source(q, cache.cross_key, cache.cross_value, src_mask, src_keep)
            out = dense(context, w.cross_output_kernel, w.cross_output_bias)
        x = x + out if pre else _normalize(x + out, g2, b2, standard, eps)
        h = _normalize(x, g3, b3, standard, eps) if pre else x
        if activation is None:  # the rectifier inside the product's kernel (`dense`)
            inner = dense(h, w.inner_kernel, w.inner_bias, relu=True)
        else:
            inner = activation(dense(h, w.inner_kernel, w.inner_bias))
        out = dense(inner, w.outer_kernel, w.outer_bias)
        x = x + out if pre else _normalize(x + out, g3, b3, standard, eps)
        return x, cache

    def _step_modules(self, x: torch.Tensor, cache: LayerCache, position: int, src_mask: torch.Tensor,
                      src_keep: torch.Tensor | None) -> tuple[torch.Tensor, LayerCache]:
        """`step` of a model not as built (`torch_impl.cache.NO_WEIGHTS`): every projection and
        norm is its module, called (hooks, replaced or wrapped modules run) on ``(N, 1, d)``, as
        `forward` calls them. Shape: x ``(N, d)`` -> ``(N, d)``, as `step`."""
        pre, self_norm, cross_norm, ffn_norm = (self.norm_first, self.self_attn_norm, self.cross_attn_norm,
                                                self.ffn_norm)
        x = x[:, None]  # (N, 1, d)
        out, key, value = self.self_attn.extend(self_norm(x) if pre else x, cache.self_key,
                                                cache.self_value, position)
        x = x + out if pre else self_norm(x + out)
        out = self.cross_attn.attend_prepared(cross_norm(x) if pre else x, cache.cross_key,
                                              cache.cross_value, src_mask, src_keep, None, None)
        x = x + out if pre else cross_norm(x + out)
        out = self.ffn.step(ffn_norm(x) if pre else x, None, None)
        x = x + out if pre else ffn_norm(x + out)
        return x[:, 0], cache.updated(key, value)

    def step_weights(self) -> StepWeights:
        """This layer's weights as `step` and `infer` read them (`torch_impl.cache.StepWeights`)."""
        qkv, qkv_bias, _, _, _, _, out, out_bias = self.self_attn.step_kernels()
        _, _, query, query_bias, kv, kv_bias, cross_out, cross_out_bias = self.cross_attn.step_kernels()
        return StepWeights(qkv, qkv_bias, out, out_bias, query, query_bias, kv, kv_bias, cross_out,
                           cross_out_bias, *self.ffn.step_kernels())

    def _step_norms(self) -> tuple[tuple[torch.Tensor, torch.Tensor], ...]:
        """``((gamma, beta) of the self-attention's norm, the cross-attention's, the
        feed-forward's)``, detached, as `step` reads them from its cache (`LayerCache.norms`)."""
        return tuple((norm.gamma.detach(), norm.beta.detach())
                     for norm in (self.self_attn_norm, self.cross_attn_norm, self.ffn_norm))
