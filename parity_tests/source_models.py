"""PyTorch source models for the importer tests, written for this suite (not the originals' code).

* `Seq2SeqTransformer`: the layout of PyTorch's translation tutorial: a real ``nn.Transformer``,
  token embeddings scaled by sqrt(emb_size), an interleaved positional buffer ``(maxlen, 1, emb)``,
  a generator ``nn.Linear``.
* `make_annotated`: a model with the Annotated Transformer's module structure and parameter names
  (``EncoderDecoder``, ``MultiHeadedAttention.linears``, ``SublayerConnection``, ``LayerNorm.a_2/b_2``,
  ``PositionwiseFeedForward.w_1/w_2``, ``Embeddings.lut``, ``PositionalEncoding.pe``,
  ``Generator.proj``): pre-norm sublayers, unbiased-std LayerNorm with eps inside the denominator.

Both take numpy ids and return numpy logits through `nn_transformer_logits` / `annotated_logits`,
which build each model's own mask convention. `randomize_` draws every parameter.
"""
from __future__ import annotations

import copy
import math
import warnings

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn


def sinusoid_table(max_len: int, d: int, dtype: torch.dtype) -> torch.Tensor:
    """Interleaved sin/cos table (max_len, d), computed in ``dtype`` as the sources do in theirs."""
    freq = torch.exp(torch.arange(0, d, 2, dtype=dtype) * (-math.log(10000.0) / d))  # (d/2,)
    angle = torch.arange(max_len, dtype=dtype)[:, None] * freq  # (max_len, d/2)
    table = torch.zeros(max_len, d, dtype=dtype)
    table[:, 0::2] = torch.sin(angle)
    table[:, 1::2] = torch.cos(angle)
    return table


def randomize_(model: nn.Module, seed: int) -> nn.Module:
    """Draw every parameter, so that a swapped or ignored tensor changes the output: matrices
    Xavier-uniform, norm gains U(0.5, 1.5), every other vector (biases, norm offsets) U(-0.2, 0.2)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                limit = math.sqrt(6.0 / (p.shape[0] + p.shape[1]))
                values = (torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * limit
            elif "norm" in name and name.endswith(("weight", "a_2")):
                values = 0.5 + torch.rand(p.shape, generator=g, dtype=torch.float64)
            else:
                values = (torch.rand(p.shape, generator=g, dtype=torch.float64) * 2 - 1) * 0.2
            p.copy_(values.to(p.dtype))
    return model


def numpy_state_dict(model: nn.Module) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


# -- PyTorch's translation tutorial ---------------------------------------------------------------
class TokenEmbedding(nn.Module):
    def __init__(self, vocab_size: int, emb_size: int):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, emb_size)
        self.emb_size = emb_size

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.embedding(tokens.long()) * math.sqrt(self.emb_size)


class PositionalEncoding(nn.Module):
    """The tutorial's buffer ``pos_embedding`` (maxlen, 1, emb), added along the sequence axis."""

    def __init__(self, emb_size: int, dropout: float, maxlen: int, batch_first: bool, dtype: torch.dtype):
        super().__init__()
        self.batch_first = batch_first
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pos_embedding", sinusoid_table(maxlen, emb_size, dtype).unsqueeze(-2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.batch_first:  # x (B, L, emb)
            return self.dropout(x + self.pos_embedding[: x.size(1), 0])
        return self.dropout(x + self.pos_embedding[: x.size(0)])  # x (L, B, emb)


class Seq2SeqTransformer(nn.Module):
    def __init__(self, num_encoder_layers: int, num_decoder_layers: int, emb_size: int, nhead: int,
                 src_vocab_size: int, tgt_vocab_size: int, dim_feedforward: int, dropout: float = 0.1,
                 norm_first: bool = False, batch_first: bool = False, maxlen: int = 64,
                 dtype: torch.dtype = torch.float32, activation: str = "relu"):
        super().__init__()
        with warnings.catch_warnings():  # nested-tensor fast path unavailable with norm_first: fine
            warnings.filterwarnings("ignore", message="enable_nested_tensor is True")
            self.transformer = nn.Transformer(
                d_model=emb_size, nhead=nhead, num_encoder_layers=num_encoder_layers,
                num_decoder_layers=num_decoder_layers, dim_feedforward=dim_feedforward,
                dropout=dropout, batch_first=batch_first, norm_first=norm_first, activation=activation)
        self.generator = nn.Linear(emb_size, tgt_vocab_size)
        self.src_tok_emb = TokenEmbedding(src_vocab_size, emb_size)
        self.tgt_tok_emb = TokenEmbedding(tgt_vocab_size, emb_size)
        self.positional_encoding = PositionalEncoding(emb_size, dropout, maxlen, batch_first, dtype)
        self.to(dtype)

    def forward(self, src, tgt, tgt_mask, src_padding_mask, tgt_padding_mask):
        """Ids in the model's layout ((B, L) if batch_first else (L, B)); masks in nn.Transformer's
        convention (True or -inf = may NOT attend)."""
        src_emb = self.positional_encoding(self.src_tok_emb(src))
        tgt_emb = self.positional_encoding(self.tgt_tok_emb(tgt))
        out = self.transformer(src_emb, tgt_emb, src_mask=None, tgt_mask=tgt_mask, memory_mask=None,
                               src_key_padding_mask=src_padding_mask,
                               tgt_key_padding_mask=tgt_padding_mask,
                               memory_key_padding_mask=src_padding_mask)
        return self.generator(out)


