"""Every backend's MultiHeadAttention against the reference: masked keys at exactly zero weight, rows
with no allowed key at zero context (the output is the output bias exactly), causal and per-head
masks, the plain path (no weights asked; torch: SDPA) equal to the weighted one, dropout only in
training, and no NaN forward or backward. (torch's SDPA-specific checks: test_torch_only.py.)"""
import re

import numpy as np
import pytest

from parity_tests.backends import ALL, backends
from shared import make_src_mask, make_tgt_mask
from shared import reference as R
from shared.tolerances import FLOAT64, assert_close, bound_for

D, H = 16, 4
# Row 0 has padding, row 1 one real key, row 2 none at all.
KEYS = np.array([[3, 4, 5, 0, 0], [3, 0, 0, 0, 0], [0, 0, 0, 0, 0]])


class Layer:
    """A MultiHeadAttention of ``backend`` with random weights and biases (so a dropped bias cannot
    pass) drawn in NumPy, and their canonical ``a.{query,key,value,output}.{kernel,bias}`` in float64.
    ``__call__`` takes and returns NumPy: ``(out (B, Q, D), weights (B, H, Q, K) or None)``."""

    def __init__(self, backend, dtype: str, dropout: float = 0.0, seed: int = 0):
        self.backend, self.dtype = backend, dtype
        self.layer = backend.impl.attention.MultiHeadAttention(D, H, dropout=dropout,
                                                               **_dtype(backend, dtype))
        rng = np.random.default_rng(seed)
        self.canonical = {}
        for name in ("query", "key", "value", "output"):
            kernel = rng.uniform(-0.5, 0.5, (D, D)).astype(dtype)
            bias = rng.uniform(-0.5, 0.5, D).astype(dtype)
            _assign(backend, getattr(self.layer, name), kernel, bias)
            self.canonical[f"a.{name}.kernel"] = kernel.astype(np.float64)
            self.canonical[f"a.{name}.bias"] = bias.astype(np.float64)
        if backend.framework == "torch":
            self.layer.to(backend.device).eval()
        self._fns = {}

    @property
    def output_bias(self) -> np.ndarray:
        return self.canonical["a.output.bias"].astype(self.dtype)

    def __call__(self, x, mem, mask, return_weights: bool, training: bool = False):
        b = self.backend
        args = (b.tensor(np.asarray(x, self.dtype)), b.tensor(np.asarray(mem, self.dtype)), b.tensor(mask))
        if b.framework == "torch":
            import torch
            self.layer.train(training)
            with torch.no_grad():
                out, weights = self.layer(*args, return_weights=return_weights)
        else:
            import tensorflow as tf
            key = (return_weights, training)
            if key not in self._fns:  # one function per path, as the backend's own cache does
                call = lambda q, m, k: self.layer(q, m, k, return_weights=return_weights,  # noqa: E731
                                                  training=training)
                self._fns[key] = (call if b.mode == "eager"
                                  else tf.function(call, jit_compile=(b.mode == "xla")))
            with tf.device(b.device):
                out, weights = self._fns[key](*args)
        return b.numpy(out), (None if weights is None else b.numpy(weights))


def _dtype(backend, dtype):
    if backend.framework == "torch":
        import torch
        return {"dtype": getattr(torch, dtype)}
    return {"dtype": dtype}


def _assign(backend, dense, kernel, bias):
    if backend.framework == "torch":
        import torch
        with torch.no_grad():
            dense.weight.copy_(torch.from_numpy(kernel.T.copy()))  # nn.Linear stores (out, in)
            dense.bias.copy_(torch.from_numpy(bias))
    else:
        dense.kernel.assign(kernel)
        dense.bias.assign(bias)


def _inputs(q_len=4):
    rng = np.random.default_rng(0)
    return rng.normal(size=(3, q_len, D)), rng.normal(size=(3, 5, D))


@pytest.mark.parametrize("backend", backends(ALL))
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_both_paths_match_reference_with_zero_rows(dtype, backend):
    layer = Layer(backend, dtype)
    x, mem = _inputs()
    mask = make_src_mask(KEYS, 0)  # (3, 1, 1, 5)
    x, mem = x.astype(dtype), mem.astype(dtype)
    ref_out, ref_weights = R.attention(x.astype(np.float64), mem.astype(np.float64), mask,
                                       layer.canonical, "a", H)
    explicit, weights = layer(x, mem, mask, return_weights=True)
    plain, none = layer(x, mem, mask, return_weights=False)
    assert none is None  # no weights unless asked
    bound = bound_for(dtype, backend.pair)
    assert_close(weights, ref_weights, bound, "weights")
    assert_close(explicit, ref_out, bound, "output (weights asked)")
    assert_close(plain, ref_out, bound, "output (plain)")
    assert_close(plain, explicit, bound, "plain vs weights asked")
    if backend.framework == "tf":  # one path in TF: asking for the weights changes nothing, bit for bit
        np.testing.assert_array_equal(plain, explicit)
    assert (weights[~np.broadcast_to(mask, weights.shape)] == 0).all()  # exactly zero, not tiny
    assert (weights[2] == 0).all()
    for out in (explicit, plain):  # no allowed key: zero context, so the output is the bias exactly
        assert np.isfinite(out).all()
        np.testing.assert_array_equal(out[2], np.broadcast_to(layer.output_bias, (4, D)))


