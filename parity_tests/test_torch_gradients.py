"""Gradients of torch_impl in float64: autograd against finite differences (`gradcheck`) on a tiny
model with an all-padding row, through both attention paths, and the two paths against each other."""
import pytest

torch = pytest.importorskip("torch")

from torch.func import functional_call  # noqa: E402

from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, assert_close  # noqa: E402
from parity_tests.torch_support import build  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import random_weights  # noqa: E402

CONFIG = TransformerConfig(src_vocab=6, tgt_vocab=7, d_model=4, n_heads=2, d_ff=6, n_encoder_layers=1,
                           n_decoder_layers=1, max_len=8, norm_first=True, norm_style="annotated",
                           dropout=0.0, dtype="float64")
# A few parameters from every kind of module; gradcheck perturbs each element of each.
CHECKED = ["src_embed.table.weight", "tgt_embed.table.weight", "encoder.layers.0.self_attn.query.weight",
           "encoder.layers.0.self_attn_norm.gamma", "decoder.layers.0.cross_attn.key.weight",
           "decoder.layers.0.cross_attn.value.bias", "decoder.layers.0.ffn.inner.weight",
           "decoder.final_norm.beta", "generator.bias"]


def _setup(config):
    model = build(config, random_weights(config, 0))
    # Row 1: an all-padding source and target; row 0 full, so both zero and non-zero rows are hit.
    src, tgt = src_tgt(config, batch=2, src_len=4, tgt_len=3, src_lengths=[4, 0], tgt_lengths=[3, 0])
    return model, torch.from_numpy(src), torch.from_numpy(tgt)


@pytest.mark.parametrize("config", [CONFIG, CONFIG.replace(norm_first=False, norm_style="standard")],
                         ids=["pre-annotated", "post-standard"])
@pytest.mark.parametrize("return_trace", [False, True], ids=["fast", "explicit"])
def test_gradcheck(config, return_trace):
    model, src, tgt = _setup(config)
    params = dict(model.named_parameters())
    names = [n for n in CHECKED if n in params]

    def logits(*values):
        out = functional_call(model, {**params, **dict(zip(names, values))}, (src, tgt),
                              {"return_trace": return_trace})
        return out[0] if return_trace else out

    inputs = tuple(params[n].detach().clone().requires_grad_(True) for n in names)
    assert torch.autograd.gradcheck(logits, inputs, eps=1e-6, atol=1e-7, rtol=1e-5)


def test_fast_and_explicit_paths_give_the_same_gradients():
    model, src, tgt = _setup(CONFIG)
    weight = torch.randn(2, 3, CONFIG.tgt_vocab, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    grads = []
    for return_trace in (False, True):
        model.zero_grad()
        out = model(src, tgt, return_trace=return_trace)
        ((out[0] if return_trace else out) * weight).sum().backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters()})
    for name, grad in grads[0].items():
        assert torch.isfinite(grad).all(), name
        assert_close(grad.numpy(), grads[1][name].numpy(), FLOAT64, name)
