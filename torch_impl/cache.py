"""The key/value cache of incremental decoding: what one decoding step keeps for the next.

Per decoder layer, cross-attention keys and values are computed once per source (they depend only
on the encoder memory) and self-attention keys and values grow by one position a step. Rows are
``n = item * beams + beam`` (``beams = 1`` for greedy), the row order of `shared.decoding`.

Self-attention keys/values live in buffers preallocated for ``capacity`` positions and written in
place at the current position, rather than concatenated along the length axis each step. The two
measured equally fast on the CPU (docs/performance.md, "The key/value buffer"): a step is dominated
by reading the weights, concatenation copies the growing cache, attention over a buffer slice reads
it strided. The buffer wins on the rest: no allocation per step, and it is the fixed-shape state a
compiled loop (tf_impl's ``tf.while_loop``, XLA, a CUDA graph) needs, so both backends keep one
design.

Every update is written in place (torch tensors are mutable) and the updated object is also
returned (`MultiHeadAttention.extend` returns the buffers, `DecoderLayer.step` the layer cache,
`Transformer.decode_step` ``(logits, cache)``, `DecoderCache.reorder_beams` the cache), so that the
code that uses a cache is the same as tf_impl's, whose caches are immutable tuples.

Used through `torch_impl.Transformer.init_cache` and `.decode_step`; `torch_impl.search` gives the
loops that drive them (the `shared.decoding` spec, with the cache as the step's state).

The weights a step reads are laid out for it once and kept (`StepWeights`, `step_layout`,
`lay_out`, `in_one_buffer`, `dense`); the forward pass in inference reads the same (`EncoderWeights`
for its encoder), under the rule of `_inferring` and kept by `_prepared`.
"""
from __future__ import annotations

import math
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from torch import nn
from torch.nn.modules import module as _modules  # the registries of global forward hooks

from shared.checks import check_beam_rows, check_beam_rows_items

from .inputs import _is_integer


class StepWeights(NamedTuple):
    """One decoder layer's weights laid out for inference: a decoding step, and the forward pass
    without gradients (`Transformer.forward`). The self-attention's query, key and value are stacked
    into one kernel, as are the cross-attention's key and value, and every kernel is in the layout
    of `step_layout` (made by `lay_out`; `dense` multiplies by either).

    Why: a step multiplies one row per hypothesis by each kernel, and there the layout decides the
    speed: ``nn.Linear``'s ``(out, in)`` weight read through MKL's sgemm was several times slower
    than an ``(in, out)`` copy or a oneDNN-packed one (docs/performance.md, "Kernel layouts").
    Stacked projections make one product of three (or two), and, in a half precision, the copies
    are cast once rather than by autocast at every call. `torch_impl.Transformer` keeps these
    copies while its parameters are unchanged (their version counters say so), one set per layout.
    """
    qkv_kernel: torch.Tensor  # (d, 3 * H * d_k): query | key | value
    qkv_bias: torch.Tensor
    self_output_kernel: torch.Tensor  # (H * d_k, d)
    self_output_bias: torch.Tensor
    cross_query_kernel: torch.Tensor  # (d, H * d_k)
    cross_query_bias: torch.Tensor
    cross_kv_kernel: torch.Tensor  # (d, 2 * H * d_k): key | value, applied to the encoder memory
    cross_kv_bias: torch.Tensor
    cross_output_kernel: torch.Tensor  # (H * d_k, d)
    cross_output_bias: torch.Tensor
    inner_kernel: torch.Tensor  # (d, d_ff)
    inner_bias: torch.Tensor
    outer_kernel: torch.Tensor  # (d_ff, d)
    outer_bias: torch.Tensor


class EncoderWeights(NamedTuple):
    """One encoder layer's weights laid out for inference (`Encoder.infer`: a decode's encoder
    pass, and the forward pass without gradients): the query, key and value stacked into one
    kernel, every kernel in a `lay_out` layout, in a half precision cast once.

    Why: an encoder pass multiplies ``B * S`` rows by every kernel, and MKL's sgemm behind
    ``nn.Linear`` is the slow product there on the CPU; oneDNN's packed kernels take less than half
    its time (docs/performance.md, "Kernel layouts"). `torch_impl.Transformer` keeps them, as the
    step's, while its parameters are unchanged.
    """
    qkv_kernel: torch.Tensor  # (d, 3 * H * d_k): query | key | value
    qkv_bias: torch.Tensor
    output_kernel: torch.Tensor  # (H * d_k, d)
    output_bias: torch.Tensor
    inner_kernel: torch.Tensor  # (d, d_ff)
    inner_bias: torch.Tensor
    outer_kernel: torch.Tensor  # (d_ff, d)
    outer_bias: torch.Tensor