@pytest.mark.parametrize("backend", backends())
def test_causal_and_padded_target_mask_both_paths(backend):
    layer = Layer(backend, "float64")
    ids = np.array([[1, 5, 6, 0], [0, 0, 0, 0], [1, 0, 0, 0]])
    mask = make_tgt_mask(ids, 0)  # (3, 1, 4, 4), row 1 has no key anywhere
    x = np.random.default_rng(1).normal(size=(3, 4, D))
    explicit, weights = layer(x, x, mask, return_weights=True)
    plain, _ = layer(x, x, mask, return_weights=False)
    ref_out, ref_weights = R.attention(x, x, mask, layer.canonical, "a", H)
    assert_close(weights, ref_weights, FLOAT64, "weights")
    assert_close(plain, ref_out, FLOAT64, "plain")
    assert_close(explicit, ref_out, FLOAT64, "weights asked")


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_per_head_mask_broadcast(backend):
    layer = Layer(backend, "float64")
    x, mem = _inputs(q_len=2)
    mask = np.random.default_rng(2).random((3, H, 2, 5)) < 0.5
    mask[0, 1, 0] = False  # one head of one query sees nothing
    ref_out, ref_weights = R.attention(x, mem, mask, layer.canonical, "a", H)
    explicit, weights = layer(x, mem, mask, return_weights=True)
    plain, _ = layer(x, mem, mask, return_weights=False)
    assert_close(weights, ref_weights, FLOAT64, "weights")
    assert_close(plain, ref_out, FLOAT64, "plain")
    assert_close(explicit, ref_out, FLOAT64, "weights asked")
    assert (weights[0, 1, 0] == 0).all()


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_masked_softmax_rows_and_extremes(backend):
    """Masked entries get exactly 0, a row with nothing allowed is all zero, the rest sums to 1; huge
    scores neither overflow nor leak through the mask."""
    softmax = backend.impl.attention.masked_softmax
    scores = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = np.array([[True, False, True], [False, False, False]])
    out = backend.numpy(softmax(backend.tensor(scores), backend.tensor(mask)))
    assert out[0, 1] == 0 and (out[1] == 0).all()
    np.testing.assert_allclose(out[0].sum(), 1.0, rtol=1e-15)
    extreme = np.array([[1e30, -1e30, 0.0], [5.0, 5.0, 5.0]], np.float32)
    mask = np.array([[True, True, False], [False, False, False]])
    out = backend.numpy(softmax(backend.tensor(extreme), backend.tensor(mask)))
    np.testing.assert_array_equal(out, [[1, 0, 0], [0, 0, 0]])


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_attention_dropout_only_in_training(backend):
    layer = Layer(backend, "float64", dropout=0.5)
    x = np.random.default_rng(3).normal(size=(2, 3, D))
    mask = np.ones((1, 1, 1, 3), bool)
    a, _ = layer(x, x, mask, return_weights=False)
    b, _ = layer(x, x, mask, return_weights=True)
    assert_close(a, b, FLOAT64, "eval")
    for return_weights in (False, True):
        c, _ = layer(x, x, mask, return_weights=return_weights, training=True)
        assert not np.allclose(a, c)


