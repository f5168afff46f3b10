"""The float64 NumPy reference: the oracle every backend is compared with.

Written for clarity, not speed: each function is the formula of docs/design.md (the conventions),
computed in float64 whatever ``config.dtype`` says. ``forward(..., return_trace=True)`` also returns
a dict of named intermediates in computation order; those names are the contract the backends match:

    encoder.embed                          (B, S, d)   embeddings * sqrt(d_model) + PE (the scale
                                                       only with config.embed_scale; PE the fixed
                                                       table or the learned positions)
    encoder.layers.{i}.self_attn_norm      (B, S, d)   output of that layer norm
    encoder.layers.{i}.self_attn.weights   (B, H, S, S) attention weights per head
    encoder.layers.{i}.self_attn.output    (B, S, d)   attention sublayer output (before residual)
    encoder.layers.{i}.self_attn.residual  (B, S, d)   the stream after the sublayer connection
    encoder.layers.{i}.ffn_norm, .ffn.output, .ffn.residual
    encoder.final_norm                     (B, S, d)   if config.final_norm
    encoder.output                         (B, S, d)   the memory
    decoder.embed, decoder.layers.{i}.{self_attn_norm, self_attn.*, cross_attn_norm,
        cross_attn.* (weights (B, H, T, S)), ffn_norm, ffn.*}, decoder.final_norm, decoder.output
    logits                                 (B, T, tgt_vocab)

In pre-norm the ``*_norm`` entries are the normalised sublayer inputs; in post-norm they are the
normalised sums and equal the ``residual`` entries.

Masks are boolean, ``True`` = may attend, broadcastable to ``(B, H, q_len, k_len)``; see
`shared.masks`. A masked key gets exactly zero weight; a query with no allowed key gets all-zero
weights and a zero attention output.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from . import decoding as _decoding
from .checks import checked_ids, checked_inputs, checked_mask
from .config import TransformerConfig
from .decoding import BeamResult, GreedyResult
from .masks import make_src_mask, make_tgt_mask, padding_id, start_is_pad
from .messages import type_shown
from .positional import positional_table
from .weights import check_weights, tgt_embedding_name, tgt_positions_name

Weights = Mapping[str, np.ndarray]
Trace = dict[str, np.ndarray]


# -- building blocks ------------------------------------------------------------------------------
def layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, style: str, eps: float) -> np.ndarray:
    """Normalise the last axis. ``standard``: biased variance inside the sqrt with eps;
    ``annotated``: unbiased std, eps added to the std (the Annotated Transformer's LayerNorm)."""
    mean = x.mean(axis=-1, keepdims=True)
    centered = x - mean
    if style == "standard":
        normed = centered / np.sqrt((centered**2).mean(axis=-1, keepdims=True) + eps)
    else:
        normed = centered / (x.std(axis=-1, ddof=1, keepdims=True) + eps)
    return normed * gamma + beta


def masked_softmax(scores: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Softmax over the last axis where ``mask`` is True; masked entries get exactly 0 and a row
    with no allowed entry is all zeros (not NaN, not uniform)."""
    scores = np.where(mask, scores, -np.inf)
    row_max = scores.max(axis=-1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)  # all-masked row: avoid inf - inf
    exp = np.where(mask, np.exp(scores - row_max), 0.0)
    total = exp.sum(axis=-1, keepdims=True)
    return exp / np.where(total > 0, total, 1.0)


def dense(x: np.ndarray, w: Weights, prefix: str) -> np.ndarray:
    return x @ w[f"{prefix}.kernel"] + w[f"{prefix}.bias"]


def attention(query_in: np.ndarray, memory: np.ndarray, mask: np.ndarray, w: Weights, prefix: str,
              n_heads: int, head_dim: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Multi-head scaled dot-product attention, heads of width ``d_k = head_dim or d // n_heads``.

    query_in (B, Q, d), memory (B, K, d), mask broadcastable to (B, H, Q, K).
    Returns the output (B, Q, d) and the weights (B, H, Q, K).
    """
    batch, q_len, d = query_in.shape
    d_k = head_dim if head_dim is not None else d // n_heads

    def heads(x: np.ndarray) -> np.ndarray:  # (B, L, d) -> (B, H, L, d_k)
        return x.reshape(batch, x.shape[1], n_heads, d_k).transpose(0, 2, 1, 3)

    q = heads(dense(query_in, w, f"{prefix}.query"))
    k = heads(dense(memory, w, f"{prefix}.key"))
    v = heads(dense(memory, w, f"{prefix}.value"))
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d_k)  # (B, H, Q, K)
    weights = masked_softmax(scores, mask)
    context = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, q_len, n_heads * d_k)  # (B, Q, H*d_k)
    return dense(context, w, f"{prefix}.output"), weights


