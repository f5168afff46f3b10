"""Behaviour only torch_impl has: ids must be torch tensors, ``torch.export``, dropout draws from torch's generator
(seeds reproduce), the trace keeps the autograd graph, ``gradcheck`` through both attention paths
(SDPA and explicit), and the Noam ``LambdaLR`` needs a base rate of 1."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call  # noqa: E402

import torch_impl  # noqa: E402
from parity_tests.torch_support import build  # noqa: E402
from shared import TransformerConfig, tasks  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, assert_close  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from torch_impl import training  # noqa: E402

TINY = TransformerConfig.preset("tiny")  # dropout 0.1


def test_ids_must_be_tensors():
    model = build(TINY, random_weights(TINY, 0))
    src, tgt = src_tgt(TINY, batch=2, src_len=5, tgt_len=4)
    with pytest.raises(TypeError, match="src: expected a torch tensor of token ids, got ndarray"):
        model(src, torch.from_numpy(tgt))
    with pytest.raises(TypeError, match="tgt: expected a torch tensor of token ids, got list"):
        model(torch.from_numpy(src), tgt.tolist())


@pytest.mark.parametrize("return_trace", [False, True], ids=["fast", "explicit"])
def test_dropout_draws_from_torchs_generator(return_trace):
    config = TINY.replace(dtype="float64")
    model = build(config, random_weights(config, 0)).train()
    src, tgt = map(torch.from_numpy, src_tgt(config, batch=2, src_len=6, tgt_len=5))

    def logits():
        out = model(src, tgt, return_trace=return_trace)
        return (out[0] if return_trace else out).detach()

    torch.manual_seed(0)
    c = logits()
    assert not torch.equal(logits(), c)
    torch.manual_seed(0)
    assert torch.equal(logits(), c)  # seeds reproduce


def test_trace_is_differentiable():
    """The trace keeps the graph, so an intermediate can be inspected by gradient too."""
    config = TINY.replace(dtype="float64", dropout=0.0)
    model = build(config, random_weights(config, 3))
    src, tgt = map(torch.from_numpy, src_tgt(config))
    logits, trace = model(src, tgt, return_trace=True)
    assert trace["logits"] is logits and logits.requires_grad
    trace["encoder.layers.0.self_attn.weights"].sum().backward()
    assert model.src_embed.table.weight.grad is not None


# -- gradcheck: autograd against torch's own finite differences, both attention paths -------------
GRAD_CONFIG = TransformerConfig(src_vocab=6, tgt_vocab=7, d_model=4, n_heads=2, d_ff=6, n_encoder_layers=1,
                                n_decoder_layers=1, max_len=8, norm_first=True, norm_style="annotated",
                                dropout=0.0, dtype="float64")
# A few parameters from every kind of module; gradcheck perturbs each element of each.
CHECKED = ["src_embed.table.weight", "tgt_embed.table.weight", "encoder.layers.0.self_attn.query.weight",
           "encoder.layers.0.self_attn_norm.gamma", "decoder.layers.0.cross_attn.key.weight",
           "decoder.layers.0.cross_attn.value.bias", "decoder.layers.0.ffn.inner.weight",
           "decoder.final_norm.beta", "generator.bias"]


@pytest.mark.parametrize("config", [GRAD_CONFIG,
                                    GRAD_CONFIG.replace(norm_first=False, norm_style="standard")],
                         ids=["pre-annotated", "post-standard"])
@pytest.mark.parametrize("return_trace", [False, True], ids=["fast", "explicit"])
def test_gradcheck(config, return_trace):
    model = build(config, random_weights(config, 0))
    # Row 1: an all-padding source and target; row 0 full, so both zero and non-zero rows are hit.
    src, tgt = map(torch.from_numpy, src_tgt(config, batch=2, src_len=4, tgt_len=3, src_lengths=[4, 0],
                                             tgt_lengths=[3, 0]))
    params = dict(model.named_parameters())
    names = [n for n in CHECKED if n in params]

    def logits(*values):
        out = functional_call(model, {**params, **dict(zip(names, values))}, (src, tgt),
                              {"return_trace": return_trace})
        return out[0] if return_trace else out

    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(logits, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


# -- the Noam schedule as a LambdaLR --------------------------------------------------------------
def test_noam_schedule_needs_base_rate_one():
    config = TransformerConfig.preset("tiny", src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB,
                                      dropout=0.0, dtype="float64")
    optimizer = torch.optim.Adam(torch_impl.Transformer(config).parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="expected lr=1.0 in every param group"):
        training.noam_schedule(optimizer, 16, 10)
    with pytest.raises(ValueError, match="warmup expected a positive int"):
        training.make_optimizer(torch_impl.Transformer(config), 16, 0)
    for start_step in (-1, 2**53, 10**5000):  # the next step, start_step + 1, past noam_lr's 2**53
        with pytest.raises(ValueError, match=r"^start_step: expected an int in \[0, 2\*\*53 - 1\]"):
            training.make_optimizer(torch_impl.Transformer(config), 16, 10, start_step=start_step)


def test_torch_export_runs_the_forward_pass_for_any_batch_and_length():
    """``torch.export.export`` with a dynamic batch, source and target length: the program (the
    modules' pass: a tracer takes no kept weights) gives the model's logits for shapes other than
    its example's, and checks ids as it runs, an assertion naming the argument (a program cannot
    branch on values: `torch_impl.inputs.check_ids`; shapes stay symbolic in `shared.checks`)."""
    config = TransformerConfig.preset("tiny").replace(dtype="float64", n_encoder_layers=1,
                                                      n_decoder_layers=1)
    model = build(config, random_weights(config, 0))
    example = [torch.from_numpy(a) for a in src_tgt(config, batch=2, src_len=7, tgt_len=5)]
    batch = torch.export.Dim("batch")
    lengths = [torch.export.Dim(n, max=config.max_len) for n in ("src_len", "tgt_len")]
    program = torch.export.export(model, tuple(example),
                                  dynamic_shapes=tuple({0: batch, 1: n} for n in lengths)).module()
    for shape in ((3, 9, 4), (1, 2, 11)):
        src, tgt = (torch.from_numpy(a) for a in src_tgt(config, *shape, seed=shape[0],
                                                           src_lengths=[shape[1]] * shape[0]))
        assert_close(program(src, tgt).detach().numpy(), model(src, tgt).detach().numpy(), FLOAT64,
                     f"logits of shape {shape}")
    bad = example[0].clone()
    bad[0, 1] = config.src_vocab
    with pytest.raises(RuntimeError, match=r"src: expected token ids in \[0, 13\), got a value outside it"):
        program(bad, example[1])


@pytest.mark.parametrize("variant", ["tiny-pre-annotated", "tiny-post-standard", "head-dim", "float64"])
def test_a_training_step_keeps_at_least_the_memory_floor(variant):
    """`shared.memory.training_floor`, which `twins train` refuses a ``--batch`` by, is a floor:
    what autograd saves for a training step's backward pass (each storage once, the weights apart)
    and the logits' gradient hold at least that many bytes, for either norm placement, an
    attention narrower than the model and float64."""
    from parity_tests.matrix import VARIANTS
    from shared.memory import training_floor
    config = {"head-dim": TINY.replace(head_dim=3), "float64": TINY.replace(dtype="float64")}.get(
        variant) or VARIANTS.get(variant)
    config = config.replace(dropout=0.0)
    model = build(config, random_weights(config, 0))
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=5, seed=0)
    tgt_out = np.where(tgt == config.pad_id, config.pad_id, (tgt + 1) % config.tgt_vocab)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        logits = model(torch.from_numpy(src), torch.from_numpy(tgt))
        loss = training.label_smoothed_loss(logits, torch.from_numpy(tgt_out), config.pad_id, 0.1)
    kept = sum(saved.values()) + logits.numel() * logits.element_size()  # + the logits' gradient
    floor = training_floor(config, 3, 7, 5)
    assert kept >= floor, (kept, floor)
    loss.backward()  # the graph the hooks saw is a training step's
