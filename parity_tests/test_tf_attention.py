"""tf_impl attention against the reference: masked keys at exactly zero weight, rows with no allowed
key at zero context, per-head masks, and no NaN forward or backward."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from parity_tests.tf_support import DEVICES  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from shared import make_src_mask, make_tgt_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from tf_impl.attention import MultiHeadAttention, masked_softmax  # noqa: E402

D, H = 16, 4
# Row 0 has padding, row 1 one real key, row 2 none at all.
KEYS = np.array([[3, 4, 5, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


def _layer(dtype, seed=0):
    attn = MultiHeadAttention(D, H, dropout=0.0, dtype=dtype)
    rng = np.random.default_rng(seed)
    canonical = {}
    for name in ("query", "key", "value", "output"):  # random biases too, so a dropped bias cannot pass
        dense = getattr(attn, name)
        kernel, bias = rng.uniform(-0.5, 0.5, (D, D)), rng.uniform(-0.5, 0.5, D)
        dense.kernel.assign(kernel.astype(dtype))
        dense.bias.assign(bias.astype(dtype))
        canonical[f"a.{name}.kernel"] = kernel.astype(dtype).astype(np.float64)
        canonical[f"a.{name}.bias"] = bias.astype(dtype).astype(np.float64)
    return attn, canonical


def _inputs(dtype, q_len=4):
    rng = np.random.default_rng(0)
    x, mem = rng.normal(size=(3, q_len, D)).astype(dtype), rng.normal(size=(3, 5, D)).astype(dtype)
    return x, mem


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("mode", ["eager", "xla"])
def test_matches_reference_with_zero_rows(dtype, device, mode):
    attn, w = _layer(dtype)
    x, mem = _inputs(dtype)
    mask = make_src_mask(KEYS, 0)  # (3, 1, 1, 5)
    ref_out, ref_weights = R.attention(x.astype(np.float64), mem.astype(np.float64), mask, w, "a", H)
    call = lambda a, b, m: attn(a, b, m, return_weights=True)  # noqa: E731
    if mode == "xla":
        call = tf.function(call, jit_compile=True)
    with tf.device(device):
        out, weights = call(tf.constant(x), tf.constant(mem), tf.constant(mask))
    out, weights = out.numpy(), weights.numpy()
    bound = bound_for(dtype, "tf:reference")
    assert_close(weights, ref_weights, bound, "weights")
    assert_close(out, ref_out, bound, "output")
    assert (weights[~np.broadcast_to(mask, weights.shape)] == 0).all()  # exactly zero, not tiny
    assert (weights[2] == 0).all()
    # No allowed key: zero context, so the output is the output bias exactly.
    assert np.isfinite(out).all()
    np.testing.assert_array_equal(out[2], np.broadcast_to(attn.output.bias.numpy(), (4, D)))


def test_causal_and_padded_target_mask():
    attn, w = _layer("float64")
    ids = np.array([[1, 5, 6, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    mask = make_tgt_mask(ids, 0)  # (3, 1, 4, 4), row 1 has no key anywhere
    x = np.random.default_rng(1).normal(size=(3, 4, D))
    out, weights = attn(x, x, mask, return_weights=True)
    ref_out, ref_weights = R.attention(x, x, mask, w, "a", H)
    assert_close(weights.numpy(), ref_weights, FLOAT64, "weights")
    assert_close(out.numpy(), ref_out, FLOAT64, "output")


def test_per_head_mask_broadcast():
    attn, w = _layer("float64")
    x, mem = _inputs("float64", q_len=2)
    mask = np.random.default_rng(2).random((3, H, 2, 5)) < 0.5
    mask[0, 1, 0] = False  # one head of one query sees nothing
    ref_out, ref_weights = R.attention(x, mem, mask, w, "a", H)
    out, weights = attn(x, mem, mask, return_weights=True)
    assert_close(weights.numpy(), ref_weights, FLOAT64, "weights")
    assert_close(out.numpy(), ref_out, FLOAT64, "output")
    assert (weights.numpy()[0, 1, 0] == 0).all()


def test_no_weights_unless_asked_and_same_output():
    attn, _ = _layer("float64")
    x, mem = _inputs("float64")
    mask = make_src_mask(KEYS, 0)
    out, none = attn(x, mem, mask)
    assert none is None
    np.testing.assert_array_equal(out.numpy(), attn(x, mem, mask, return_weights=True)[0].numpy())


def test_masked_softmax_extremes():
    scores = tf.constant([[1e30, -1e30, 0.0], [5.0, 5.0, 5.0]], tf.float32)
    mask = tf.constant([[True, True, False], [False, False, False]])
    weights = masked_softmax(scores, mask).numpy()
    np.testing.assert_array_equal(weights, [[1, 0, 0], [0, 0, 0]])


def test_gradients_are_finite_through_rows_with_no_key():
    attn, _ = _layer("float64")
    x, mem = (tf.constant(a) for a in _inputs("float64"))
    with tf.GradientTape() as tape:
        tape.watch([x, mem])
        out, _ = attn(x, mem, make_src_mask(KEYS, 0))
        loss = tf.reduce_sum(out * out)
    grads = tape.gradient(loss, [x, mem] + attn.trainable_weights)
    assert all(g is not None and np.isfinite(g.numpy()).all() for g in grads)
    assert (grads[1].numpy()[2] == 0).all()  # memory of the all-padding row: nothing flows back
