"""Bad input to every eager backend: the same error types and messages as the reference, before any
compute (ids range-checked before any lookup). TF graph mode, XLA, ``predict`` and Python lists:
test_tf_only.py; torch's refusal of non-tensor ids: test_torch_only.py.

Every backend raises the reference's message as it is: tf_impl's ``call`` marks its refusals so that
Keras does not wrap them ("Exception encountered when calling Transformer.call() ...", with the
call's arguments), which it did until session 40.
"""
import re
import sys

import numpy as np
import pytest

from parity_tests.backends import backends, cached_weights
from parity_tests.input_cases import BAD_IDS, BAD_MASKS, CONFIG, SRC, TGT, W, with_id
from shared import reference as R
from shared.tolerances import assert_close, bound_for

EAGER = backends()


@pytest.fixture(autouse=True)
def keras_wraps_errors_of_call():
    """Keras' default, traceback filtering on (it wraps an error of ``call`` unless the error is
    marked), whatever a test before in this process set: twins' adapters turn it off."""
    keras = sys.modules.get("keras")  # not imported yet: its default holds
    if keras is None:
        yield
        return
    was = keras.config.is_traceback_filtering_enabled()
    keras.config.enable_traceback_filtering()
    try:
        yield
    finally:
        if not was:
            keras.config.disable_traceback_filtering()


def _same_message(backend, ours, theirs):
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("backend", EAGER)
@pytest.mark.parametrize("src, tgt, error, needle", BAD_IDS)
def test_bad_ids_fail_like_the_reference(src, tgt, error, needle, backend):
    model = backend.cached(CONFIG)
    with pytest.raises(error, match=needle) as ours:
        backend.call(model, src, tgt)
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, src, tgt)
    _same_message(backend, ours, theirs)
    if backend.framework == "tf":  # NumPy ids straight in: the same
        with pytest.raises(error, match=needle) as ours:
            model(src, tgt)
        _same_message(backend, ours, theirs)


@pytest.mark.parametrize("backend", EAGER)
@pytest.mark.parametrize("kwargs, error, needle", BAD_MASKS)
def test_bad_masks_fail_like_the_reference(kwargs, error, needle, backend):
    model = backend.cached(CONFIG)
    with pytest.raises(error, match=needle) as ours:
        backend.call(model, SRC, TGT, **kwargs)
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, SRC, TGT, **kwargs)
    _same_message(backend, ours, theirs)
    if backend.framework == "tf":  # NumPy masks straight in: the same
        with pytest.raises(error, match=needle):
            model(SRC, TGT, **kwargs)


@pytest.mark.parametrize("backend", EAGER)
def test_masks_must_be_tensors_or_arrays(backend):
    """torch_impl's model call takes torch tensors only, as it takes its ids; tf_impl's takes
    arrays too, and refuses anything else as every decoder does (`shared.checks.mask_array`)."""
    model = backend.cached(CONFIG)
    expected = ("tgt_mask: expected a torch bool tensor, got list" if backend.framework == "torch" else
                "tgt_mask: expected a bool array or tensor (True = may attend), got list")
    with pytest.raises(TypeError, match=re.escape(expected)):
        model(backend.tensor(SRC), backend.tensor(TGT), tgt_mask=[[True]])


# (hidden states given to model.generator, error type, the message): the same in every backend
BAD_HIDDEN = [
    (np.float32(1.0), ValueError, f"x: expected hidden states of shape (..., {CONFIG.d_model}), got ()"),
    (np.ones((2, 3, CONFIG.d_model + 1), np.float32), ValueError,
     f"x: expected hidden states of shape (..., {CONFIG.d_model}), got (2, 3, {CONFIG.d_model + 1})"),
    (np.ones((2, 3, CONFIG.d_model)), TypeError, "x: expected dtype float32, got float64"),
    (np.ones((2, 3, CONFIG.d_model), np.int64), TypeError, "x: expected dtype float32, got int64"),
]


@pytest.mark.parametrize("backend", EAGER)
def test_the_generator_takes_hidden_states_of_any_rank_and_refuses_the_rest_alike(backend):
    """Before: a wrong width failed in each framework's words (torch's product, TF's reshape), a
    float64 input was cast by Keras and refused by torch, and a step's rows ``(N, d)`` (as
    torch_impl's own steps give them) ran in torch_impl alone."""
    model = backend.cached(CONFIG)
    for x, error, message in BAD_HIDDEN:
        with pytest.raises(error) as err:
            model.generator(backend.tensor(x))
        assert str(err.value) == message
    hidden = np.random.default_rng(0).standard_normal((2, 3, CONFIG.d_model)).astype(np.float32)
    with backend.placed():
        whole = backend.numpy(model.generator(backend.tensor(hidden)))
        rows = backend.numpy(model.generator(backend.tensor(hidden.reshape(6, CONFIG.d_model))))
    assert whole.shape == (2, 3, CONFIG.tgt_vocab)
    np.testing.assert_array_equal(rows, whole.reshape(6, CONFIG.tgt_vocab))


