"""The encoder-decoder Transformer as one ``nn.Module``, mirrored name for name by tf_impl."""
from __future__ import annotations

from typing import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from shared import TransformerConfig
from shared.checks import (check_cache, check_flag, check_hidden, check_ids_range, check_memory_dtype,
                           check_memory_shape)
from shared.decoding import check_beam_size, check_max_len
from shared.masks import padding_id, start_is_pad
from shared.messages import type_shown
from shared.weights import check_buildable

from . import weights_io
from .cache import (DecoderCache, _as_built, _inferring, _parameters, _plain_linear, _prepared, dense,
                    filled_mask, in_one_buffer, lay_out, lay_out_weights, step_layout)
from .embedding import PositionalEncoding, TokenEmbedding
from .inputs import _id_range, _is_integer, check_ids, check_mask, check_same_batch, make_src_mask, make_tgt_mask
from .layers import Trace, record
from .precision import _products_dtype, autocast
from .stacks import Decoder, Encoder


class Generator(nn.Module):
    """Hidden states ``(..., d)`` -> logits ``(..., tgt_vocab)``: ``(B, T, d)`` from `decode`, a
    step's rows ``(N, d)`` (no softmax: that belongs to the loss and to decoding).

    With ``tied`` (an embedding), the projection is that embedding's table ``(vocab, d)``, used as
    ``x @ table.T`` and held outside the module tree so its parameter is not listed twice; otherwise
    its own ``kernel`` Linear. The ``bias`` is always its own parameter.
    """

    def __init__(self, d_model: int, vocab: int, tied: TokenEmbedding | None = None,
                 dtype: torch.dtype | None = None):
        super().__init__()
        self._tied = [tied] if tied is not None else []  # a list: not registered as a submodule
        self.d_model = d_model
        self.precision = "float32"  # the model's (`torch_impl.precision.set_precision`)
        self.kernel = None if tied is not None else nn.Linear(d_model, vocab, bias=False, dtype=dtype)
        self.bias = nn.Parameter(torch.zeros(vocab, dtype=dtype))

    def _table(self) -> torch.Tensor:
        return self._tied[0].table.weight if self._tied else self.kernel.weight  # (V, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., d)`` -> ``(..., V)``. In eval mode without gradients to record (`torch_impl.
        cache._inferring`) from the kernel `_laid_out` for the rows, in the products'
        dtype (`torch_impl.precision._products_dtype`: autocast's where it is on, as it would
        cast): the same values to rounding. Called on its own, it computes in the model's precision
        (`torch_impl.precision.set_precision` sets it here too), as inside `Transformer.forward`:
        ``generator(decode(encode(src)))`` is the forward pass to the bit (docs/design.md).
        ``x`` in the parameters' dtype (`shared.checks.check_hidden`)."""
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"x: expected a torch tensor of hidden states, got {type_shown(x)}")
        check_hidden(x.shape, str(x.dtype)[6:], self.d_model, str(self.bias.dtype)[6:])
        if self.precision != "float32" and not torch.is_autocast_enabled(x.device.type):
            with autocast(self):
                return self._project(x)
        return self._project(x)

    def _project(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` after its check and its precision's autocast: ``(..., d)`` -> ``(..., V)``."""
        tied = [self._tied[0].table.weight] if self._tied else []  # outside this module's tree
        if not _inferring(self, x, *tied):
            return self._linear(x)
        dtype = _products_dtype(self.bias.dtype, x.device)
        return dense(x, *self._laid_out(step_layout(x.numel() // x.shape[-1], x.device, dtype), dtype))

    def _linear(self, x: torch.Tensor) -> torch.Tensor:
        """`forward` through the parameters themselves (autograd; a traced pass); an own ``kernel``
        that is not a plain ``nn.Linear`` (hooked, quantized, wrapped: `torch_impl.cache.
        _plain_linear`) is called."""
        if self._tied or _plain_linear(self.kernel):
            return F.linear(x, self._table(), self.bias)
        return self.kernel(x) + self.bias

    def _laid_out(self, layout: str, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``(kernel (d, V) in layout, bias (V,))`` in ``dtype``: the projection as inference
        multiplies by it (`torch_impl.cache.lay_out`; a decoding step's, `Transformer._step_weights`),
        made once and kept while the table and bias are unchanged (`torch_impl.cache._prepared`)."""
        table = self._table()

        def make():
            kernel, bias = table.detach().t(), self.bias.detach()
            return lay_out(kernel.to(dtype), layout), bias.to(dtype)
        return _prepared(self, f"{layout}, {str(dtype)[6:]}", (table, self.bias), make)

    def __getstate__(self):
        """Pickling and copying leave out the kept kernels (`_laid_out`): a cache, and oneDNN's
        packed tensors have no storage to pickle."""
        state = self.__dict__.copy()
        state.pop("_prepared_weights", None)
        return state


class Transformer(nn.Module):
    """The 2017 encoder-decoder Transformer, configured by a `shared.TransformerConfig`.

    Submodules: ``src_embed``, ``tgt_embed`` (the same object when ``config.share_embeddings``; each
    holds its learned ``positions`` when ``config.positional == "learned"``), ``positional``,
    ``encoder``, ``decoder``, ``generator``. Parameters are created in ``config.dtype`` with the
    training initialisation (Xavier-uniform matrices); load trained or reference weights with
    `import_weights`. Dropout is active only in ``train()``.

    Masks everywhere are boolean, ``True`` = may attend, broadcastable to
    ``(batch, heads, q_len, k_len)``; when omitted they are derived from ``config.pad_id``.
    """

    def __init__(self, config: TransformerConfig):
        super().__init__()
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config: expected a TransformerConfig, got {type(config).__name__}")
        # a model this machine cannot hold: one line naming config, not the framework's own OOM
        check_buildable(config, "inference", "config")
        dtype = getattr(torch, config.dtype)
        self.config = config
        positions = config.max_len if config.positional == "learned" else None
        self.src_embed = TokenEmbedding(config.src_vocab, config.d_model, config.embed_scale, positions,
                                        dtype=dtype)
        self.tgt_embed = (self.src_embed if config.share_embeddings
                          else TokenEmbedding(config.tgt_vocab, config.d_model, config.embed_scale,
                                              positions, dtype=dtype))
        self.positional = PositionalEncoding(config)
        self.encoder = Encoder(config)
        self.decoder = Decoder(config)
        self.generator = Generator(config.d_model, config.tgt_vocab,
                                   self.tgt_embed if config.tie_output else None, dtype)
        weights_io.reset_parameters(self)

    def __getstate__(self):
        """Pickling and copying (``torch.save(model)``, ``copy.deepcopy``) leave out the weights
        laid out for inference (`torch_impl.cache._prepared`) and the CUDA graphs of decoding kept
        from the last decode (`torch_impl.graphs`): caches, remade when next needed (oneDNN's
        packed tensors have no storage to pickle, a CUDA graph no state to copy)."""
        state = self.__dict__.copy()
        state.pop("_prepared_weights", None)
        state.pop("_graphs", None)
        return state

    # -- input checks (all before any compute) ----------------------------------------------------
    @property
    def _device(self) -> torch.device:
        """The parameters' device (the generator's bias: every model has it), where a call's
        inputs go and its kept weights are laid out."""
        return self.generator.bias.device

    def _on_device(self, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """``tensors`` (checked ids, masks, memory) on the parameters' device: one on another
        device is copied there, as TensorFlow places a call's inputs itself (a tensor already
        there is returned as it is, no copy)."""
        return tuple(t.to(self._device) for t in tensors)

    def _src_mask(self, src: torch.Tensor, src_mask, q_len: int = 1) -> torch.Tensor:
        if src_mask is None:
            return make_src_mask(src, padding_id(self.config))
        check_mask("src_mask", src_mask, src.shape[0], self.config.n_heads, q_len, src.shape[1])
        return src_mask

    def _tgt_mask(self, tgt: torch.Tensor, tgt_mask) -> torch.Tensor:
        if tgt_mask is None:
            return make_tgt_mask(tgt, padding_id(self.config), start_is_pad(self.config))
        b, t = tgt.shape
        check_mask("tgt_mask", tgt_mask, b, self.config.n_heads, t, t)
        return tgt_mask

    # -- the computation --------------------------------------------------------------------------
    # Two ways through the same maths: the modules (autograd, dropout, traces), and, in eval mode
    # without gradients (`torch_impl.cache._inferring`), the weights laid out once and kept
    # (`torch_impl.cache._prepared`): query, key and value stacked into one product, every kernel
    # in the layout that is fast for the pass's row count (`torch_impl.cache.step_layout`:
    # oneDNN-packed on the CPU), and in a half precision cast once rather than by autocast at every
    # call. Same values to rounding (parity_tests/test_inference_forward_torch_only.py).
    def _encode(self, src: torch.Tensor, src_mask: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        x = self.positional(self.src_embed(src), self.src_embed.positions)  # (B, S, d)
        record(trace, "encoder.embed", x)
        if trace is None and _inferring(self, x):  # eval: the dropout above was none
            return self._infer_encoder(x, src_mask)
        memory = self.encoder(x, src_mask, trace)
        record(trace, "encoder.output", memory)
        return memory

    def _encode_for_decoding(self, src: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """A decode's encoder pass (in eval, without gradients), ``(B, S)`` -> ``(B, S, d)``: the
        inference pass (`_infer_encoder`), or the modules for a model not as built
        (`torch_impl.cache._as_built`: hooks, replaced or wrapped modules)."""
        x = self.positional(self.src_embed(src), self.src_embed.positions)  # eval: no dropout
        return self._infer_encoder(x, src_mask) if _inferring(self, x) else self.encoder(x, src_mask)

    def _infer_encoder(self, x: torch.Tensor, src_mask: torch.Tensor) -> torch.Tensor:
        """The encoder's inference pass on the embedded source ``x (B, S, d)``: `Encoder.infer` on
        `_encoder_weights` in the layout of ``B * S`` rows."""
        dtype = self._products_dtype()
        layout = step_layout(x.shape[0] * x.shape[1], self._device, dtype)
        return self.encoder.infer(x, src_mask, self._encoder_weights(layout), dtype)

    def _decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
                tgt_mask: torch.Tensor, trace: Trace | None) -> torch.Tensor:
        x = self.positional(self.tgt_embed(tgt), self.tgt_embed.positions)  # (B, T, d)
        record(trace, "decoder.embed", x)
        if trace is None and _inferring(self, x, memory):
            weights, _ = self._step_weights(tgt.numel())
            return self.decoder.infer(x, memory, src_mask, tgt_mask, weights, self._products_dtype())
        hidden = self.decoder(x, memory, src_mask, tgt_mask, trace)
        record(trace, "decoder.output", hidden)
        return hidden

    # -- public API -------------------------------------------------------------------------------
    def forward(self, src: torch.Tensor, tgt: torch.Tensor, src_mask: torch.Tensor | None = None,
                tgt_mask: torch.Tensor | None = None, return_trace: bool = False):
        """Logits for every target position.

        Args:
            src: source ids ``(B, S)``, integer, values in ``[0, src_vocab)``, ``S <= max_len``.
            tgt: target input ids ``(B, T)`` (BOS first), integer, values in ``[0, tgt_vocab)``.
            src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; used by encoder
                self-attention and cross-attention, so its query axis is 1. Default ``src != pad_id``.
            tgt_mask: bool, broadcastable to ``(B, H, T, T)``. Default: padding AND subsequent.
            return_trace: also return the named intermediates of `shared.reference` (attention then
                takes its explicit path, to have the weights).

        Returns:
            logits ``(B, T, tgt_vocab)``, or ``(logits, trace)``: an ordered dict of tensors with the
            names and order of `shared.reference.trace_names(config)`.

        Raises:
            TypeError / ValueError: bad ids or masks, with the messages of `shared.checks`.

        Ids and masks on another device than the parameters are copied to theirs (as by every
        call of this model: docs/design.md, convention 12); the logits are on the parameters'.

        With ``torch_impl.precision.set_precision(model, "bfloat16")`` the pass runs under
        ``torch.autocast`` (bfloat16 logits; `torch_impl.precision` says which ops).

        In eval mode without gradients to record (``torch.no_grad()``, ``torch.inference_mode()``,
        or a model frozen by ``requires_grad_(False)``) and without a trace, the pass runs on
        weights laid out for inference and kept while the parameters are unchanged
        (`torch_impl.cache.StepWeights`): the same values to rounding, faster, and in a half
        precision no weight is cast at the call.
        """
        c = self.config
        check_flag(return_trace, "return_trace")
        check_ids("src", src, c.src_vocab, c.max_len)
        check_ids("tgt", tgt, c.tgt_vocab, c.max_len)
        check_same_batch(src, tgt)
        src, tgt = self._on_device(src, tgt)
        src_mask, tgt_mask = self._on_device(self._src_mask(src, src_mask), self._tgt_mask(tgt, tgt_mask))
        trace: Trace | None = {} if return_trace else None
        with autocast(self):
            memory = self._encode(src, src_mask, trace)
            hidden = self._decode(tgt, memory, src_mask, tgt_mask, trace)
            # a traced pass runs the modules throughout (no kept weights), its generator too
            logits = self.generator(hidden) if trace is None else self.generator._linear(hidden)
        if trace is None:
            return logits
        trace["logits"] = logits
        return logits, trace

    def encode(self, src: torch.Tensor, src_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, d_model)``.

        ``src_mask``: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; default ``src != pad_id``.
        """
        c = self.config
        check_ids("src", src, c.src_vocab, c.max_len)
        src, = self._on_device(src)
        src_mask, = self._on_device(self._src_mask(src, src_mask))
        with autocast(self):
            return self._encode(src, src_mask, None)

    def decode(self, tgt: torch.Tensor, memory: torch.Tensor, src_mask: torch.Tensor,
               tgt_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Target ids ``(B, T)`` and memory ``(B, S, d_model)`` -> hidden states ``(B, T, d_model)``;
        ``self.generator(hidden)`` gives the logits.

        Args:
            src_mask: required (the memory cannot tell where the source padding was): bool,
                True = may attend, broadcastable to ``(B, H, T, S)``, e.g. ``make_src_mask(src, pad_id)``.
            tgt_mask: bool, broadcastable to ``(B, H, T, T)``; default padding AND subsequent.
        """
        c = self.config
        self._check_memory(memory)  # in tf_impl's order: memory, src_mask given, tgt, the batches
        if src_mask is None:
            raise ValueError("src_mask: required by decode (the memory cannot tell where the source "
                             "padding was); use torch_impl.inputs.make_src_mask(src, pad_id)")
        check_ids("tgt", tgt, c.tgt_vocab, c.max_len)
        check_same_batch(memory, tgt)
        check_mask("src_mask", src_mask, tgt.shape[0], c.n_heads, tgt.shape[1], memory.shape[1])
        tgt, memory, src_mask = self._on_device(tgt, memory, src_mask)
        tgt_mask, = self._on_device(self._tgt_mask(tgt, tgt_mask))
        with autocast(self):
            return self._decode(tgt, memory, src_mask, tgt_mask, None)

    def _check_memory(self, memory) -> None:
        """``memory`` as `encode` returns it: ``(B, S, d_model)`` in the parameters' dtype."""
        if not isinstance(memory, torch.Tensor):
            raise TypeError(f"memory: expected a torch tensor (from encode), got {type(memory).__name__}")
        check_memory_shape(memory.shape, self.config.d_model)
        check_memory_dtype(str(memory.dtype)[6:], str(self.generator.bias.dtype)[6:])

    # -- incremental decoding (the cache of torch_impl.cache) -------------------------------------
    def init_cache(self, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int,
                   beams: int = 1) -> DecoderCache:
        """An empty decoding cache for up to ``max_len`` target positions (BOS included).

        Cross-attention keys and values are computed here, once per source, and repeated for
        ``beams`` rows per item (rows ``item * beams + beam``, the order of `shared.decoding`).

        Args:
            memory: ``(B, S, d_model)`` from `encode`.
            src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``.
            max_len: positions the self-attention buffers hold, ``1 <= max_len <= config.max_len``.
            beams: rows per item (beam size; 1 for greedy), ``1 <= beams <= tgt_vocab - 1``.

        Returns:
            a `DecoderCache` of ``N = B * beams`` rows with ``length == 0``.
        """
        c = self.config
        self._check_memory(memory)
        check_mask("src_mask", src_mask, memory.shape[0], c.n_heads, 1, memory.shape[1])
        check_max_len(max_len, c.max_len)
        # A beam has tgt_vocab - 1 children (pad is never generated): more beams than that cannot
        # be filled, and the bound names the argument before a cache of that size is allocated.
        check_beam_size(beams, c.tgt_vocab, name="beams")
        beams = int(beams)
        memory, src_mask = self._on_device(memory, src_mask)
        with autocast(self):
            return self._init_cache(memory, src_mask, max_len, beams)

    def _init_cache(self, memory: torch.Tensor, src_mask: torch.Tensor, max_len: int,
                    beams: int) -> DecoderCache:
        """`init_cache` without the checks, in the caller's autocast (the decoders call it under
        the model's, `torch_impl.decoding`)."""
        with torch.no_grad():
            if not _as_built(self):  # hooks, replaced or wrapped modules: the steps call them
                return self.decoder.init_cache(memory, src_mask, max_len, beams, None, None)
            weights, generator = self._step_weights(memory.shape[0] * beams)
            return self.decoder.init_cache(memory, src_mask, max_len, beams, weights, generator)

    def _step_weights(self, rows: int):
        """The decoder's `torch_impl.cache.StepWeights` and the generator's ``(kernel (d, V),
        bias)`` for a step over ``rows`` rows, every kernel in that step's layout
        (`torch_impl.cache.step_layout`) and, in a half precision, kernels and biases cast to it
        (`torch_impl.precision`), kept as `torch_impl.cache._prepared` says (one set per layout and
        dtype, each the size of the decoder and generator weights in that dtype); on the CPU the
        layers' in one buffer where they are plain tensors (`torch_impl.cache.in_one_buffer`).
        Keyed on what they are made from, the decoder's parameters and the generator's table and
        bias, as `_encoder_weights` on the encoder's: an update of the encoder alone (its
        fine-tuning) keeps them, and a decode checks the decoder's half of the model, not all of
        it."""
        dtype = self._products_dtype()
        layout = step_layout(rows, self._device, dtype)
        cast = None if dtype == self.generator.bias.dtype else dtype

        def make():
            weights = [lay_out_weights(w, layout, cast) for w in self.decoder.step_weights()]
            return in_one_buffer(weights, self._device), self.generator._laid_out(layout, dtype)

        made_from = (*_parameters(self.decoder), self.generator._table(), self.generator.bias)
        return _prepared(self, f"{layout}, {str(dtype)[6:]}", made_from, make)

    def _products_dtype(self) -> torch.dtype:
        """The dtype of an inference pass's products in the autocast it runs in: the model's
        precision under its own (`autocast`), a caller's ``torch.autocast`` otherwise
        (`torch_impl.precision._products_dtype`); without autocast the parameters' dtype (which
        ``model.half()`` or ``.double()`` may have made other than ``config.dtype``)."""
        return _products_dtype(self.generator.bias.dtype, self._device)

    def _encoder_weights(self, layout: str):
        """The encoder's `torch_impl.cache.EncoderWeights` in ``layout`` (`torch_impl.cache.lay_out`)
        and, in a half precision, cast to it first, kept as `torch_impl.cache._prepared` says while
        the encoder's parameters are unchanged (the size of the encoder's layers in that dtype).
        Keyed on the encoder's parameters alone, which is all these are made from: half the
        model's, so half the check at every decode and inference pass."""
        dtype = self._products_dtype()
        cast = None if dtype == self.generator.bias.dtype else dtype
        return _prepared(self, f"encoder, {layout}, {str(dtype)[6:]}", _parameters(self.encoder),
                         lambda: [lay_out_weights(w, layout, cast) for w in self.encoder.infer_weights()])

    def decode_step(self, tokens: torch.Tensor, cache: DecoderCache) -> tuple[torch.Tensor, DecoderCache]:
        """Logits for the next position of every row, from its newest token and the cache.

        Feeding a target sequence token by token (BOS first) gives, at step ``t``, the logits that
        `forward` gives at position ``t`` for that sequence, provided it holds no pad (decoding never
        generates pad; the cached path has no padding mask, see `MultiHeadAttention.extend`).

        Args:
            tokens: ``(N,)`` integer ids in ``[0, tgt_vocab)``, one per cache row: the token at
                position ``cache.length``; on any device (moved to the cache's, as the other
                calls move their tensors to the model's: `_on_device`).
            cache: from `init_cache`; filled at position ``cache.length``, which then advances.
                It holds the projections of the weights of the moment it was made (make
                a new one after the weights change: docs/design.md, section 7); one whose layers, heads,
                dtype, capacity or vocabulary are not this model's is refused
                (`shared.checks.check_cache`).

        Returns:
            ``(logits (N, tgt_vocab), cache)``, ``length`` advanced by one. The cache is updated in
            place and returned, so that code written as ``logits, cache = model.decode_step(tokens,
            cache)`` also fits tf_impl, whose tensors are immutable.

        For inference: run it under ``torch.no_grad()`` or ``torch.inference_mode()`` (a cache
        made under ``inference_mode`` is stepped under it too: `DecoderCache._check_writable`). Gradients
        through it are not supported: its weights are detached copies, float32 CPU products go
        through oneDNN's packed kernels (no autograd formula: torch warns and passes no gradient
        on), and the key/value buffers are written in place, so a backward through two steps
        raises.
        """
        if not isinstance(cache, DecoderCache):
            raise TypeError(f"cache: expected a torch_impl.cache.DecoderCache from init_cache, "
                            f"got {type(cache).__name__}")
        with autocast(self):  # the dtype its keys have is the one this model's step computes in
            self._check_cache(cache)
        cache._check_writable()
        if not isinstance(tokens, torch.Tensor):  # as check_ids says it of forward's ids
            raise TypeError(f"tokens: expected a torch tensor of token ids, got {type(tokens).__name__}")
        if tokens.dim() != 1 or tokens.shape[0] != cache.rows:
            raise ValueError(f"tokens: expected a tensor of shape ({cache.rows},) (one id per cache "
                             f"row), got {tuple(tokens.shape)}")
        if not _is_integer(tokens.dtype):
            raise TypeError(f"tokens: expected integer token ids, got dtype {str(tokens.dtype)[6:]}")
        check_ids_range("tokens", self.config.tgt_vocab, *_id_range(tokens))
        if cache.length >= cache.capacity:
            raise ValueError(f"cache: expected a free position, got a full cache "
                             f"({cache.capacity} positions; init_cache(max_len=...) sets it)")
        with autocast(self):  # tokens on the cache's device, as `_on_device` moves the other calls' inputs
            return self._decode_step(tokens.to(cache.src_mask.device), cache)

    def _check_cache(self, cache: DecoderCache) -> None:
        """``cache`` has the layers, heads, dtype, capacity and vocabulary of this model's caches
        (`shared.checks.check_cache`), in the autocast the step will run in."""
        c, first = self.config, cache.layers[0] if cache.layers else None
        check_cache(len(cache.layers), first and tuple(first.self_key.shape),
                    first and tuple(first.cross_key.shape), first and str(first.self_key.dtype)[6:],
                    cache.generator[1].shape[0] if cache.generator else None,
                    layers=c.n_decoder_layers, n_heads=c.n_heads, d_k=c.d_k, max_len=c.max_len,
                    expected_dtype=str(self._products_dtype())[6:], tgt_vocab=c.tgt_vocab)

    def _decode_step(self, tokens: torch.Tensor, cache: DecoderCache) -> tuple[torch.Tensor, DecoderCache]:
        """`decode_step` without the checks, in the caller's autocast (the search loops call it
        under the model's, `torch_impl.decoding`): ``(N,)`` -> ``(logits (N, V), cache)``, the
        cache updated in place; logits in the model's compute dtype (half in a half precision)."""
        x = self._step_input(tokens, cache.length)  # (N, d)
        hidden, cache = self.decoder.step(x, cache)  # (N, d); cache.length advanced by one
        return self._step_generator(hidden, cache), cache  # (N, V)

    def _step_input(self, tokens: torch.Tensor, position) -> torch.Tensor:
        """A step's input rows, ``(N,)`` -> ``(N, d)``, the layers' steps' shape: the embedding
        module called on ``(N, 1)`` ids, as `forward` calls it on ``(B, T)``, plus the positional
        row of ``position`` (an int, or a 0-d int64 tensor: a CUDA graph's step), the addition the
        full pass makes for that column. Inference: no dropout (nor a call of the inactive module)."""
        x = self.tgt_embed(tokens[:, None]).reshape(tokens.shape[0], self.config.d_model)
        table = self.positional.select(self.tgt_embed.positions)  # fixed or learned (max_len, d)
        row = (table[position: position + 1] if isinstance(position, int)
               else table.index_select(0, position.view(1)))
        return x + row

    def _step_generator(self, hidden: torch.Tensor, cache: DecoderCache) -> torch.Tensor:
        """A step's logits ``(N, V)`` from its hidden states ``(N, d)``: the cache's kernel, or the
        generator module where the cache keeps no weights (a model not as built)."""
        return dense(hidden, *cache.generator) if cache.generator else self.generator(hidden)

    def _step_logits(self, tokens: torch.Tensor, cache: DecoderCache, position) -> torch.Tensor:
        """The logits of one cached step at ``position`` (an int, or a 0-d int64 tensor on the
        cache's device, as a CUDA graph replays it: `torch_impl.graphs`), writing every layer's
        key/value at that position and leaving ``cache.length`` as it is. ``(N,)`` -> ``(N, V)``."""
        x = self._step_input(tokens, position)  # (N, d)
        self_mask = (None if isinstance(position, int) or not cache.layers else  # once for every layer
                     filled_mask(cache.capacity, position, cache.layers[0].self_key.dtype))
        for layer, layer_cache in zip(self.decoder.layers, cache.layers):
            x, _ = layer.step(x, layer_cache, position, cache.src_mask, cache.src_keep, self_mask)
        if self.decoder.final_norm is not None:
            x = self.decoder.final_norm(x)
        return self._step_generator(x, cache)  # (N, V)

    # -- canonical weights ------------------------------------------------------------------------
    def import_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load canonical weights (`shared.weights` schema, ``config.dtype``). Everything is checked
        first; on any problem one `shared.weights.WeightsError` lists them all and the model keeps
        its old weights."""
        weights_io.import_weights(self, weights)

    def export_weights(self) -> dict[str, np.ndarray]:
        """The canonical ``{name: ndarray}`` (kernels ``(in, out)``, tied weights once, config dtype);
        ``export_weights()`` after ``import_weights(w)`` equals ``w`` bit for bit."""
        return weights_io.export_weights(self)


def check_model(model) -> None:
    """``model`` is a `Transformer` (tf_impl's check is the same): a wrapper of one (``torch.compile``'s,
    (Distributed)DataParallel) is named with the attribute that holds it, anything else by type,
    before anything reads it (else ``'NoneType' object has no attribute 'config'``)."""
    if isinstance(model, Transformer):
        return
    for attribute in ("_orig_mod", "module"):  # torch.compile's wrapper; (Distributed)DataParallel
        if isinstance(getattr(model, attribute, None), Transformer):
            raise TypeError(f"model: expected a torch_impl.Transformer, got a {type(model).__name__} "
                            f"wrapping one: pass model.{attribute} (decoding runs its own steps, "
                            "never the wrapper's forward)")
    raise TypeError(f"model: expected a torch_impl.Transformer, got {type_shown(model)}")
