"""torch_impl attention: both paths against the reference and each other, masked keys at exactly
zero weight, rows with no allowed key at zero context, and no NaN forward or backward."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from parity_tests.torch_support import DEVICES, disable_tf32, to_numpy  # noqa: E402
from shared import make_src_mask, make_tgt_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from torch_impl.attention import MultiHeadAttention, masked_softmax  # noqa: E402

D, H = 16, 4
# Row 0 has padding, row 1 one real key, row 2 none at all.
KEYS = np.array([[3, 4, 5, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


def _module(dtype, device, seed=0):
    torch.manual_seed(seed)
    attn = MultiHeadAttention(D, H, dropout=0.0, dtype=getattr(torch, dtype)).to(device).eval()
    with torch.no_grad():  # random biases too, so a dropped bias cannot pass
        for p in attn.parameters():
            p.uniform_(-0.5, 0.5)
    canonical = {}
    for name in ("query", "key", "value", "output"):
        linear = getattr(attn, name)
        canonical[f"a.{name}.kernel"] = to_numpy(linear.weight).T.astype(np.float64)
        canonical[f"a.{name}.bias"] = to_numpy(linear.bias).astype(np.float64)
    return attn, canonical


def _inputs(dtype, device, q_len=4):
    rng = np.random.default_rng(0)
    x, mem = rng.normal(size=(3, q_len, D)), rng.normal(size=(3, 5, D))
    to = lambda a: torch.tensor(a, dtype=getattr(torch, dtype), device=device)  # noqa: E731
    return x, mem, to(x), to(mem)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_both_paths_match_reference_with_zero_rows(dtype, device):
    disable_tf32()
    attn, w = _module(dtype, device)
    x, mem, tx, tmem = _inputs(dtype, device)
    mask = make_src_mask(KEYS, 0)  # (3, 1, 1, 5)
    ref_out, ref_weights = R.attention(x, mem, mask, w, "a", H)
    tmask = torch.from_numpy(mask).to(device)
    with torch.no_grad():
        explicit, weights = attn(tx, tmem, tmask, return_weights=True)
        fast, none = attn(tx, tmem, tmask)
    assert none is None
    bound = bound_for(dtype, "torch:reference")
    assert_close(to_numpy(weights), ref_weights, bound, "weights")
    assert_close(to_numpy(explicit), ref_out, bound, "output (explicit)")
    assert_close(to_numpy(fast), ref_out, bound, "output (fast)")
    assert_close(to_numpy(fast), to_numpy(explicit), bound, "fast vs explicit")
    weights = to_numpy(weights)
    assert (weights[~np.broadcast_to(mask, weights.shape)] == 0).all()  # exactly zero, not tiny
    assert (weights[2] == 0).all()
    bias = to_numpy(attn.output.bias)
    for out in (explicit, fast):  # no allowed key: zero context, so the output is the bias exactly
        assert np.isfinite(to_numpy(out)).all()
        np.testing.assert_array_equal(to_numpy(out)[2], np.broadcast_to(bias, (4, D)))


@pytest.mark.parametrize("device", DEVICES)
def test_causal_and_padded_target_mask_both_paths(device):
    attn, w = _module("float64", device)
    ids = np.array([[1, 5, 6, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    mask = make_tgt_mask(ids, 0)  # (3, 1, 4, 4), row 1 has no key anywhere
    x = np.random.default_rng(1).normal(size=(3, 4, D))
    tx = torch.tensor(x, device=device)
    tmask = torch.from_numpy(mask).to(device)
    with torch.no_grad():
        explicit, weights = attn(tx, tx, tmask, return_weights=True)
        fast, _ = attn(tx, tx, tmask)
    ref_out, ref_weights = R.attention(x, x, mask, w, "a", H)
    assert_close(to_numpy(weights), ref_weights, FLOAT64, "weights")
    assert_close(to_numpy(fast), ref_out, FLOAT64, "fast")
    assert_close(to_numpy(explicit), ref_out, FLOAT64, "explicit")


def test_per_head_mask_broadcast():
    attn, w = _module("float64", "cpu")
    x, mem, tx, tmem = _inputs("float64", "cpu", q_len=2)
    mask = np.random.default_rng(2).random((3, H, 2, 5)) < 0.5
    mask[0, 1, 0] = False  # one head of one query sees nothing
    ref_out, ref_weights = R.attention(x, mem, mask, w, "a", H)
    with torch.no_grad():
        explicit, weights = attn(tx, tmem, torch.from_numpy(mask), return_weights=True)
        fast, _ = attn(tx, tmem, torch.from_numpy(mask))
    assert_close(to_numpy(weights), ref_weights, FLOAT64, "weights")
    assert_close(to_numpy(fast), ref_out, FLOAT64, "fast")
    assert_close(to_numpy(explicit), ref_out, FLOAT64, "explicit")


@pytest.mark.parametrize("return_weights", [False, True], ids=["fast", "explicit"])
def test_gradients_are_finite_through_rows_with_no_key(return_weights):
    attn, _ = _module("float64", "cpu")
    _, _, tx, tmem = _inputs("float64", "cpu")
    tx.requires_grad_(True)
    tmem.requires_grad_(True)
    out, _ = attn(tx, tmem, torch.from_numpy(make_src_mask(KEYS, 0)), return_weights=return_weights)
    out.square().sum().backward()
    for t in (tx, tmem, *attn.parameters()):
        assert torch.isfinite(t.grad).all()
    assert (tmem.grad[2] == 0).all()  # nothing in the all-padding memory is looked at
    assert (tmem.grad[0, 3:] == 0).all()


def test_masked_softmax_rows():
    scores = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], dtype=torch.float64)
    mask = torch.tensor([[True, False, True], [False, False, False]])
    out = masked_softmax(scores, mask)
    assert out[0, 1] == 0 and (out[1] == 0).all()
    np.testing.assert_allclose(out[0].sum().item(), 1.0, rtol=1e-15)


def test_attention_dropout_only_in_training():
    torch.manual_seed(0)
    attn = MultiHeadAttention(D, H, dropout=0.5, dtype=torch.float64)
    x = torch.randn(2, 3, D, dtype=torch.float64)
    mask = torch.ones(1, 1, 1, 3, dtype=torch.bool)
    attn.eval()
    a, _ = attn(x, x, mask)
    b, _ = attn(x, x, mask, return_weights=True)
    assert_close(to_numpy(a), to_numpy(b), FLOAT64, "eval")
    attn.train()
    for return_weights in (False, True):
        c, _ = attn(x, x, mask, return_weights=return_weights)
        assert not torch.allclose(a, c)
