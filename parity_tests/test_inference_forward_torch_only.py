"""torch_impl's forward pass in inference: in eval mode without gradients and without a trace, the
pass runs on weights laid out once and kept (`torch_impl.cache.StepWeights`, `EncoderWeights`:
query, key and value stacked, every kernel in the layout of the pass's row count, half copies in a
half precision) instead of the modules. It must give the oracle's values within the bounds the
modules meet, in every layout and precision; cast no weight at the call; follow the parameters
when they change; and leave every other pass (gradients, training mode, traces, torch.compile) on
the modules. tf_impl has no second path (its forward is one graph), so the contract is torch's."""
import collections

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_impl  # noqa: E402
import torch_impl.model  # noqa: E402
from parity_tests.matrix import VARIANTS  # noqa: E402
from parity_tests.torch_support import build  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import assert_close, bound_for, max_rel_diff  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from torch_impl.cache import DENSE, DENSE_OUT_IN, PACKED, WIDENED, step_layout  # noqa: E402
from torch_impl.precision import set_precision  # noqa: E402

CPU = torch.device("cpu")


def _packs(dtype: torch.dtype) -> bool:
    return step_layout(64, CPU, dtype) in (PACKED, WIDENED)


# (model dtype, precision, layout): each precision in the layouts a CPU can run it in
CASES = [("float64", "float32", DENSE), ("float32", "float32", DENSE), ("float32", "float32", PACKED),
         ("float32", "bfloat16", DENSE), ("float32", "bfloat16", PACKED),
         ("float32", "float16", DENSE_OUT_IN), ("float32", "float16", WIDENED)]


def _case(variant: str, dtype: str):
    config = VARIANTS[variant].replace(dtype=dtype, dropout=0.1)  # dropout: eval must switch it off
    weights = random_weights(config, 0)
    src, tgt = src_tgt(config, batch=3, src_len=9, tgt_len=7, seed=0, src_lengths=[9, 4, 0],
                       tgt_lengths=[7, 5, 0])  # a padded row and an all-padding row
    f64 = config.replace(dtype="float64")
    logits, trace = R.forward({k: v.astype(np.float64) for k, v in weights.items()}, f64, src, tgt,
                              return_trace=True)
    return config, weights, src, tgt, logits, trace


def _f64(x: torch.Tensor) -> np.ndarray:
    return x.detach().double().numpy()


@pytest.mark.parametrize("dtype, precision, layout", CASES)
@pytest.mark.parametrize("variant", ["tiny-pre-annotated", "tiny-shared-tied-post", "tiny-post-final-norm"])
def test_the_inference_pass_meets_the_oracle_in_every_layout(variant, dtype, precision, layout, monkeypatch):
    """`forward`, `encode` and `decode` without gradients agree with the float64 oracle within the
    bound the modules meet (``{precision} torch:reference``), in each kernel layout, and the
    layout asked for is the one that ran; the modules' pass (gradients on) meets the same bound."""
    if layout in (PACKED, WIDENED) and not _packs(getattr(torch, precision)):
        pytest.skip(f"this CPU or torch build has no oneDNN packed {precision} kernels")
    monkeypatch.setattr(torch_impl.model, "step_layout", lambda rows, device, dtype: layout)
    config, weights, src, tgt, want, trace = _case(variant, dtype)
    model = build(config, weights)
    set_precision(model, precision)
    bound = bound_for(precision if precision != "float32" else dtype, "torch:reference")
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    with torch.no_grad():
        logits = model(s, t)
        memory = model.encode(s)
        hidden = model.decode(t, memory, model._src_mask(s, None))
    kept = model.__dict__["_prepared_weights"]
    assert len(kept) == 2 and all(layout in name for name in kept), kept.keys()  # encoder, decoder
    encoder = next(weights for name, (_, weights) in kept.items() if name.startswith("encoder"))
    qkv = encoder[0].qkv_kernel
    assert qkv.is_mkldnn == (layout in (PACKED, WIDENED))
    kernel_dtype = "float32" if layout == WIDENED else precision if precision != "float32" else dtype
    assert qkv.dtype == getattr(torch, kernel_dtype)
    assert_close(_f64(logits), want, bound, f"{variant} {precision} {layout} logits")
    assert_close(_f64(memory), trace["encoder.output"], bound, "encode")
    decoded = trace["decoder.final_norm" if config.final_norm else "decoder.output"]
    assert_close(_f64(hidden), decoded, bound, "decode")
    modules = model(s, t)  # gradients on: the modules' pass
    assert modules.requires_grad
    assert_close(_f64(modules), want, bound, f"{variant} {precision} modules' logits")