# -- kernel layouts -------------------------------------------------------------------------------
# A step's products have as many rows as the search has hypotheses (N = batch * beams). MKL's sgemm
# repacks the whole weight matrix at every call, which costs more than the product at a few rows;
# oneDNN's kernel reads weights packed once, ahead of time, for its own blocking, and one packing
# (for 8 rows) serves every row count. At one row, though, MKL's matrix-vector path (addmm on one
# row) streams the kernels faster than the packed kernel on most CPUs measured: every Intel Xeon,
# and three of the four kinds of AMD EPYC (by 1.2x to 1.6x; the fourth favoured packed by 1.4x).
# So a step is packed from 2 rows on every CPU and dense at one. From 2 rows packed is as fast as
# dense or faster on every CPU measured but one (dense 8% faster there), and from 8 rows faster on
# every CPU. `python3 dev.py bench step_layouts` times both on `base`'s step products (its 36 decoder
# kernels and the 37000 x 512 output projection, from memory as in a step), `benchmarks/
# packed_rows.py` whole decodes; docs/performance.md ("The CPU contenders on two CPUs", "One row
# dense on every CPU") has the figures. `PACKED_MIN_ROWS` is the one setting to change
# (``torch_impl.cache.PACKED_MIN_ROWS = 1``, read at every decode) on a machine where packed wins
# at one row. It is a constant, never timed at run time: both layouts give the same values to
# float32 rounding, not the same bits, and a near tie's token must not depend on the machine's load.
DENSE, PACKED = "dense (in, out)", "packed for oneDNN"
DENSE_OUT_IN = "dense, (out, in) in memory"  # float16 on a CPU at one row: see `step_layout`
WIDENED = "float16 values packed as float32 for oneDNN"  # float16 on a CPU from two rows
_WIDENED_MIN_ROWS = 2  # float16 on a CPU: from this many rows WIDENED, below DENSE_OUT_IN
PACKED_MIN_ROWS = 2  # float32 on a CPU: from this many rows up, packed; fewer: addmm
_PACKING_ROWS = 8  # the row count the packing is tuned for (any count runs on it, see above)


def step_layout(rows: int | None, device: torch.device, dtype: torch.dtype) -> str:
    """The kernel layout of a step over ``rows`` rows (`DENSE`, `DENSE_OUT_IN`, `PACKED` or
    `WIDENED`) whose products are in ``dtype``: packed where oneDNN's packed-weight kernel exists
    (on the CPU, with a torch that has it) for float32 from `PACKED_MIN_ROWS` rows, and for
    bfloat16 at every row count where the CPU has bfloat16 instructions (AVX512-BF16, AMX);
    float16 on the CPU `WIDENED` from two rows, `DENSE_OUT_IN` at one; else (fewer rows, float64,
    CUDA, ``rows`` None: unknown) dense ``(in, out)`` for ``torch.addmm``.

    float16 on the CPU: torch's float16 addmm (a CPU without float16 instructions) reads an
    ``(out, in)``-contiguous kernel several times faster than an ``(in, out)``-contiguous one, so
    at one row every float16 kernel is stored that way (`lay_out`); from two rows oneDNN's float32
    packed kernel over the same float16 values (`WIDENED`: kernel and rows rounded to float16,
    then widened exactly, the sum in float32, the result rounded to float16: the rounding points
    of a float16 product, as torch's CPU kernel and cuBLAS's default compute them, in a different
    order) is several times faster. oneDNN packs float16 itself only on a CPU with float16
    instructions (AVX512-FP16, AVX-NE-CONVERT), not measured. bfloat16 packed is several times
    faster than bfloat16 addmm where the CPU has bfloat16 instructions; not measured on an Intel
    CPU. The figures: docs/performance.md, "bfloat16 decoding on the CPU" and "float16 decoding on
    the CPU"."""
    if rows is None or device.type != "cpu":
        return DENSE
    packable = (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
                and hasattr(torch.ops.mkldnn, "_linear_pointwise"))
    if dtype == torch.float32 and packable:
        return PACKED if rows >= PACKED_MIN_ROWS else DENSE
    if dtype == torch.bfloat16 and packable and torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return PACKED
    if dtype == torch.float16:
        return WIDENED if packable and rows >= _WIDENED_MIN_ROWS else DENSE_OUT_IN
    return DENSE