_erf = np.vectorize(math.erf, otypes=[np.float64])  # exact erf in float64 (no SciPy dependency)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow for large negative x."""
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


ACTIVATIONS = {
    "relu": lambda x: np.maximum(x, 0.0),
    "gelu": lambda x: 0.5 * x * (1.0 + _erf(x / np.sqrt(2.0))),  # exact GELU, not the tanh one
    "swish": lambda x: x * _sigmoid(x),  # = SiLU
}


def feed_forward(x: np.ndarray, w: Weights, prefix: str, activation: str = "relu") -> np.ndarray:
    """Linear, activation (``config.activation``), linear: (B, L, d) -> (B, L, d)."""
    return dense(ACTIVATIONS[activation](dense(x, w, f"{prefix}.inner")), w, f"{prefix}.outer")


def embed(ids: np.ndarray, table: np.ndarray, pe: np.ndarray, scale: bool = True) -> np.ndarray:
    """Token embedding, scaled by sqrt(d_model) when ``scale``, plus the positional table ``pe``
    (fixed or learned, ``(max_len, d)``): (B, L) -> (B, L, d)."""
    vectors = table[ids] * np.sqrt(table.shape[1]) if scale else table[ids]
    return vectors + pe[: ids.shape[1]]


# -- the model ------------------------------------------------------------------------------------
class Model:
    """The reference model: weights checked once and cast to float64 once, plus the config.

    ``Model(weights, config)`` is what `greedy_decode` and `beam_search` take, so the weights are
    checked and cast once per model, not once per decoding step."""

    def __init__(self, weights: Weights, config: TransformerConfig):
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config: expected a TransformerConfig, got {type(config).__name__}")
        checked = check_weights(config, weights)  # each tensor read once: use the copies
        self.config = config
        self.w = {name: np.asarray(value, dtype=np.float64) for name, value in checked.items()}
        self.pe = positional_table(config) if config.positional == "sinusoidal" else None

    def positions(self, name: str | None) -> np.ndarray:
        """The positional table ``(max_len, d)``: the fixed one, or the learned weight ``name``."""
        return self.pe if name is None else self.w[name]

    def attention(self, query_in, memory, mask, prefix):
        c = self.config
        return attention(query_in, memory, mask, self.w, prefix, c.n_heads, c.head_dim)

    def feed_forward(self, x, prefix):
        return feed_forward(x, self.w, prefix, self.config.activation), None

    def norm(self, x: np.ndarray, prefix: str) -> np.ndarray:
        c = self.config
        return layer_norm(x, self.w[f"{prefix}.gamma"], self.w[f"{prefix}.beta"], c.norm_style, c.norm_eps)

    def sublayer(self, x: np.ndarray, name: str, fn, trace: Trace | None) -> np.ndarray:
        """One residual sublayer. ``fn`` maps the (normalised) input to (output, attn weights or None)."""
        def record(key: str, value: np.ndarray) -> None:
            if trace is not None:
                trace[key] = value

        if self.config.norm_first:  # x + sublayer(norm(x))
            normed = self.norm(x, f"{name}_norm")
            record(f"{name}_norm", normed)
            out, attn = fn(normed)
        else:  # norm(x + sublayer(x))
            out, attn = fn(x)
        if attn is not None:
            record(f"{name}.weights", attn)
        record(f"{name}.output", out)
        if self.config.norm_first:
            result = x + out
        else:
            result = self.norm(x + out, f"{name}_norm")
            record(f"{name}_norm", result)
        record(f"{name}.residual", result)
        return result

    def encode(self, src: np.ndarray, src_mask: np.ndarray, trace: Trace | None) -> np.ndarray:
        c, w = self.config, self.w
        learned = "src_embed.positions" if c.positional == "learned" else None
        x = embed(src, w["src_embed.embeddings"], self.positions(learned), c.embed_scale)
        if trace is not None:
            trace["encoder.embed"] = x
        for i in range(c.n_encoder_layers):
            p = f"encoder.layers.{i}"
            x = self.sublayer(x, f"{p}.self_attn",
                              lambda h: self.attention(h, h, src_mask, f"{p}.self_attn"), trace)
            x = self.sublayer(x, f"{p}.ffn", lambda h: self.feed_forward(h, f"{p}.ffn"), trace)
        if c.final_norm:
            x = self.norm(x, "encoder.final_norm")
            if trace is not None:
                trace["encoder.final_norm"] = x
        if trace is not None:
            trace["encoder.output"] = x
        return x

    def decode(self, tgt: np.ndarray, memory: np.ndarray, src_mask: np.ndarray, tgt_mask: np.ndarray,
               trace: Trace | None) -> np.ndarray:
        c, w = self.config, self.w
        x = embed(tgt, w[tgt_embedding_name(c)], self.positions(tgt_positions_name(c)), c.embed_scale)
        if trace is not None:
            trace["decoder.embed"] = x
        for i in range(c.n_decoder_layers):
            p = f"decoder.layers.{i}"
            x = self.sublayer(x, f"{p}.self_attn",
                              lambda h: self.attention(h, h, tgt_mask, f"{p}.self_attn"), trace)
            x = self.sublayer(x, f"{p}.cross_attn",
                              lambda h: self.attention(h, memory, src_mask, f"{p}.cross_attn"), trace)
            x = self.sublayer(x, f"{p}.ffn", lambda h: self.feed_forward(h, f"{p}.ffn"), trace)
        if c.final_norm:
            x = self.norm(x, "decoder.final_norm")
            if trace is not None:
                trace["decoder.final_norm"] = x
        if trace is not None:
            trace["decoder.output"] = x
        return x

    def project(self, x: np.ndarray) -> np.ndarray:
        """Generator: (B, T, d) -> logits (B, T, tgt_vocab); the tied kernel is the embedding table."""
        w = self.w
        kernel = w[tgt_embedding_name(self.config)].T if self.config.tie_output else w["generator.kernel"]
        return x @ kernel + w["generator.bias"]