def _counted_ops(model, fn) -> collections.Counter:
    """``Counter({(op, reads a parameter): count})`` of the operations ``fn()`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten
    params = {p.data_ptr() for p in model.parameters()}

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            reads = any(isinstance(a, torch.Tensor) and not a.is_mkldnn and a.data_ptr() in params
                        for a in tree_flatten(args)[0])  # cat's tensors come in a list
            self.ops[(str(func.overloadpacket).removeprefix("aten."), reads)] += 1
            return func(*args, **(kwargs or {}))

    with Count() as count:
        fn()
    return count.ops


@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("precision", ["bfloat16", "float16"])
def test_a_half_inference_pass_casts_and_stacks_no_weight(precision, device):
    """In a half precision the inference pass reads half copies made once: at the call, no
    operation converts, stacks or multiplies by a parameter; the only ones that read parameters
    are the embeddings' lookup and the layer norms, which stay float32 (`shared.precision`'s rule).
    The modules' pass, for contrast, casts and stacks its weights at every call (autocast), so the
    count can fail."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    config, weights, src, tgt, _, _ = _case("tiny-shared-tied-post", "float32")
    model = build(config, weights, device)
    set_precision(model, precision)
    s, t = torch.from_numpy(src).to(device), torch.from_numpy(tgt).to(device)
    with torch.no_grad():
        model(s, t)  # the first call prepares the weights
        inference = _counted_ops(model, lambda: model(s, t))
    modules = _counted_ops(model, lambda: model(s, t))
    touched = {op for (op, reads), n in inference.items() if reads}
    assert touched <= {"embedding", "native_layer_norm"}, inference
    assert modules[("_to_copy", True)] > 0 and modules[("cat", True)] > 0, modules


def test_the_kept_weights_follow_the_parameters():
    """The prepared weights are kept between calls while no parameter changes, and remade after an
    in-place update (an optimizer step): the next inference pass gives the modules' logits for the
    new weights, not the old ones."""
    config, weights, src, tgt, _, _ = _case("tiny-pre-annotated", "float64")
    model = build(config, weights)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    with torch.no_grad():
        before = model(s, t)
        kept = dict(model.__dict__["_prepared_weights"])
        model(s, t)
        assert all(model.__dict__["_prepared_weights"][k] is v for k, v in kept.items())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    model(s, t).square().mean().backward()
    optimizer.step()
    with torch.no_grad():
        after = model(s, t)
    np.testing.assert_allclose(after.numpy(), model(s, t).detach().numpy(), rtol=0, atol=1e-12)
    assert np.abs(after.numpy() - before.numpy()).max() > 1e-3
    # load_state_dict and an in-place update under no_grad (an EMA's) are seen too
    other = build(config, random_weights(config, 1))
    model.load_state_dict(other.state_dict())
    with torch.no_grad():
        np.testing.assert_array_equal(model(s, t).numpy(), other(s, t).numpy())
        for p in model.parameters():
            p.mul_(0.5)
        for p in other.parameters():
            p.mul_(0.5)
        np.testing.assert_array_equal(model(s, t).numpy(), other(s, t).numpy())