def lay_out(kernel: torch.Tensor, layout: str) -> torch.Tensor:
    """An ``(in, out)`` kernel in ``layout``: packed by oneDNN (`PACKED`: an opaque ``is_mkldnn``
    tensor of shape ``(out, in)`` that only `dense` reads; `WIDENED`: the same, of the kernel's
    float16 values widened to float32), or (`DENSE`) an ``(in, out)`` tensor
    whose longer axis is the contiguous one: one row times a widening kernel (in <= out) reads it
    row by row, a narrowing one (in > out) as dot products along ``in``: each the faster order
    for one row (docs/performance.md, "Kernel layouts")."""
    if layout == PACKED:
        return torch.ops.mkldnn._reorder_linear_weight(kernel.t().contiguous(), _PACKING_ROWS)
    if layout == WIDENED:  # the float16 values, exactly, in float32 (the bias stays float16: `dense`)
        kernel = kernel.to(torch.float16).float()
        return torch.ops.mkldnn._reorder_linear_weight(kernel.t().contiguous(), _PACKING_ROWS)
    if layout == DENSE_OUT_IN or kernel.shape[0] > kernel.shape[1]:  # (out, in) in memory, seen as (in, out)
        return kernel.t().contiguous().t()
    return kernel.contiguous()


def lay_out_weights(weights: StepWeights | EncoderWeights, layout: str,
                    dtype: torch.dtype | None = None) -> StepWeights | EncoderWeights:
    """`StepWeights` or `EncoderWeights` with every kernel in ``layout`` (`lay_out`) and, with
    ``dtype`` (a half precision's, `torch_impl.precision.compute_dtype`), every kernel and bias
    cast to it first, once, so that autocast has nothing to cast at each step."""
    def prepared(name: str, w: torch.Tensor) -> torch.Tensor:
        w = w if dtype is None else w.to(dtype)
        return lay_out(w, layout) if name.endswith("_kernel") else w
    return type(weights)(*(prepared(name, w) for name, w in zip(weights._fields, weights)))


_ALIGNMENT = 64  # bytes: c10's CPU allocator aligns every allocation so (and AVX-512 asks no more)


def in_one_buffer(layers: list[StepWeights], device: torch.device) -> list[StepWeights]:
    """``layers`` with every tensor a step reads copied into one new buffer, in the order a step
    reads them (the fields' order, layer after layer; not ``cross_kv``, which a decode applies
    once per source), on the CPU where their layout is of plain strided tensors (`DENSE`,
    `DENSE_OUT_IN`); elsewhere ``layers`` themselves (oneDNN allocates its packed tensors; on CUDA
    not measured).

    Why: at a few rows a step streams its kernels from memory, and on the CPU one allocation read
    in order streams faster than the same kernels allocated apart (docs/performance.md, "A step's
    kernels in one buffer"). Each copy keeps its tensor's shape, strides and values, at an offset
    aligned as every torch allocation is (`_ALIGNMENT`), so a product takes the same path and
    gives the same bits."""
    if device.type != "cpu" or not layers:
        return layers
    return _fields_in_one_buffer(layers, [name for name in StepWeights._fields if not name.startswith("cross_kv")])


def fold_buffers(layers: int, d_model: int, heads: int, src_len: int, dtype: torch.dtype,
                 device: torch.device) -> list[CrossFold | None]:
    """Empty `CrossFold` tensors for ``layers`` layers' folds of a ``src_len``-token source, in one
    new allocation in the order a step reads them, on the CPU, as `in_one_buffer` keeps the step's
    kernels and for the same reason (a layer's two folded kernels are smaller than a huge page, 2
    MB; every layer's together are not), for `MultiHeadAttention.fold_source` to write into (no
    copy after); elsewhere one None a layer (each fold makes its own tensors)."""
    if device.type != "cpu":
        return [None] * layers
    shapes = [(d_model, heads * src_len), (heads * src_len,), (heads * src_len, d_model), (d_model,)]
    flat = iter(_one_allocation([math.prod(shape) for shape in shapes] * layers, dtype, device))
    return [CrossFold(*(next(flat).view(shape) for shape in shapes), heads) for _ in range(layers)]


def _fields_in_one_buffer(tuples: list, names: list[str]) -> list:
    """``tuples`` (NamedTuples) with their fields ``names`` replaced by copies in one allocation
    (`_in_one_allocation`), tuple after tuple; ``tuples`` themselves where it declines (oneDNN's
    packed tensors, or tensors of mixed dtypes)."""
    copies = _in_one_allocation([getattr(t, name) for t in tuples for name in names])
    if copies is None:
        return tuples
    copies = iter(copies)
    return [t._replace(**{name: next(copies) for name in names}) for t in tuples]