def trace_names(config: TransformerConfig) -> list[str]:
    """The names ``forward(..., return_trace=True)`` returns for ``config``, in computation order."""
    def sublayer(name: str, attn: bool) -> list[str]:
        inner = ([f"{name}.weights"] if attn else []) + [f"{name}.output"]
        norm = [f"{name}_norm"]
        return (norm + inner if config.norm_first else inner + norm) + [f"{name}.residual"]

    names = ["encoder.embed"]
    for i in range(config.n_encoder_layers):
        p = f"encoder.layers.{i}"
        names += sublayer(f"{p}.self_attn", True) + sublayer(f"{p}.ffn", False)
    names += ["encoder.final_norm"] * bool(config.final_norm) + ["encoder.output", "decoder.embed"]
    for i in range(config.n_decoder_layers):
        p = f"decoder.layers.{i}"
        names += (sublayer(f"{p}.self_attn", True) + sublayer(f"{p}.cross_attn", True)
                  + sublayer(f"{p}.ffn", False))
    names += ["decoder.final_norm"] * bool(config.final_norm) + ["decoder.output", "logits"]
    return names


# -- input checks ---------------------------------------------------------------------------------
def _check_or_make_mask(name: str, mask, default: np.ndarray, config: TransformerConfig,
                        batch: int, q_len: int, k_len: int) -> np.ndarray:
    if mask is None:
        return default
    return checked_mask(name, mask, config, batch, q_len, k_len)


# -- public API -----------------------------------------------------------------------------------
def encode(weights: Weights, config: TransformerConfig, src, src_mask=None,
           trace: Trace | None = None) -> np.ndarray:
    """Encoder: src ids (B, S) -> memory (B, S, d_model), float64.

    ``src_mask`` (bool, True = may attend) broadcastable to (B, H, 1|S, S); derived from ``pad_id``
    when omitted. Pass a dict as ``trace`` to collect the encoder's intermediates.
    """
    model = Model(weights, config)
    src = checked_ids("src", src, config.src_vocab, config.max_len)
    b, s = src.shape
    src_mask = _check_or_make_mask("src_mask", src_mask, make_src_mask(src, padding_id(config)), config, b, 1, s)
    return model.encode(src, src_mask, trace)


def forward(weights: Weights, config: TransformerConfig, src, tgt, src_mask=None, tgt_mask=None,
            return_trace: bool = False):
    """The whole model: logits (B, T, tgt_vocab), float64 (and the trace when ``return_trace``).

    Args:
        weights: canonical weights (`shared.weights` schema) in ``config.dtype``.
        src: source ids (B, S); tgt: target input ids (B, T), integers inside their vocabularies,
            at most ``config.max_len`` long.
        src_mask: bool, True = may attend, broadcastable to (B, H, 1|S, S) for encoder self-attention
            and (B, H, 1|T, S) for cross-attention, so give it a query axis of 1; default ``src != pad_id``.
        tgt_mask: bool, broadcastable to (B, H, T, T); default padding AND subsequent (column 0
            never padding when the decoder starts from pad: `shared.masks.make_tgt_mask`).
    """
    model = Model(weights, config)
    src, tgt, src_mask, tgt_mask = checked_inputs(config, src, tgt, src_mask, tgt_mask)
    if src_mask is None:
        src_mask = make_src_mask(src, padding_id(config))
    if tgt_mask is None:
        tgt_mask = make_tgt_mask(tgt, padding_id(config), start_is_pad(config))
    trace: Trace | None = {} if return_trace else None
    memory = model.encode(src, src_mask, trace)
    hidden = model.decode(tgt, memory, src_mask, tgt_mask, trace)
    logits = model.project(hidden)
    if trace is None:
        return logits
    trace["logits"] = logits
    return logits, trace