@pytest.mark.parametrize("tied", [False, True], ids=["own-generator", "tied-generator"])
def test_a_frozen_model_infers_with_gradients_on(tied):
    """A model frozen by ``requires_grad_(False)`` in eval mode (a teacher inside a student's
    training step, gradients on) runs the inference pass: its logits are the ones under
    ``torch.no_grad()`` to the bit. What still needs a gradient runs the modules, whose
    gradients are then the unfrozen model's: a ``memory`` that requires one (``decode``), a
    generator frozen alone whose table is the unfrozen target embedding (``tied``), one
    parameter left trainable."""
    variant = "tiny-shared-tied-post" if tied else "tiny-pre-annotated"
    config, weights, src, tgt, _, _ = _case(variant, "float32")  # packed kernels: no autograd
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    model = build(config, weights)
    with torch.no_grad():
        want = model(s, t)
    model.requires_grad_(False)
    del model.__dict__["_prepared_weights"]
    got = model(s, t)
    assert not got.requires_grad and "_prepared_weights" in model.__dict__
    np.testing.assert_array_equal(got.numpy(), want.numpy())

    reference = build(config, weights)  # trainable: its gradients are the modules'
    mask = model._src_mask(s, None)
    memory, memory_ref = (model.encode(s).clone().requires_grad_(), reference.encode(s).detach().clone()
                          .requires_grad_())
    model.decode(t, memory, mask).square().sum().backward()
    reference.decode(t, memory_ref, mask).square().sum().backward()
    np.testing.assert_allclose(memory.grad.numpy(), memory_ref.grad.numpy(), rtol=0, atol=0)

    model.requires_grad_(True)
    model.generator.requires_grad_(False)  # tied: the table it reads still trains
    reference.zero_grad(set_to_none=True)
    hidden = model.decode(t, model.encode(s), mask).detach()
    logits = model.generator(hidden)
    assert logits.requires_grad == tied
    if tied:
        logits.square().sum().backward()
        reference.generator(hidden).square().sum().backward()
        np.testing.assert_allclose(model.tgt_embed.table.weight.grad.numpy(),
                                   reference.tgt_embed.table.weight.grad.numpy(), rtol=0, atol=0)
    model.requires_grad_(False)
    model.decoder.layers[0].ffn.inner.bias.requires_grad_(True)  # one parameter left to train
    model(s, t).sum().backward()
    assert model.decoder.layers[0].ffn.inner.bias.grad is not None


@pytest.mark.parametrize("tracer", ["compile", "jit.trace", "DataParallel replica"])
def test_training_mode_traces_and_compilation_take_the_modules(tracer, monkeypatch):
    """Only eval mode without gradients, a trace, ``torch.compile``/``export``, ``jit.trace`` or
    ``nn.DataParallel``'s replication takes the kept weights: training mode keeps its dropout (two
    calls differ), a traced pass records every intermediate, and while a tracer records the pass,
    or on a replica, it stays on the modules (no kept weights are made)."""
    config, weights, src, tgt, _, _ = _case("tiny-pre-annotated", "float32")
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    model = build(config, weights).train()
    with torch.no_grad():
        assert not torch.equal(model(s, t), model(s, t))  # dropout ran
        model.eval()
        _, trace = model(s, t, return_trace=True)
        assert "decoder.layers.0.self_attn.weights" in trace
        assert "_prepared_weights" not in model.__dict__ | model.generator.__dict__
        if tracer == "DataParallel replica":  # what nn.parallel.replicate marks (CUDA only)
            monkeypatch.setattr(model, "_is_replica", True, raising=False)
        else:
            asks = {"compile": (torch.compiler, "is_compiling"), "jit.trace": (torch.jit, "is_tracing")}
            monkeypatch.setattr(*asks[tracer], lambda: True)
        model(s, t)
        assert "_prepared_weights" not in model.__dict__
        monkeypatch.undo()
        model(s, t)
        assert "_prepared_weights" in model.__dict__


def test_a_callers_autocast_sets_the_inference_dtype():
    """A float32-precision model called under the caller's own ``torch.autocast(bfloat16)`` in
    eval without gradients computes as its modules do under that autocast: bfloat16 kernels kept
    (not float32 ones), bfloat16 logits, within the bfloat16 bound of the oracle; outside it, the
    same model is float32 again (the kept weights are per dtype)."""
    config, weights, src, tgt, want, _ = _case("tiny-pre-annotated", "float32")
    model = build(config, weights)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = model(s, t)
        full = model(s, t)
    kept = model.__dict__["_prepared_weights"]
    assert {name.rsplit(", ", 1)[1] for name in kept} == {"bfloat16", "float32"}, kept.keys()
    assert half.dtype == torch.bfloat16 and full.dtype == torch.float32
    assert_close(_f64(half), want, bound_for("bfloat16", "torch:reference"), "under autocast")
    assert_close(_f64(full), want, bound_for("float32", "torch:reference"), "float32")


@pytest.mark.parametrize("grad", [False, True])
def test_encode_and_decode_compute_in_the_models_precision(grad):
    """`encode` and `decode` run under the model's autocast, as `forward` does (and as tf_impl's
    policy applies to every call): in bfloat16 their outputs are bfloat16's (within its bound of the
    oracle, and far from float32's), with gradients (the modules) or without (the kept weights)."""
    config, weights, src, tgt, _, trace = _case("tiny-pre-annotated", "float32")
    model = build(config, weights)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    outputs = {}
    for precision in ("float32", "bfloat16"):
        set_precision(model, precision)
        with torch.set_grad_enabled(grad):
            memory = model.encode(s)
            outputs[precision] = (_f64(memory), _f64(model.decode(t, memory, model._src_mask(s, None))))
    f32_bound = bound_for("float32", "torch:reference")
    for i, name in enumerate(("encoder.output", "decoder.output")):
        assert_close(outputs["bfloat16"][i], trace[name], bound_for("bfloat16", "torch:reference"), name)
        assert max_rel_diff(outputs["bfloat16"][i], outputs["float32"][i]) > 10 * f32_bound.rtol, name