def nn_transformer_logits(model: Seq2SeqTransformer, src: np.ndarray, tgt: np.ndarray, pad_id: int,
                          mask_style: str = "bool") -> np.ndarray:
    """Logits (B, T, V) for batch-first ids, masks built the way nn.Transformer reads them:
    ``"bool"``: True = blocked; ``"float"``: additive, -inf = blocked."""
    dtype = next(model.parameters()).dtype
    s, t = torch.as_tensor(src), torch.as_tensor(tgt)
    src_pad, tgt_pad = s == pad_id, t == pad_id  # (B, S), (B, T): True = padding = blocked
    causal = torch.triu(torch.ones(t.shape[1], t.shape[1], dtype=torch.bool), diagonal=1)
    if mask_style == "float":
        def additive(blocked):
            return torch.zeros(blocked.shape, dtype=dtype).masked_fill(blocked, float("-inf"))
        src_pad, tgt_pad = additive(src_pad), additive(tgt_pad)
        causal = nn.Transformer.generate_square_subsequent_mask(t.shape[1], dtype=dtype)
    elif mask_style != "bool":
        raise ValueError(f"mask_style: expected 'bool' or 'float', got {mask_style!r}")
    batch_first = model.transformer.encoder.layers[0].self_attn.batch_first
    if not batch_first:
        s, t = s.T, t.T  # (L, B): the tutorial's seq-first layout
    with torch.no_grad():
        out = model.eval()(s, t, causal, src_pad, tgt_pad)
    out = out if batch_first else out.transpose(0, 1)
    return out.numpy()


# -- The Annotated Transformer's structure --------------------------------------------------------
def _clones(module: nn.Module, n: int) -> nn.ModuleList:
    return nn.ModuleList(copy.deepcopy(module) for _ in range(n))


class LayerNorm(nn.Module):
    """``a_2 * (x - mean) / (std + eps) + b_2``, unbiased std, eps outside the square root."""

    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.a_2, self.b_2, self.eps = nn.Parameter(torch.ones(size)), nn.Parameter(torch.zeros(size)), eps

    def forward(self, x):
        mean, std = x.mean(-1, keepdim=True), x.std(-1, keepdim=True)
        return self.a_2 * (x - mean) / (std + self.eps) + self.b_2


class SublayerConnection(nn.Module):
    """Pre-norm residual: ``x + dropout(sublayer(norm(x)))``."""

    def __init__(self, size: int, dropout: float):
        super().__init__()
        self.norm, self.dropout = LayerNorm(size), nn.Dropout(dropout)

    def forward(self, x, sublayer):
        return x + self.dropout(sublayer(self.norm(x)))


class MultiHeadedAttention(nn.Module):
    def __init__(self, h: int, d_model: int, dropout: float):
        super().__init__()
        self.h, self.d_k = h, d_model // h
        self.linears = _clones(nn.Linear(d_model, d_model), 4)  # query, key, value, output
        self.dropout = nn.Dropout(dropout)

    def forward(self, query, key, value, mask):  # mask (B, 1|Q, K), 1 = may attend
        b = query.size(0)
        q, k, v = [lin(x).view(b, -1, self.h, self.d_k).transpose(1, 2)  # (B, h, L, d_k)
                   for lin, x in zip(self.linears, (query, key, value))]
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, h, Q, K)
        scores = scores.masked_fill(mask.unsqueeze(1) == 0, -1e9)
        context = self.dropout(scores.softmax(dim=-1)) @ v  # (B, h, Q, d_k)
        return self.linears[3](context.transpose(1, 2).contiguous().view(b, -1, self.h * self.d_k))


class PositionwiseFeedForward(nn.Module):
    def __init__(self, d_model: int, d_ff: int, dropout: float):
        super().__init__()
        self.w_1, self.w_2 = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.w_2(self.dropout(F.relu(self.w_1(x))))


class EncoderLayer(nn.Module):
    def __init__(self, size: int, self_attn, feed_forward, dropout: float):
        super().__init__()
        self.size, self.self_attn, self.feed_forward = size, self_attn, feed_forward
        self.sublayer = _clones(SublayerConnection(size, dropout), 2)

    def forward(self, x, mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, mask))
        return self.sublayer[1](x, self.feed_forward)