# -- decoding -------------------------------------------------------------------------------------
# The search itself is `shared.decoding` (framework-free, one spec for every backend); here it is
# driven by the reference model.

def _decode_inputs(model, src, max_len, src_mask, beam_size=_decoding.GREEDY, length_penalty=0.0, **flags):
    """Checks in the order `shared.decoding` fixes: model, src, search arguments, flags, then the
    mask."""
    if not isinstance(model, Model):
        raise TypeError(f"model: expected a shared.reference.Model (Model(weights, config)), "
                        f"got {type_shown(model)}")
    config = model.config
    src = checked_ids("src", src, config.src_vocab, config.max_len)
    _decoding.check_search_args(config, max_len, beam_size, length_penalty)
    _decoding.check_flags(**flags)
    b, s = src.shape
    src_mask = _check_or_make_mask("src_mask", src_mask, make_src_mask(src, padding_id(config)), config,
                                   b, 1, s)
    return src, src_mask


def _step_function(model: Model, src: np.ndarray, src_mask: np.ndarray, beams: int) -> _decoding.Step:
    """Encode the source once; each step runs the whole decoder on the prefix (no cache in the
    oracle: a `shared.decoding.stateless_step`) and returns the float64 logits of the last
    position, (B*beams, V); the search takes the log-softmax (`shared.decoding`)."""
    config = model.config
    memory = np.repeat(model.encode(src, src_mask, None), beams, axis=0)  # (B*K, S, d), row b*K + k
    if src_mask.shape[0] > 1:
        src_mask = np.repeat(src_mask, beams, axis=0)  # (B*K, 1|H, 1, S)

    def logits(prefix: np.ndarray) -> np.ndarray:  # (B*K, t+1) -> (B*K, V)
        tgt_mask = make_tgt_mask(prefix, padding_id(config), start_is_pad(config))
        hidden = model.decode(prefix, memory, src_mask, tgt_mask, None)  # (B*K, t+1, d)
        return model.project(hidden[:, -1])

    return _decoding.stateless_step(logits, config.tgt_vocab, np.float64)


def greedy_decode(model: Model, src, max_len: int, src_mask=None) -> GreedyResult:
    """Greedy decoding with the float64 reference (algorithm: `shared.decoding`).

    Args:
        model: a `Model` (weights and config); the start (``config.start_id``: decoder_start_id or
            BOS), EOS and PAD ids come from its config.
        src: source ids (B, S), integers, padding allowed (an all-padding row decodes too).
        max_len: new tokens to generate at most, EOS included (1 <= max_len <= config.max_len).
        src_mask: bool, True = may attend, broadcastable to (B, H, 1, S); default ``src != pad_id``.

    Shape:
        tokens (B, max_len) int64 without BOS, pad after EOS; log_probs (B, max_len) float64, 0 after
        EOS; lengths (B,) generated tokens including EOS.
    """
    src, src_mask = _decode_inputs(model, src, max_len, src_mask)
    c = model.config
    step = _step_function(model, src, src_mask, 1)
    return _decoding.greedy_search(step, src.shape[0], max_len, c.start_id, c.eos_id, c.pad_id)


def beam_search(model: Model, src, max_len: int, beam_size: int = 4, length_penalty: float = 0.0,
                return_all: bool = False, src_mask=None) -> BeamResult:
    """Beam search with the float64 reference (algorithm: `shared.decoding`).

    Args:
        model, src, max_len, src_mask: as `greedy_decode`.
        beam_size: hypotheses kept per item, 1 <= beam_size <= tgt_vocab - 1 (pad is never generated).
        length_penalty: GNMT alpha >= 0; finished hypotheses score ``raw / ((5 + len) / 6) ** alpha``.
        return_all: also return the K best hypotheses (K alive and K finished are kept), best first.

    Shape:
        tokens (B, max_len), scores (B,) ranking scores, step_scores (B, max_len) per-token
        log-probs (0 after EOS), lengths (B,); with return_all all_tokens (B, K, max_len),
        all_scores (B, K), all_lengths (B, K).
    """
    src, src_mask = _decode_inputs(model, src, max_len, src_mask, beam_size, length_penalty,
                                   return_all=return_all)
    c = model.config
    step = _step_function(model, src, src_mask, beam_size)
    return _decoding.beam_search(step, src.shape[0], max_len, beam_size, c.start_id, c.eos_id, c.pad_id,
                                 length_penalty, return_all)
