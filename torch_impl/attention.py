"""Multi-head scaled dot-product attention, with a fast path and an explicit path.

Masks are boolean, ``True`` = may attend (docs/design.md, convention 2), broadcastable to
``(batch, heads, q_len, k_len)``. ``F.scaled_dot_product_attention`` reads a bool ``attn_mask`` the
same way, so the mask is passed as it is (``nn.MultiheadAttention`` would need it inverted).

Both paths give a masked key exactly zero weight and a query with no allowed key (an all-padding
sequence) an all-zero context (docs/design.md, convention 3). SDPA returns NaN for such a row
(softmax of nothing), so on the fast path those rows are let attend every key and their context is
zeroed after.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from shared.checks import check_flag, check_position, check_step_kernels

from .cache import CrossFold, _plain_linear, dense, filled_mask


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis where ``mask`` is True; masked entries are exactly 0 and a row with
    no allowed entry is all zeros (not NaN, not uniform).

    Shape: scores ``(B, H, Q, K)``; mask bool, broadcastable to it.
    """
    if mask is None:
        return torch.softmax(scores, dim=-1)
    blocked = ~mask
    weights = torch.softmax(scores.masked_fill(blocked, float("-inf")), dim=-1)
    # exp(-inf) already gives exact zeros; the second fill turns the NaN of an all-blocked row into
    # zeros (and, being a masked_fill, zeroes that row's gradient rather than passing NaN back).
    return weights.masked_fill(blocked, 0.0)


def _attend_buffer(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   bias: torch.Tensor) -> torch.Tensor:
    """One query a row over a whole key/value buffer, as a CUDA graph's step attends (`extend` at a
    tensor position): ``softmax(q k^T / sqrt(d_k) + bias) v``, ``bias`` additive
    (`torch_impl.cache.filled_mask`: every row has a key, so no row is all -inf).

    In float32 and float64, two batched products around a softmax rather than SDPA: SDPA's float32
    kernel on CUDA (memory-efficient attention, tiled for 64 queries) is the slowest kernel of a
    graph's step at one query, longer as the buffer grows, and the three kernels take less
    (docs/performance.md, "GPU"). Half precisions keep SDPA, whose half kernels are the faster
    there. Same values to rounding (the softmax is exact here, not SDPA's running one).

    Shape: q ``(N, H, 1, d_k)``, buffers ``(N, H, C, d_k)``, bias broadcastable to ``(N, H, 1,
    C)`` -> ``(N, H, 1, d_k)``."""
    if q.dtype in (torch.float16, torch.bfloat16):
        return F.scaled_dot_product_attention(q, key_cache, value_cache, attn_mask=bias)
    return _attend_by_products(q, key_cache, value_cache, bias)


def _attend_by_products(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                        bias: torch.Tensor) -> torch.Tensor:
    """`_attend_buffer`'s float32 and float64 path, in any dtype (`benchmarks/gpu_profile.py` times
    it against SDPA): ``baddbmm`` (scores plus bias), softmax, ``bmm``. Shapes as there."""
    n, heads, _, d_k = q.shape
    keys = key_cache.shape[2]
    scores = torch.baddbmm(bias.expand(n, heads, 1, keys).reshape(n * heads, 1, keys),
                           q.reshape(n * heads, 1, d_k), key_cache.reshape(n * heads, keys, d_k).transpose(1, 2),
                           alpha=d_k ** -0.5)  # (N * H, 1, C)
    return torch.bmm(scores.softmax(dim=-1), value_cache.reshape(n * heads, keys, d_k)).view(n, heads, 1, d_k)


