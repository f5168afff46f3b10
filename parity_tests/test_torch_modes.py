"""torch_impl behaviour: dropout only in train(), encode/decode equal forward, devices and dtypes."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import assert_close, bound_for  # noqa: E402
from parity_tests.torch_support import DEVICES, build, ids, run_logits, to_numpy  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from torch_impl.inputs import make_src_mask, make_tgt_mask  # noqa: E402

TINY = TransformerConfig.preset("tiny")  # dropout 0.1


@pytest.mark.parametrize("return_trace", [False, True], ids=["fast", "explicit"])
def test_dropout_only_in_train(return_trace):
    config = TINY.replace(dtype="float64")
    w = random_weights(config, 0)
    model = build(config, w)
    src, tgt = map(torch.from_numpy, src_tgt(config, batch=2, src_len=6, tgt_len=5))

    def logits():
        out = model(src, tgt, return_trace=return_trace)
        return (out[0] if return_trace else out).detach()

    model.eval()
    a, b = logits(), logits()
    assert torch.equal(a, b)
    assert_close(a.numpy(), R.forward(w, config, src.numpy(), tgt.numpy()), bound_for("float64", "torch:reference"))
    model.train()
    torch.manual_seed(0)
    c = logits()
    d = logits()
    assert not torch.allclose(c, a) and not torch.allclose(c, d)
    torch.manual_seed(0)
    assert torch.equal(logits(), c)  # dropout draws from torch's generator, so seeds reproduce
    model.eval()
    assert torch.equal(logits(), a)


def test_no_dropout_config_trains_like_eval():
    config = TINY.replace(dtype="float64", dropout=0.0)
    model = build(config, random_weights(config, 0))
    src, tgt = map(torch.from_numpy, src_tgt(config))
    with torch.no_grad():
        a = model(src, tgt)
        model.train()
        b = model(src, tgt)
    assert torch.equal(a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_encode_decode_generator_equal_forward(dtype, device):
    config = TINY.replace(dtype=dtype)
    model = build(config, random_weights(config, 1), device)
    src_np, tgt_np = src_tgt(config, batch=3, src_len=7, tgt_len=5, src_lengths=[7, 0, 2])
    src, tgt = ids(src_np, device), ids(tgt_np, device)
    with torch.no_grad():
        memory = model.encode(src)
        hidden = model.decode(tgt, memory, make_src_mask(src, config.pad_id))
        logits = model.generator(hidden)
        whole = model(src, tgt)
    assert logits.dtype == getattr(torch, dtype) and logits.device.type == device
    assert torch.equal(logits, whole)
    assert_close(to_numpy(memory), R.encode(random_weights(config, 1), config, src_np),
                 bound_for(dtype, "torch:reference"), "memory")


def test_derived_masks_equal_shared_masks():
    from shared import make_src_mask as np_src, make_tgt_mask as np_tgt
    src, tgt = src_tgt(TINY, batch=3, src_len=6, tgt_len=4)
    np.testing.assert_array_equal(make_src_mask(torch.from_numpy(src), 0).numpy(), np_src(src, 0))
    np.testing.assert_array_equal(make_tgt_mask(torch.from_numpy(tgt), 0).numpy(), np_tgt(tgt, 0))


def test_explicit_masks_equal_derived_ones():
    config = TINY.replace(dtype="float64")
    model = build(config, random_weights(config, 2))
    src, tgt = map(torch.from_numpy, src_tgt(config))
    derived = run_logits(model, src.numpy(), tgt.numpy())
    explicit = run_logits(model, src.numpy(), tgt.numpy(), src_mask=make_src_mask(src, 0),
                          tgt_mask=make_tgt_mask(tgt, 0))
    np.testing.assert_array_equal(derived, explicit)


def test_decoder_is_causal():
    config = TINY.replace(dtype="float64")
    model = build(config, random_weights(config, 5))
    src, tgt = src_tgt(config, batch=1, src_len=5, tgt_len=6, tgt_lengths=[6])
    changed = tgt.copy()
    changed[0, 4] = 3 if tgt[0, 4] != 3 else 4
    a, b = run_logits(model, src, tgt), run_logits(model, src, changed)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_trace_is_differentiable():
    """The trace keeps the graph, so an intermediate can be inspected by gradient too."""
    config = TINY.replace(dtype="float64", dropout=0.0)
    model = build(config, random_weights(config, 3))
    src, tgt = map(torch.from_numpy, src_tgt(config))
    logits, trace = model(src, tgt, return_trace=True)
    assert trace["logits"] is logits and logits.requires_grad
    trace["encoder.layers.0.self_attn.weights"].sum().backward()
    assert model.src_embed.table.weight.grad is not None