@pytest.mark.parametrize("backend", EAGER)
def test_ids_are_checked_before_any_lookup(backend):
    """An id out of range must not reach the embedding (torch CPU: IndexError, CUDA: a device
    assert; TF: zeros on GPU, clamped under XLA)."""
    with pytest.raises(ValueError, match="src: expected token ids in"):
        backend.cached(CONFIG).encode(backend.tensor(with_id(SRC, 100)))


@pytest.mark.parametrize("backend", EAGER)
def test_broadcast_and_explicit_masks_are_accepted(backend):
    heads = np.ones((1, CONFIG.n_heads, 4, 4), bool) & np.tril(np.ones((4, 4), bool))
    want = R.forward(W, CONFIG, SRC, TGT, tgt_mask=heads)
    got = backend.logits(backend.cached(CONFIG), SRC, TGT, tgt_mask=heads)
    assert_close(got, want, bound_for("float32", backend.pair))


# uint16: torch has the dtype but not the ops (aminmax) on it; TF takes it.
INT_DTYPES = {"torch": [np.int32, np.int16, np.uint8], "tf": [np.int32, np.int16, np.uint8, np.uint16]}


@pytest.mark.parametrize("backend", EAGER)
def test_other_integer_dtypes_give_the_same_logits(backend):
    model = backend.cached(CONFIG)
    want = backend.logits(model, SRC, TGT)
    for dtype in INT_DTYPES[backend.framework]:
        got = backend.logits(model, SRC.astype(dtype), TGT.astype(dtype))
        np.testing.assert_array_equal(got, want, err_msg=np.dtype(dtype).name)


@pytest.mark.parametrize("backend", EAGER)
def test_return_trace_and_return_weights_are_flags(backend):
    """Before: read for their truth, so "no" returned the trace or the weights."""
    model = backend.cached(CONFIG)
    with pytest.raises(TypeError, match="return_trace: expected True or False, got 'no' \\(str\\)"):
        model(backend.tensor(SRC), backend.tensor(TGT), return_trace="no")
    x = backend.tensor(np.ones((1, 3, CONFIG.d_model), np.float32))
    with pytest.raises(TypeError, match="return_weights: expected True or False, got 'no' \\(str\\)"):
        model.encoder.layers[0].self_attn(x, x, None, return_weights="no")


@pytest.mark.parametrize("backend", EAGER)
def test_narrow_ids_are_masked_against_the_pad_id_as_numbers(backend):
    """uint8 ids and pad_id 300, which uint8 cannot hold: no id is padding. torch_impl compared in
    uint8, where 300 is 44, and masked token 44: logits 0.23 off the reference's, other tokens."""
    config = CONFIG.replace(src_vocab=400, tgt_vocab=400, pad_id=300, dtype="float64")
    model = backend.cached(config)
    src, tgt = np.array([[5, 44, 7, 9]]), np.array([[1, 44, 44, 2]])
    want = R.forward(cached_weights(config), config, src, tgt)
    got = backend.logits(model, src.astype(np.uint8), tgt.astype(np.uint8))
    assert_close(got, want, bound_for("float64", backend.pair))


@pytest.mark.parametrize("backend", EAGER)
def test_decode_checks_memory_and_requires_src_mask(backend):
    model = backend.cached(CONFIG)
    src, tgt = backend.tensor(SRC), backend.tensor(TGT)
    memory = model.encode(src)
    mask = backend.tensor(np.asarray(SRC != CONFIG.pad_id)[:, None, None, :])
    with pytest.raises(ValueError, match="src_mask: required by decode"):
        model.decode(tgt, memory, None)
    with pytest.raises(ValueError, match=r"memory: expected a tensor of shape \(batch, src_len, 16\)"):
        model.decode(tgt, memory[..., :8], mask)
    with pytest.raises(ValueError, match="tgt: expected batch size 1"):
        model.decode(tgt, memory[:1], mask)
    with pytest.raises(ValueError, match="src_mask: expected a mask broadcastable"):
        model.decode(tgt, memory, mask[..., :3])
    # encode's dtype: torch_impl multiplied float64 memory by float32 weights and raised there
    wide = backend.tensor(np.asarray(backend.numpy(memory), np.float64))
    for call in (lambda: model.decode(tgt, wide, mask), lambda: model.init_cache(wide, mask, 3),
                 lambda: model.decode(backend.tensor(np.asarray(TGT, np.float32)), wide, mask)):
        with pytest.raises(TypeError, match="^memory: expected dtype float32, got float64$"):
            call()  # the memory is named first, in both backends, as tf_impl always did