def _zero_keyless(context: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Attention's output with the rows that had no key zeroed (``keep`` of
    `torch_impl.cache.prepare_mask`; None: every row had one, nothing to multiply)."""
    return context if keep is None else context * keep


def _write_position(buffer: torch.Tensor, new: torch.Tensor, position) -> None:
    """A cached step's new keys or values (or both, in one buffer) written at ``position`` of the
    preallocated ``buffer``, in place.

    ``position`` an int: ``narrow`` and ``copy_`` (indexing, ``buffer[..., position, :] = new``,
    makes a view per index: more operations a step, docs/performance.md, "A step's Python").
    ``position`` a 0-d int64 tensor on the buffer's device (a CUDA graph's step): ``index_copy_``.

    Shape: buffer ``(..., capacity, d_k)``, new ``(..., 1, d_k)`` with the same leading axes."""
    if isinstance(position, torch.Tensor):
        buffer.index_copy_(buffer.dim() - 2, position.view(1), new)
    else:
        buffer.narrow(-2, position, 1).copy_(new)


def _attend_filled(q: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor, position,
                   mask: torch.Tensor | None = None) -> torch.Tensor:
    """A cached step's self-attention once its key and value are written (`_write_position`): the
    query attends to positions ``0 .. position`` of the buffers (see `MultiHeadAttention.extend`).

    ``position`` an int: ``narrow`` cuts the filled positions. ``position`` a 0-d int64 tensor on
    the buffers' device (a CUDA graph's step): the query attends to the whole buffer under
    ``mask``, its `torch_impl.cache.filled_mask` (made here when None).

    Shape: q ``(N, H, 1, d_k)`` (a view of one product's columns, as the step makes it: no axis to
    add), buffers ``(N, H, capacity, d_k)`` -> ``(N, H, 1, d_k)`` (CUDA's half-precision kernels
    may return other strides: reshape it)."""
    if isinstance(position, torch.Tensor):
        if mask is None:
            mask = filled_mask(key_cache.shape[2], position, key_cache.dtype)
        return _attend_buffer(q, key_cache, value_cache, mask)
    end = position + 1
    return F.scaled_dot_product_attention(q, key_cache.narrow(2, 0, end), value_cache.narrow(2, 0, end))


def _attend_source(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                  keep: torch.Tensor | None) -> torch.Tensor:
    """A step's cross-attention after its query projection: one query a row over the source keys
    and values of its item, the mask made ready once (`torch_impl.cache.prepare_mask`).

    ``N = items * beams`` rows attend the keys of their item, kept once per item, not per beam
    (`torch_impl.cache.DecoderCache`): each item's rows are its queries, ``(items, H, beams,
    d_k)``. A step reads the keys once per item, not once per beam (a beam step at batch 8 was 4%
    faster on the CPU: docs/performance.md, "Beam search on the CPU"); and SDPA's CPU flash kernel
    has no batch broadcast (its math fallback took three times as long for one item). Same values
    to rounding.

    One row an item (greedy, or a beam search's first step) takes no transposes: an axis of one
    moves no element, and each is an operation a step (docs/performance.md, "A step's Python").

    Shape: q ``(N, H * d_k)`` (a product's rows), k/v ``(items, H, S, d_k)``, mask broadcastable
    to ``(items, H, 1, S)``, keep to ``(items, H, 1, 1)`` or None -> ``(N, H * d_k)``, rows in
    q's order."""
    n, width = q.shape
    items, heads, _, d_k = k.shape
    one = n == items
    q = q.view(n, heads, 1, d_k) if one else q.view(items, n // items, heads, d_k).transpose(1, 2)
    context = _zero_keyless(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), keep)  # (items, H, beams, d_k)
    return (context if one else context.transpose(1, 2)).reshape(n, width)  # the same order of rows


def _attend_folded(x: torch.Tensor, fold: CrossFold) -> torch.Tensor:
    """A step's cross-attention of one item's rows from the folded source (`CrossFold`): the
    query projection, attention and output projection as two products and a softmax.

    Shape: x ``(N, d)``, the rows of one item (its beams) -> ``(N, d)``."""
    n = x.shape[0]
    scores = torch.addmm(fold.scores_bias, x, fold.scores_kernel).view(n, fold.heads, -1)  # (N, H, S)
    return torch.addmm(fold.output_bias, torch.softmax(scores, dim=-1).view(n, -1), fold.values_kernel)


class MultiHeadAttention(nn.Module):
    """Attention of ``query_in`` over ``memory`` with ``n_heads`` heads of width ``d_k`` (``head_dim``,
    or ``d_model // n_heads`` when that is None), scores scaled by ``1 / sqrt(d_k)``.

    Four projections with bias, ``nn.Linear`` modules named ``query``, ``key``, ``value``
    (``d_model -> n_heads * d_k``) and ``output`` (``n_heads * d_k -> d_model``) (torch layout
    ``(out, in)``; the canonical ``(in, out)`` kernels are transposed on import/export).

    Args:
        d_model: model width, divisible by ``n_heads`` unless ``head_dim`` is given.
        n_heads: number of heads.
        dropout: probability of dropping an attention weight (train only).
        head_dim: per-head width (``config.head_dim``); None = ``d_model // n_heads``.
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, head_dim: int | None = None, *,
                 dtype: torch.dtype | None = None):
        super().__init__()
        if head_dim is None and d_model % n_heads:
            raise ValueError(f"MultiHeadAttention: d_model expected a multiple of n_heads={n_heads}, "
                             f"got {d_model}")
        d_k = head_dim if head_dim is not None else d_model // n_heads
        self.n_heads, self.d_k, self.dropout = n_heads, d_k, float(dropout)
        inner = n_heads * d_k
        self.query = nn.Linear(d_model, inner, dtype=dtype)
        self.key = nn.Linear(d_model, inner, dtype=dtype)
        self.value = nn.Linear(d_model, inner, dtype=dtype)
        self.output = nn.Linear(inner, d_model, dtype=dtype)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        b, length, _ = x.shape
        return x.view(b, length, self.n_heads, self.d_k).transpose(1, 2)  # (B, H, L, d_k)

    def forward(self, query_in: torch.Tensor, memory: torch.Tensor, mask: torch.Tensor | None,
                return_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Attend from each query position to the memory positions its mask allows.

        Args:
            query_in: ``(B, Q, d_model)``; memory: ``(B, K, d_model)`` (``query_in`` for self-attention).
            mask: bool, ``True`` = may attend, broadcastable to ``(B, H, Q, K)``; ``None`` = all keys.
            return_weights: also return the attention weights; takes the explicit path (matmul and
                softmax) instead of ``F.scaled_dot_product_attention``.

        Returns:
            output ``(B, Q, d_model)``, and the weights ``(B, H, Q, K)`` (before dropout) or ``None``.
        """
        if query_in is memory:  # self-attention: the query, key and value from one product
            q, k, v = self._project(query_in, self.query, self.key, self.value)
        else:
            q, (k, v) = self._heads(self.query(query_in)), self.keys_values(memory)
        return self._attend(q, k, v, mask, return_weights)

    def _project(self, x: torch.Tensor, *linears: nn.Linear) -> list[torch.Tensor]:
        """The per-head projections of ``x (B, L, d_model)`` by ``linears``, each ``(B, H, L, d_k)``,
        from one product with their weights stacked (as ``nn.MultiheadAttention``'s ``in_proj``):
        one launch where there were as many as linears, and under autocast one cast of the
        stacked weight instead of one per linear. Differentiable (the stacking is a ``cat``).
        A projection that is not a plain ``nn.Linear`` (hooked, quantized, wrapped by an adapter:
        `torch_impl.cache._plain_linear`) is called instead, each on its own."""
        if not all(map(_plain_linear, linears)):
            return [self._heads(lin(x)) for lin in linears]
        b, length, _ = x.shape
        weight = torch.cat([lin.weight for lin in linears])
        bias = torch.cat([lin.bias for lin in linears])
        out = F.linear(x, weight, bias).view(b, length, len(linears), self.n_heads, self.d_k)
        return list(out.permute(2, 0, 3, 1, 4).unbind(0))  # views; SDPA reads them strided

    def keys_values(self, memory: torch.Tensor, kv: tuple | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys and values of ``memory (B, K, d_model)``, each ``(B, H, K, d_k)``, from one
        product: what a decoding cache (`torch_impl.cache`) keeps instead of recomputing. With
        ``kv``, the stacked ``(kernel (d, 2 * H * d_k), bias)`` of `step_kernels` in a
        `torch_impl.cache.lay_out` layout (inference), no module is called; the same to rounding."""
        if kv is None:
            k, v = self._project(memory, self.key, self.value)
            return k, v
        b, length, _ = memory.shape
        k, v = dense(memory, *kv).view(b, length, 2, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4)
        return k, v

    def fold_source(self, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
                    keep: torch.Tensor | None, out: CrossFold | None = None) -> CrossFold:
        """This cross-attention over one item's source keys and values folded into two products
        (`torch_impl.cache.CrossFold`, when: `torch_impl.cache.folds_source`), from the query and
        output projections' parameters, in the keys' dtype: the model's, as the unfolded step's
        products (float64 sums cost several times as much to make: docs/performance.md).

        Shape: k, v ``(1, H, S, d_k)`` (`keys_values`); mask and keep of
        `torch_impl.cache.prepare_mask`: mask ``(1, 1|H, 1, S)`` additive, keep ``(1, 1|H, 1, 1)``
        or None. ``out``: a `CrossFold` of tensors of those shapes to write the fold into and
        return (`torch_impl.cache.fold_buffers`: every layer's in one allocation), or None for new
        ones; the same values either way."""
        _, heads, length, d_k = k.shape
        keys, values, scale = k[0], v[0], 1.0 / math.sqrt(d_k)  # (H, S, d_k)
        query, output = self.query.weight.detach(), self.output.weight.detach()  # (out, in)
        if out is None:
            d = query.shape[1]
            out = CrossFold(keys.new_empty(d, heads * length), keys.new_empty(heads * length),
                            keys.new_empty(heads * length, d), self.output.bias.detach(), heads)
        elif out.output_bias.dtype == self.output.bias.dtype:
            out.output_bias.copy_(self.output.bias)
        else:  # a bias of another dtype is not cast here: the step's product meets it as it is
            out = out._replace(output_bias=self.output.bias.detach())
        # The scores kernel (d, H * S) contiguous, the (in, out) memory order, the faster of the two
        # for the step's one-row product here (docs/performance.md): per head Wq_h^T K_h^T, (H, d,
        # S), then the heads interleaved by rows of S, a copy of S-long runs (faster than transposing
        # K_h Wq_h's (H * S, d) element by element, the same bits: docs/performance.md,
        # "Cross-attention folded into the source")
        kernel = torch.bmm(query.view(heads, d_k, -1).transpose(1, 2), keys.transpose(1, 2))
        out.scores_kernel.view(-1, heads, length).copy_(kernel.permute(1, 0, 2)).mul_(scale)
        bias = torch.bmm(keys, self.query.bias.detach().reshape(heads, d_k, 1))[..., 0].mul_(scale)
        torch.add(bias, mask[0, :, 0, :], out=out.scores_bias.view(heads, length))  # -inf where forbidden
        folded = out.values_kernel.view(heads, length, -1)  # (H, S, d): V_h Wo_h
        torch.bmm(values, output.reshape(-1, heads, d_k).permute(1, 2, 0), out=folded)
        if keep is not None:  # a head with no key: its output is the bias alone (CrossFold)
            folded.mul_(keep[0].expand(heads, 1, 1))
        return out

    def attend(self, query_in: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
               return_weights: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`forward` with the keys and values given (``(B, H, K, d_k)``, from `keys_values` or a
        cache); the other arguments and the result are those of `forward`."""
        return self._attend(self._heads(self.query(query_in)), k, v, mask, return_weights)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                return_weights: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attend` from the per-head query ``(B, H, Q, d_k)``."""
        check_flag(return_weights, "return_weights")
        b, _, q_len, _ = q.shape
        p = self.dropout if self.training else 0.0
        weights = None
        if return_weights and q.dtype in (torch.bfloat16, torch.float16):
            # Mixed precision (autocast): scores and softmax in float32 from the half query and key
            # (their products are exact in float32), weights back to the half dtype for the product
            # with the values: what SDPA's CPU kernel does, and so what tf_impl does too (float16
            # scores overflowed where the untraced pass's did not).
            with torch.autocast(q.device.type, enabled=False):
                scores = q.float() @ k.float().transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, Q, K)
                weights = masked_softmax(scores, mask)
            context = F.dropout(weights, p, self.training).to(v.dtype) @ v  # (B, H, Q, d_k)
        elif return_weights:
            scores = q @ k.transpose(-2, -1) / math.sqrt(self.d_k)  # (B, H, Q, K)
            weights = masked_softmax(scores, mask)
            context = F.dropout(weights, p, self.training) @ v  # (B, H, Q, d_k)
        elif mask is None:
            context = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        else:
            has_key = mask.any(dim=-1, keepdim=True)  # (B|1, H|1, Q|1, 1)
            context = F.scaled_dot_product_attention(q, k, v, attn_mask=mask | ~has_key, dropout_p=p)
            context = context * has_key  # rows with no allowed key: zero context
        context = context.transpose(1, 2).reshape(b, q_len, self.n_heads * self.d_k)  # (B, Q, H*d_k)
        return self.output(context), weights

    def step_kernels(self) -> tuple[torch.Tensor, ...]:
        """``(query | key | value kernel (d, 3 * H * d_k), its bias, query kernel (d, H * d_k), its
        bias, key | value kernel (d, 2 * H * d_k), its bias, output kernel (H * d_k, d), its
        bias)``: `torch_impl.cache.StepWeights`' layout, copies detached from autograd."""
        def kernel(*linears):
            return torch.cat([lin.weight for lin in linears]).t().contiguous().detach()

        def bias(*linears):
            return torch.cat([lin.bias for lin in linears]).detach()
        qkv, kv = (self.query, self.key, self.value), (self.key, self.value)
        return (kernel(*qkv), bias(*qkv), kernel(self.query), bias(self.query), kernel(*kv), bias(*kv),
                kernel(self.output), bias(self.output))

    def attend_prepared(self, query_in: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        mask: torch.Tensor, keep: torch.Tensor | None, query: tuple | None,
                        output: tuple | None) -> torch.Tensor:
        """`attend` in inference (the cross-attention of a cached step, and of the forward pass
        without gradients): the query and output projections given as ``(kernel (in, out), bias)``
        (`step_kernels`, in a `torch_impl.cache.lay_out` layout), the mask made ready once
        (`torch_impl.cache.prepare_mask`: additive, every row may attend some key, ``keep`` zeroes
        the rows that had none; None: every row had one), no dropout, no weights.
        Shape: query_in ``(N, Q, d_model)``, k/v ``(B, H, S, d_k)``, mask broadcastable to
        ``(B, H, Q, S)`` -> ``(N, Q, d_model)``: B = N, or, with Q = 1, B items of ``N / B`` rows
        each (a beam search's step: `torch_impl.cache.DecoderCache`). With ``query`` and
        ``output`` None (a model not as built: `torch_impl.cache._as_built`) the projections are
        the modules, called."""
        n, q_len, _ = query_in.shape
        q = self.query(query_in) if query is None else dense(query_in, *query)
        if q_len == 1:  # a step (greedy or a beam search's): `_attend_source`
            context = _attend_source(q.view(n, self.n_heads * self.d_k), k, v, mask, keep)
        else:
            q = q.view(n, q_len, self.n_heads, self.d_k).transpose(1, 2)  # (N, H, Q, d_k)
            context = _zero_keyless(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), keep)
            context = context.transpose(1, 2)  # (N, Q, H, d_k)
        context = context.reshape(n, q_len, self.n_heads * self.d_k)
        return self.output(context) if output is None else dense(context, *output)

    def self_attend_prepared(self, x: torch.Tensor, mask: torch.Tensor, keep: torch.Tensor,
                             qkv: tuple, output: tuple) -> torch.Tensor:
        """Self-attention in inference (`torch_impl.stacks.Encoder.infer` and `Decoder.infer`):
        the query, key and value from one product with ``qkv``, then the ``output`` projection
        (each ``(kernel, bias)`` of `step_kernels`, in a `torch_impl.cache.lay_out` layout), the
        mask made ready once (`torch_impl.cache.prepare_mask`), no dropout, no weights. Same
        values as `forward` to rounding. Shape: x ``(B, S, d_model)``, mask (additive)
        broadcastable to ``(B, H, S, S)``, keep to ``(B, H, S, 1)`` or None -> ``(B, S, d_model)``."""
        b, length, _ = x.shape
        # (B, S, 3, H, d_k) -> three (B, H, S, d_k) views; SDPA reads them strided
        q, k, v = dense(x, *qkv).view(b, length, 3, self.n_heads, self.d_k).permute(2, 0, 3, 1, 4)
        context = _zero_keyless(F.scaled_dot_product_attention(q, k, v, attn_mask=mask), keep)  # (B, H, S, d_k)
        return dense(context.transpose(1, 2).reshape(b, length, self.n_heads * self.d_k), *output)

    def extend(self, query_in: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
               position: int, qkv: tuple | None = None, output: tuple | None = None,
               mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Self-attention of one new position over itself and every earlier one, with a cache.

        The new key and value (projections of ``query_in``) are written at ``position`` of the
        preallocated ``key_cache``/``value_cache`` ``(N, H, capacity, d_k)``, in place (no copy of
        the buffers a step), and the query attends to positions ``0 .. position``. No mask: in
        decoding pad is never generated and a finished row's output is ignored, so every earlier
        position of a live row is a real token, and the padding-AND-subsequent target mask of the
        full pass reduces to "all previous positions".

        With ``qkv`` and ``output`` (``(kernel (in, out), bias)`` of `step_kernels`, as a cache
        keeps them) the query, key and value come from one matrix product and no module is
        called; the result is the same to rounding.

        ``position`` may also be a 0-d int64 tensor on the cache's device (with ``qkv``): the key
        and value are then written with ``index_copy_`` and the query attends to the whole buffer
        masked to positions ``<= position``, so that one captured CUDA graph serves every step
        (`torch_impl.graphs`); the same values to rounding (masked keys get exactly zero weight).
        ``mask`` is then that step's `torch_impl.cache.filled_mask`, made once for every layer
        (made here when not given).

        Shape: query_in ``(N, 1, d_model)``, position an int -> ``(output (N, 1, d_model),
        key_cache, value_cache)``: the buffers written, returned as tf_impl returns its new ones,
        so that the calling code is the same in both.
        """
        check_step_kernels(qkv, output)
        if not isinstance(position, torch.Tensor):
            check_position(position, key_cache.shape[2], mask)
        if qkv is None:
            k, v = self.keys_values(query_in)  # (N, H, 1, d_k)
            key_cache[:, :, position] = k[:, :, 0]
            value_cache[:, :, position] = v[:, :, 0]
            end = position + 1
            output, _ = self.attend(query_in, key_cache[:, :, :end], value_cache[:, :, :end], None)
            return output, key_cache, value_cache
        n = query_in.shape[0]
        q, k, v = dense(query_in, *qkv).view(n, 3, self.n_heads, 1, self.d_k).unbind(1)  # (N, H, 1, d_k)
        _write_position(key_cache, k, position)
        _write_position(value_cache, v, position)
        context = _attend_filled(q, key_cache, value_cache, position, mask)  # (N, H, 1, d_k)
        return dense(context.reshape(n, 1, self.n_heads * self.d_k), *output), key_cache, value_cache