def _in_one_allocation(tensors: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Copies of plain strided CPU ``tensors`` of one dtype in one new allocation (`_one_allocation`),
    in the order given, each with its own shape, strides and values; None where one is oneDNN's
    packed tensor or of another dtype."""
    dtype = tensors[0].dtype
    if any(t.is_mkldnn or t.dtype != dtype for t in tensors):  # packed, or kernels and biases apart
        return None
    flat = _one_allocation([t.numel() for t in tensors], dtype, tensors[0].device)
    return [part.as_strided(t.shape, _dense_strides(t)).copy_(t) for part, t in zip(flat, tensors)]


def _one_allocation(sizes: list[int], dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """Flat views of one new (uninitialised) allocation, one of each of ``sizes`` elements, in the
    order given, each at an offset aligned as every torch allocation is (`_ALIGNMENT`), so that a
    product on one takes the path it would take on a tensor of its own."""
    step = _ALIGNMENT // dtype.itemsize
    offsets, end = [], 0
    for size in sizes:
        offsets.append(end)
        end += -(-size // step) * step
    buffer = torch.empty(end, dtype=dtype, device=device)
    return [buffer[at:at + size] for at, size in zip(offsets, sizes)]


def _dense_strides(t: torch.Tensor) -> tuple[int, ...]:
    """The strides of ``t``'s order of axes in memory (innermost: the smallest stride) without
    gaps: ``t``'s own for a contiguous tensor or a transposed one, as `lay_out` makes them."""
    strides, size = [0] * t.dim(), 1
    for axis in sorted(range(t.dim()), key=lambda a: (t.stride(a), -a)):
        strides[axis], size = size, size * t.shape[axis]
    return tuple(strides)


def dense(x: torch.Tensor, kernel: torch.Tensor, bias: torch.Tensor, relu: bool = False) -> torch.Tensor:
    """``x @ kernel + bias`` in one product, with ``kernel`` in any layout of `lay_out`, and with
    ``relu`` the rectifier applied in the same call (oneDNN's post-op on a packed kernel,
    ``torch._addmm_activation`` otherwise: cuBLASLt's epilogue on CUDA, addmm then the rectifier
    in place on the CPU): the feed-forward network's inner layer, one launch, or one operation,
    fewer a layer and step. ``(..., in) -> (..., out)``. Same values to
    rounding (the summation order differs); the rectifier itself is exact. A `WIDENED` kernel
    (float32, packed) comes with its float16 bias, and the product is float16's: ``x`` rounded to
    float16, the sum in float32, the result rounded to float16."""
    flat = x.dim() == 2  # rows already: a step's (no reshape and view a product)
    rows = x if flat else x.reshape(-1, x.shape[-1])
    if kernel.is_mkldnn:
        if kernel.dtype == torch.float32 and bias.dtype == torch.float16:  # WIDENED
            rows = rows.to(torch.float16).float()  # rounded as autocast rounds a product's input
            out = torch.ops.mkldnn._linear_pointwise(rows, kernel, bias.float(), "relu" if relu else "none",
                                                     [], "").to(torch.float16)
        else:  # PACKED: (out, in); a bfloat16 kernel takes bfloat16 rows (autocast's cast)
            out = torch.ops.mkldnn._linear_pointwise(rows.to(kernel.dtype), kernel, bias,
                                                     "relu" if relu else "none", [], "")
    elif relu:  # not on autocast's lists (addmm is): the rows cast as it would cast them
        out = torch._addmm_activation(bias, rows if rows.dtype == kernel.dtype else rows.to(kernel.dtype),
                                      kernel)
    else:
        out = torch.addmm(bias, rows, kernel)
    return out if flat else out.view(*x.shape[:-1], out.shape[1])


def _inferring(module: torch.nn.Module, *inputs: torch.Tensor) -> bool:
    """Whether a pass of ``module`` on ``inputs`` (its float inputs) may run on weights laid out
    for inference (`_prepared`): eval mode (no dropout), no gradient to record (gradients off, or
    a frozen module, ``requires_grad_(False)``, on inputs that need none: a frozen teacher inside
    a student's training step), the modules as built (`_as_built`), and the parameters the
    module's own:
    - nothing tracing it: ``torch.compile`` or ``torch.export`` (whose graph the kept weights'
      key, read from pointers, would break), ``torch.jit.trace`` and the ONNX exporter built on it
      (which would record oneDNN's packed tensors as constants): a traced program gets the
      modules, which it records whole;
    - no ``torch.func`` transform (``vmap`` over ``functional_call``, an ensemble's stacked
      parameters: batched tensors have no storage to key on);
    - not a ``nn.DataParallel`` replica (its parameters are new tensors at every call: the
      weights would be laid out again each time, for nothing)."""
    if (module.training or torch.compiler.is_compiling()
            or torch.jit.is_tracing() or torch._C._are_functorch_transforms_active()
            or getattr(module, "_is_replica", False)):
        return False
    recording = torch.is_grad_enabled()
    if recording and any(x.requires_grad for x in inputs):
        return False
    return _as_built(module, frozen=recording)


# The module types whose weights inference may read instead of calling them (`_as_built`): the
# torch.nn classes torch_impl builds its models from, and torch_impl's own classes, added as met.
_BUILT_FROM = {nn.Linear, nn.Embedding, nn.Dropout, nn.ModuleList}
# A parameter inference may read: a Parameter, or the plain tensor ``torch.func.functional_call``
# puts in its place; not a tensor subclass (a weight-only quantization's packed weights).
_PLAIN_TENSORS = frozenset({nn.Parameter, torch.Tensor})


def _as_built(module: torch.nn.Module, frozen: bool = False) -> bool:
    """Whether every submodule of ``module`` computes what reading its weights computes, so that
    the inference pass and decoding may read them (`StepWeights`) instead of calling the modules:
    - each of a type torch_impl builds (`_BUILT_FROM`, or a class of torch_impl's own), not a
      replacement: no quantized module (``torch.ao.quantization.quantize_dynamic``), no adapter
      wrapping a Linear (LoRA), no subclass, no parametrized module (``torch.nn.utils.
      parametrize`` and ``parametrizations.weight_norm`` swap the class);
    - its parameters plain tensors (`_PLAIN_TENSORS`), the root's too;
    - no forward hook or pre-hook on any of them, nor a global one (feature extraction,
      ``torchinfo``, ``torch.nn.utils.prune``'s pre-hooks): hooks fire only on a module's call;
    - with ``frozen``, no parameter requiring a gradient.
    Otherwise the modules run, as they would in any ``nn.Module``: the same results, slower."""
    if _modules._global_forward_hooks or _modules._global_forward_pre_hooks:
        return False
    below = list(module._modules.values())
    for p in module._parameters.values():
        if p is not None and (type(p) not in _PLAIN_TENSORS or frozen and p.requires_grad):
            return False
    while below:  # a plain loop: this runs at every inference call (docs/performance.md)
        sub = below.pop()
        if sub is None:
            continue
        kind = type(sub)
        if kind not in _BUILT_FROM:
            if not kind.__module__.startswith("torch_impl."):
                return False
            _BUILT_FROM.add(kind)  # one of torch_impl's classes (a bounded set)
        if sub._forward_hooks or sub._forward_pre_hooks:
            return False
        for p in sub._parameters.values():
            if p is not None and (type(p) not in _PLAIN_TENSORS or frozen and p.requires_grad):
                return False
        below.extend(sub._modules.values())
    return True


def _plain_linear(linear: torch.nn.Module) -> bool:
    """Whether ``linear`` is an ``nn.Linear`` as built, whose ``weight`` and ``bias`` a product may
    read instead of calling it (`_as_built`'s rule for one module): the modules' pass stacks such
    projections (`torch_impl.attention.MultiHeadAttention._project`) and calls any other."""
    return (type(linear) is nn.Linear and not (linear._forward_hooks or linear._forward_pre_hooks)
            and type(linear.weight) in _PLAIN_TENSORS
            and not (_modules._global_forward_hooks or _modules._global_forward_pre_hooks))


def _parameters(module: torch.nn.Module):
    """Every parameter of ``module`` and its submodules (a shared one as often as it is held), by
    walking ``_modules``: what `_prepared`'s key reads at every inference call, twice as fast as
    ``module.parameters()``, which builds every submodule's name."""
    below = [module]
    while below:
        sub = below.pop()
        yield from (p for p in sub._parameters.values() if p is not None)
        below.extend(m for m in sub._modules.values() if m is not None)


@contextmanager
def _mode(module: torch.nn.Module, training: bool):
    """``module`` and every submodule in train (``training``) or eval mode inside the block, each
    back to its own mode after. ``module.train(was)`` would set every submodule to the root's, so
    a submodule the caller had put in another mode (an encoder in eval under a training model)
    would lose it. Where every module already is in that mode nothing is set: a decode of a model
    in eval walks its modules once instead of setting every module's flag twice (``train`` is a
    Python call per module; docs/performance.md, "GPU")."""
    below, modes = [module], []
    while below:  # a plain walk, as `_parameters`: this runs at every decode and training step
        sub = below.pop()
        modes.append((sub, sub.training))
        below.extend(m for m in sub._modules.values() if m is not None)
    if all(was == training for _, was in modes):
        yield
        return
    module.train(training)
    try:
        yield
    finally:
        for sub, was in modes:
            sub.training = was  # as ``train`` sets each module's own flag


def _prepared(owner: torch.nn.Module, name: str, tensors, make):
    """``make()``, weights of ``owner`` laid out for inference, made once and kept in its
    ``_prepared_weights`` under ``name`` while ``tensors`` (the parameters they are made from) are
    unchanged: the key is each one's storage and version counter, which any in-place update (an
    optimizer step, ``import_weights``, ``.to()``) changes. Caches, not state: an owner's
    ``__getstate__`` leaves them out."""
    key = tuple((p.data_ptr(), p._version, p.device, p.dtype) for p in tensors)
    kept = owner.__dict__.setdefault("_prepared_weights", {})
    if kept.get(name, (None,))[0] != key:
        # Ordinary tensors even when a decode (under torch.inference_mode) asks first: they
        # outlive it, and a later decode_step outside inference mode (float64: addmm, which
        # saves its kernel for backward when the input records gradients) could not use an
        # inference tensor.
        with torch.inference_mode(False), torch.no_grad():
            kept[name] = (key, make())
    return kept[name][1]


# A cache's weights where its steps call the modules (a model not as built, `_as_built`): an
# empty structure rather than None, as in tf_impl, whose ``tf.while_loop`` state cannot hold None.
NO_WEIGHTS = ()


def projection(weights, name: str) -> tuple | None:
    """The ``(kernel, bias)`` named ``name`` (``"qkv"``, ``"cross_kv"``, ``"inner"``, ...: the
    ``NAME_kernel`` and ``NAME_bias`` fields) of a layer's laid-out weights (`StepWeights`,
    `EncoderWeights`), or None where a cache keeps `NO_WEIGHTS` (a model not as built: the modules
    are called)."""
    return (getattr(weights, f"{name}_kernel"), getattr(weights, f"{name}_bias")) if weights else None


class CrossFold(NamedTuple):
    """A decode's cross-attention over one item's source folded into two products
    (`folds_source`, made by `torch_impl.attention.MultiHeadAttention.fold_source`): per head ``h``
    the query and output projections multiplied into the source's keys and values,

        scores = h Wq_h K_h^T / sqrt(d_k) + bq_h K_h^T / sqrt(d_k) + mask    (the scores kernel, bias)
        out    = sum_h softmax(scores_h) (V_h Wo_h) + bo                      (the values kernel)

    the same sums as the query product, attention and output product, in another order (the same
    values to rounding). Why: at one item a step reads these ``2 * d * H * S`` numbers instead of
    the ``2 * d * H * d_k`` of the two kernels and the ``2 * H * S * d_k`` of the keys and values,
    fewer where the source is short, and runs two products and a softmax instead of two products
    and SDPA (docs/performance.md, "Cross-attention folded into the source").

    Shape: scores_kernel ``(d, H * S)`` and values_kernel ``(H * S, d)``, contiguous, columns and
    rows ``h * S + s``; scores_bias ``(H * S,)``, -inf at a position the mask forbids (an item with
    no source key: 0 everywhere, and its values kernel 0, so that its output is the output bias,
    as attention's zeroed context gives); output_bias ``(d,)``; all in the keys' dtype."""
    scores_kernel: torch.Tensor
    scores_bias: torch.Tensor
    values_kernel: torch.Tensor
    output_bias: torch.Tensor
    heads: int


def folds_source(items: int, src_len: int, d_model: int, d_k: int, device: torch.device,
                 keys_dtype: torch.dtype, model_dtype: torch.dtype) -> bool:
    """Whether a decode's cache folds its cross-attention (`CrossFold`): on the CPU, one item (a
    batch of one: greedy, or a beam search's beams of one source), keys in the model's own dtype
    (not a half precision's, whose products autocast casts), and a source short enough that the
    folded kernels hold fewer numbers than what they replace: ``d * H * S < d * H * d_k + H * S *
    d_k``, that is ``S * (d - d_k) < d * d_k`` (``S`` < 74 for ``base``). Not on CUDA, where a
    step is bound by launches, not by what it reads: there the fold saves a graphed step about
    0.04 ms and costs a decode about 3 ms to make, more than 64 tokens win back (measured,
    docs/performance.md, "Cross-attention folded into the source"). `torch_impl.graphs` refills
    a kept graph's fold all the same, so that the graphs hold for any cache."""
    return (items == 1 and device.type == "cpu" and keys_dtype == model_dtype
            and src_len * (d_model - d_k) < d_model * d_k)


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values, per head.

    Shape:
        self_keys_values: ``(2, N, H, capacity, d_k)``, the self-attention's keys (``[0]``) and
            values (``[1]``) in one buffer, so that a step writes its new key and value with one
            copy (on CUDA one kernel of a graph's step) and a beam search gathers both with one
            (`DecoderCache.reorder_beams`); positions ``0 .. length - 1`` of the owning
            `DecoderCache` are filled, the rest is scratch.
        self_key, self_value: its two halves, ``(N, H, capacity, d_k)`` views of it (not
            arguments: made from it), as attention reads them.
        cross_key, cross_value: ``(B, H, S, d_k)``, from the encoder memory, never changed: once
            per source item, not per beam (the owning `DecoderCache`'s N rows are B items of
            ``N / B`` beams, and each item's rows attend its keys as that item's queries).
        weights: the layer's weights as a step reads them (`StepWeights`), taken when the cache
            is made: a cache is valid for the weights of that moment. `NO_WEIGHTS` for a model
            not as built (`_as_built`): its steps call the modules.
        norms: ``((gamma, beta) of the self-attention's norm, the cross-attention's, the
            feed-forward's)``, the layer's own parameters (detached), which its steps read
            instead of calling the norm modules (`torch_impl.layers.DecoderLayer.step`);
            `NO_WEIGHTS` where ``weights`` is.
        cross_fold: the cross-attention folded into the source (`CrossFold`) where
            `folds_source` says so, which the steps then read instead of the cross-attention's
            query and output kernels and the keys and values; else None.
    """
    self_keys_values: torch.Tensor
    cross_key: torch.Tensor
    cross_value: torch.Tensor
    weights: "StepWeights | tuple[()]"
    norms: "tuple[tuple[torch.Tensor, torch.Tensor], ...]" = NO_WEIGHTS
    cross_fold: CrossFold | None = None
    self_key: torch.Tensor = field(init=False, repr=False)
    self_value: torch.Tensor = field(init=False, repr=False)

    def __post_init__(self):
        both = self.self_keys_values
        if not isinstance(both, torch.Tensor):
            raise TypeError(f"self_keys_values: expected a torch.Tensor, got {type(both).__name__}")
        if both.dim() != 5 or both.shape[0] != 2:
            raise ValueError(f"self_keys_values: expected the keys and values in one tensor of shape "
                             f"(2, N, H, capacity, d_k), got shape {tuple(both.shape)}")
        # Made in grad mode, by `select`: autograd refuses a view made under no_grad (as
        # `init_cache` runs) once a step writes its base in grad mode (a `decode_step` outside
        # no_grad, whose embedded tokens require grad), and `unbind`'s views in either mode.
        with torch.enable_grad():
            self.self_key, self.self_value = both.select(0, 0), both.select(0, 1)

    def updated(self, self_key: torch.Tensor, self_value: torch.Tensor) -> "LayerCache":
        """This layer's cache holding the self-attention buffers of a step (those
        `MultiHeadAttention.extend` returns: here its own halves, written in place); returns
        ``self``, where tf_impl returns a new cache."""
        if self_key is not self.self_key or self_value is not self.self_value:
            raise ValueError("self_key, self_value: expected this cache's own buffers, written in place, "
                             "got other tensors")
        return self


@dataclass
class DecoderCache:
    """The state of incremental decoding for ``N`` rows.

    Attributes:
        layers: one `LayerCache` per decoder layer.
        src_mask: ``(B|1, 1|H, 1, S)``, the source padding for cross-attention, prepared once
            (`prepare_mask`): in SDPA's additive form (0 = may attend, -inf = may not) in the keys'
            dtype; a row with no key may attend every key, and ``src_keep`` zeroes its output after.
        src_keep: ``(B|1, 1|H, 1, 1)`` in the keys' dtype, 0 for an item with no source key, else 1;
            None where every row has a key.
        generator: the output projection as a step reads it, ``(kernel (d, V), bias (V,))``
            (the tied table transposed, or the generator's own kernel), the kernel in the
            layout of the layers' (`step_layout`); `NO_WEIGHTS` where the layers' are (the
            generator module is called).
        length: positions already decoded; the next token goes to position ``length`` (and gets
            row ``length`` of the positional table).
    """
    layers: list[LayerCache]
    src_mask: torch.Tensor
    src_keep: torch.Tensor | None
    generator: tuple[torch.Tensor, torch.Tensor] | tuple[()]
    length: int = 0

    @property
    def capacity(self) -> int:
        """The most positions the self-attention buffers hold (``max_len`` of `init_cache`)."""
        return self.layers[0].self_key.shape[2] if self.layers else 0

    @property
    def rows(self) -> int:
        return self.layers[0].self_key.shape[0] if self.layers else self.src_mask.shape[0]

    def _check_writable(self) -> None:
        """Refuses, naming ``cache`` and before anything is written, a call outside
        ``torch.inference_mode()`` on a cache made inside it: its buffers are inference tensors,
        which torch writes only in that mode (its own error names no argument). A cache made under
        ``torch.no_grad()`` serves either mode. Called by the public calls that write it
        (`Transformer.decode_step`, `reorder_beams`); the searches make and step theirs in one mode."""
        if self.layers and self.layers[0].self_keys_values.is_inference() and not torch.is_inference_mode_enabled():
            raise ValueError("cache: expected a call under torch.inference_mode(), in which the cache was "
                             "made (torch writes its tensors only there), got one outside it; or make the "
                             "cache under torch.no_grad()")

    def advanced(self, layers: list[LayerCache]) -> "DecoderCache":
        """The cache after one decoding step: ``layers`` (from each `DecoderLayer.step`) and one
        more position filled. Updates ``self`` and returns it (tf_impl returns a new cache)."""
        self.layers, self.length = list(layers), self.length + 1
        return self

    def reorder_beams(self, rows: torch.Tensor) -> "DecoderCache":
        """Let row ``n`` continue from row ``rows[n]`` (beam search's source beam): gathers the
        filled self-attention positions, in place, and returns ``self``.

        ``rows[n]`` must belong to the same source item as ``n`` (``rows[n] // beams == n // beams``),
        as beam search's are: cross-attention keys/values and the source mask are kept once per
        item, so they stay as they are. Checked (`shared.checks.check_beam_rows`, reading ``rows``
        from the device); beam search calls `_reorder_beams`, unchecked.

        Shape: rows ``(N,)`` integer, on any device (moved to the cache's).
        """
        if not isinstance(rows, torch.Tensor):
            raise TypeError(f"rows: expected a torch.Tensor, got {type(rows).__name__}")
        check_beam_rows(rows.shape, str(rows.dtype)[6:], _is_integer(rows.dtype), self.rows)
        items = self.layers[0].cross_key.shape[0] if self.layers else self.rows
        check_beam_rows_items(rows.tolist(), self.rows // items)
        self._check_writable()
        return self._reorder_beams(rows.to(self.src_mask.device, torch.int64))

    def _reorder_beams(self, rows: torch.Tensor) -> "DecoderCache":
        """`reorder_beams` without the checks: ``rows`` int64 ``(N,)``, each within its item.

        On the CPU, where at most half the rows change (``rows[n] != n``), only those are copied
        (each twice, out and back, since a row may be read after another is written): the copies
        grow with the filled positions, to over a tenth of a late beam step at batch 8, where
        about 40% of the rows change; ``index_copy_`` of a few rows is slower per byte than a copy
        of all, hence the half (docs/performance.md, "Beam search on the CPU"). A GPU gathers
        every row, as choosing them would read the device at every step."""
        end = self.length
        targets = None
        if rows.device.type == "cpu":
            changed = (rows != torch.arange(len(rows))).nonzero().view(-1)
            if not len(changed):
                return self
            if 2 * len(changed) <= len(rows):
                targets, rows = changed, rows[changed]
        for layer in self.layers:  # keys and values together, rows first: (N, 2, H, end, d_k)
            filled = layer.self_keys_values.transpose(0, 1).narrow(3, 0, end)
            gathered = filled.index_select(0, rows)  # a copy: a source row may be a target too
            if targets is None:
                filled.copy_(gathered)
            else:
                filled.index_copy_(0, targets, gathered)
        return self


def prepare_mask(mask: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A source mask made ready once per source rather than in every layer (at every step, for
    cross-attention; per layer, for decoding's encoder pass, `Encoder.infer`): ``(bias, keep)``.

    ``bias`` is the mask in the form SDPA adds to the scores, in ``dtype`` (the query's): 0 where
    the key may be attended, -inf where not. SDPA makes that form from a bool mask at every call
    (one ``where`` kernel each); made here once, a step of base launches six fewer kernels. SDPA
    returns NaN for a row with no allowed key, so such a row attends every key and ``keep`` (0 for
    it, 1 for the others, in ``dtype``) zeroes its output after (docs/design.md, convention 3);
    ``keep`` is None where every row has a key (nothing to zero: no multiply a layer). Deciding
    that reads one bool from the device, once per source.

    Shape: mask bool, True = may attend, ``(N|1, 1|H, Q|1, S)`` -> ``(the same shape in dtype,
    (N|1, 1|H, Q|1, 1) in dtype or None)``.
    """
    has_key = mask.any(dim=-1, keepdim=True)
    bias = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    bias.masked_fill_(~(mask | ~has_key), float("-inf"))
    return bias, None if bool(has_key.all()) else has_key.to(dtype)


def filled_mask(capacity: int, position: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The mask of a CUDA graph's step over the whole key/value buffer (`torch_impl.graphs`), in
    SDPA's additive form (`prepare_mask`): 0 at positions ``0 .. position`` (filled: may attend),
    -inf after. Made once a step for every layer (`Transformer._step_logits`), not per layer.

    Shape: position 0-d int64 on the buffers' device -> ``(1, 1, 1, capacity)`` in ``dtype``."""
    later = torch.arange(capacity, device=position.device) > position
    bias = torch.zeros(capacity, dtype=dtype, device=position.device).masked_fill_(later, float("-inf"))
    return bias.view(1, 1, 1, capacity)


def repeat_rows(x: torch.Tensor, beams: int) -> torch.Tensor:
    """Repeat each row ``beams`` times along axis 0: row ``b`` -> rows ``b * beams`` to
    ``b * beams + beams - 1``. A tensor with a batch axis of 1 broadcasts and is returned as is."""
    return x if beams == 1 or x.shape[0] == 1 else x.repeat_interleave(beams, dim=0)