class DecoderLayer(nn.Module):
    def __init__(self, size: int, self_attn, src_attn, feed_forward, dropout: float):
        super().__init__()
        self.size, self.self_attn, self.src_attn, self.feed_forward = size, self_attn, src_attn, feed_forward
        self.sublayer = _clones(SublayerConnection(size, dropout), 3)

    def forward(self, x, memory, src_mask, tgt_mask):
        x = self.sublayer[0](x, lambda y: self.self_attn(y, y, y, tgt_mask))
        x = self.sublayer[1](x, lambda y: self.src_attn(y, memory, memory, src_mask))
        return self.sublayer[2](x, self.feed_forward)


class Encoder(nn.Module):
    def __init__(self, layer: EncoderLayer, n: int):
        super().__init__()
        self.layers, self.norm = _clones(layer, n), LayerNorm(layer.size)

    def forward(self, x, mask):
        for layer in self.layers:
            x = layer(x, mask)
        return self.norm(x)


class Decoder(nn.Module):
    def __init__(self, layer: DecoderLayer, n: int):
        super().__init__()
        self.layers, self.norm = _clones(layer, n), LayerNorm(layer.size)

    def forward(self, x, memory, src_mask, tgt_mask):
        for layer in self.layers:
            x = layer(x, memory, src_mask, tgt_mask)
        return self.norm(x)


class Embeddings(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.lut, self.d_model = nn.Embedding(vocab, d_model), d_model

    def forward(self, x):
        return self.lut(x) * math.sqrt(self.d_model)


class AnnotatedPositionalEncoding(nn.Module):
    """Buffer ``pe`` (1, max_len, d_model), added to batch-first input."""

    def __init__(self, d_model: int, dropout: float, max_len: int, dtype: torch.dtype):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("pe", sinusoid_table(max_len, d_model, dtype).unsqueeze(0))

    def forward(self, x):
        return self.dropout(x + self.pe[:, : x.size(1)])


class Generator(nn.Module):
    def __init__(self, d_model: int, vocab: int):
        super().__init__()
        self.proj = nn.Linear(d_model, vocab)

    def forward(self, x):
        return F.log_softmax(self.proj(x), dim=-1)


class EncoderDecoder(nn.Module):
    def __init__(self, encoder, decoder, src_embed, tgt_embed, generator):
        super().__init__()
        self.encoder, self.decoder = encoder, decoder
        self.src_embed, self.tgt_embed, self.generator = src_embed, tgt_embed, generator

    def encode(self, src, src_mask):
        return self.encoder(self.src_embed(src), src_mask)

    def decode(self, memory, src_mask, tgt, tgt_mask):
        return self.decoder(self.tgt_embed(tgt), memory, src_mask, tgt_mask)

    def forward(self, src, tgt, src_mask, tgt_mask):  # decoder output (B, T, d), before the generator
        return self.decode(self.encode(src, src_mask), src_mask, tgt, tgt_mask)


def make_annotated(src_vocab: int, tgt_vocab: int, n: int = 2, d_model: int = 16, d_ff: int = 24,
                   h: int = 4, dropout: float = 0.1, max_len: int = 64,
                   dtype: torch.dtype = torch.float32) -> EncoderDecoder:
    attn = MultiHeadedAttention(h, d_model, dropout)
    ff = PositionwiseFeedForward(d_model, d_ff, dropout)
    position = AnnotatedPositionalEncoding(d_model, dropout, max_len, dtype)
    c = copy.deepcopy
    model = EncoderDecoder(
        Encoder(EncoderLayer(d_model, c(attn), c(ff), dropout), n),
        Decoder(DecoderLayer(d_model, c(attn), c(attn), c(ff), dropout), n),
        nn.Sequential(Embeddings(d_model, src_vocab), c(position)),
        nn.Sequential(Embeddings(d_model, tgt_vocab), c(position)),
        Generator(d_model, tgt_vocab))
    return model.to(dtype)


def annotated_logits(model: EncoderDecoder, src: np.ndarray, tgt: np.ndarray, pad_id: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """``(generator.proj logits, generator log-probabilities)``, both (B, T, V), with the
    Annotated masks: src (B, 1, S) and tgt (B, T, T) = padding AND subsequent, 1 = may attend."""
    s, t = torch.as_tensor(src), torch.as_tensor(tgt)
    src_mask = (s != pad_id).unsqueeze(-2)  # (B, 1, S)
    causal = torch.tril(torch.ones(1, t.shape[1], t.shape[1], dtype=torch.bool))
    tgt_mask = (t != pad_id).unsqueeze(-2) & causal  # (B, T, T)
    with torch.no_grad():
        hidden = model.eval()(s, t, src_mask, tgt_mask)
        return model.generator.proj(hidden).numpy(), model.generator(hidden).numpy()