@pytest.mark.parametrize("convert", ["double", "half", "bfloat16"])
def test_a_converted_model_runs_in_its_parameters_dtype(convert):
    """``model.double()``, ``.half()`` or ``.bfloat16()`` (parameters in a dtype other than
    ``config.dtype``, the PyTorch idiom) infers and decodes in that dtype: the kept weights follow
    the parameters, not the config (a float32-config model made ``.half()`` failed in oneDNN's
    float32 packing before). ``.double()`` meets the oracle within float32's bound (its positional
    table was made in float32, ``config.dtype``, and widened: float32-accurate) and decodes its
    tokens; a half model's cached decode gives its recomputing decode's tokens."""
    config, weights, src, tgt, want, _ = _case("tiny-pre-annotated", "float32")
    model = getattr(build(config, weights), convert)()
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    with torch.no_grad():
        logits = model(s, t)
    assert logits.dtype == getattr(torch, {"double": "float64", "half": "float16"}.get(convert, convert))
    greedy = torch_impl.greedy_decode(model, s, 6)
    if convert == "double":
        assert_close(_f64(logits), want, bound_for("float32", "torch:reference"), "logits")
        w64 = {k: v.astype(np.float64) for k, v in weights.items()}
        oracle = R.greedy_decode(R.Model(w64, config.replace(dtype="float64")), src, 6)
        np.testing.assert_array_equal(greedy.tokens, oracle.tokens)
    else:
        recomputed = torch_impl.greedy_decode(model, s, 6, use_cache=False)
        np.testing.assert_array_equal(greedy.tokens, recomputed.tokens)


@pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")  # torch's, about SDPA
def test_an_ensemble_under_vmap_runs_on_the_modules():
    """``torch.vmap`` over ``torch.func.functional_call`` with stacked parameters (the PyTorch way
    to run an ensemble) works in eval without gradients: under a ``torch.func`` transform the pass
    takes the modules (batched tensors have no storage for the kept weights' key), and each
    member's logits are its own model's."""
    from torch.func import functional_call, stack_module_state
    config, _, src, tgt, _, _ = _case("tiny-pre-annotated", "float64")
    members = [build(config, random_weights(config, seed)) for seed in (0, 1)]
    params, buffers = stack_module_state(members)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)

    def member(p, b):
        return functional_call(members[0], (p, b), (s, t))
    with torch.no_grad():
        together = torch.vmap(member)(params, buffers)
        for i, model in enumerate(members):
            assert_close(together[i].numpy(), model(s, t).numpy(), bound_for("float64", "torch:reference"),
                         f"member {i}")


@pytest.mark.parametrize("where", ["submodule", "pre-hook", "global"])
def test_forward_hooks_fire(where):
    """A forward hook on a submodule (feature extraction: an encoder layer's output), a pre-hook, or
    a global one fires in eval without gradients as in any ``nn.Module``: with hooks the pass runs
    the modules; once they are removed it runs on the kept weights again."""
    config, weights, src, tgt, _, trace = _case("tiny-pre-annotated", "float64")
    model = build(config, weights)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    seen = []
    layer = model.encoder.layers[0]
    if where == "submodule":
        handle = layer.register_forward_hook(lambda module, args, out: seen.append(out))
    elif where == "pre-hook":
        handle = model.generator.register_forward_pre_hook(lambda module, args: seen.append(args[0]))
    else:
        handle = torch.nn.modules.module.register_module_forward_hook(
            lambda module, args, out: seen.append(out) if module is layer else None)
    try:
        with torch.no_grad():
            model(s, t)
    finally:
        handle.remove()
    assert len(seen) == 1 and "_prepared_weights" not in model.__dict__
    if where != "pre-hook":
        assert_close(_f64(seen[0]), trace["encoder.layers.0.ffn.residual"],
                     bound_for("float64", "torch:reference"), "the hooked layer's output")
    with torch.no_grad():
        model(s, t)
    assert len(seen) == 1 and "_prepared_weights" in model.__dict__