@pytest.mark.parametrize("backend", backends(cpu_only=True))
@pytest.mark.parametrize("return_weights", [False, True], ids=["plain", "weights"])
def test_gradients_are_finite_through_rows_with_no_key(return_weights, backend):
    layer = Layer(backend, "float64")
    x, mem = _inputs()
    mask = make_src_mask(KEYS, 0)
    if backend.framework == "torch":
        import torch
        tx, tmem = (torch.tensor(a, requires_grad=True) for a in (x, mem))
        out, _ = layer.layer(tx, tmem, torch.from_numpy(mask), return_weights=return_weights)
        out.square().sum().backward()
        grads = [t.grad.numpy() for t in (tx, tmem, *layer.layer.parameters())]
    else:
        import tensorflow as tf
        tx, tmem = tf.constant(x), tf.constant(mem)
        with tf.GradientTape() as tape:
            tape.watch([tx, tmem])
            out, _ = layer.layer(tx, tmem, mask, return_weights=return_weights)
            loss = tf.reduce_sum(out * out)
        grads = [g.numpy() for g in tape.gradient(loss, [tx, tmem] + layer.layer.trainable_weights)]
    assert len(grads) == 2 + 8 and all(np.isfinite(g).all() for g in grads)
    assert (grads[1][2] == 0).all()  # nothing in the all-padding memory is looked at
    assert (grads[1][0, 3:] == 0).all()  # nor the padding keys of row 0


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_a_step_output_kernel_without_its_qkv_kernels_is_refused(backend):
    """`MultiHeadAttention.extend`'s ``output`` (the step's output kernel, `step_kernels`) was
    taken and ignored without ``qkv``: the layer's own projection ran; ``qkv`` without ``output``
    failed in Python's words. Refused alike now."""
    layer = Layer(backend, "float32").layer
    x = backend.tensor(np.ones((1, 1, D), np.float32))
    cache = backend.tensor(np.zeros((1, H, 4, D // H), np.float32))
    position = 0 if backend.framework == "torch" else backend.tensor(np.array(0, np.int32))
    output = (backend.tensor(np.eye(D, dtype=np.float32)), backend.tensor(np.zeros(D, np.float32)))
    with pytest.raises(ValueError, match="^output: the step's output kernel goes with its qkv kernels; "
                                         "got output without qkv$"):
        layer.extend(x, cache, cache, position, output=output)
    # and the other way round: Python's "Value after * must be an iterable, not NoneType"
    qkv = (backend.tensor(np.zeros((D, 3 * D), np.float32)), backend.tensor(np.zeros(3 * D, np.float32)))
    with pytest.raises(ValueError, match="^output: the step's output kernel goes with its qkv kernels; "
                                         "got qkv without output$"):
        layer.extend(x, cache, cache, position, qkv=qkv)
    assert not backend.numpy(cache).any()  # refused before anything is written


@pytest.mark.parametrize("backend", backends(cpu_only=True))
@pytest.mark.parametrize("position, error", [(-1, ValueError), (4, ValueError), (2.7, TypeError), (True, TypeError),
                                             (None, TypeError)])
def test_a_step_position_outside_the_cache_is_refused(backend, position, error):
    """`MultiHeadAttention.extend` at a ``position`` given as a number: torch wrote -1 into the last
    slot and attended to it alone, TF wrote 2.7 at 2 and True at 1; out of range each failed in
    its own words (IndexError, InvalidArgumentError). Refused alike now, before any write; a
    NumPy integer in range is taken (torch_impl's DecoderLayer.step checks the same)."""
    layer = Layer(backend, "float32").layer
    x = backend.tensor(np.ones((1, 1, D), np.float32))
    key, value = (backend.tensor(np.zeros((1, H, 4, D // H), np.float32)) for _ in range(2))
    with pytest.raises(error, match=rf"^position: expected an int in \[0, 4\) \(the cache's capacity\), "
                                    rf"got {re.escape(repr(position))}$"):
        layer.extend(x, key, value, position)
    assert not backend.numpy(key).any() and not backend.numpy(value).any()
    _, key, value = layer.extend(x, key, value, np.int64(3))
    assert backend.numpy(key)[0, :, 3].any() and not backend.numpy(key)[0, :, :3].any()


@pytest.mark.parametrize("backend", backends(cpu_only=True))
def test_a_mask_with_an_int_position_is_refused(backend):
    """The step's ``mask`` (its ``filled_mask``) goes with a tensor position: torch ignored one
    given with an int position (it cut the filled positions instead), TF applied it. Refused
    alike now, before any write."""
    layer = Layer(backend, "float32").layer
    x = backend.tensor(np.ones((1, 1, D), np.float32))
    key, value = (backend.tensor(np.zeros((1, H, 4, D // H), np.float32)) for _ in range(2))
    allowed = np.arange(4) <= 1
    mask = (backend.tensor(np.where(allowed, 0.0, -np.inf).astype(np.float32)) if backend.framework == "torch"
            else backend.tensor(allowed))[None, None, None]  # each backend's filled_mask form
    with pytest.raises(ValueError, match=r"^mask: expected None with an int position \(1: the step attends to "
                                         r"positions 0 \.\. position; a filled_mask goes with a tensor "
                                         r"position\), got a mask$"):
        layer.extend(x, key, value, 1, mask=mask)
    assert not backend.numpy(key).any() and not backend.numpy(value).any()
