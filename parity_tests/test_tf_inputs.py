"""Bad input to tf_impl: the same error types and messages as the reference, before any lookup,
eagerly, inside tf.function and (as far as XLA allows) under jit_compile=True.

Keras wraps an error raised inside ``call`` with the call's arguments ("Exception encountered when
calling Transformer.call() ..."), keeping its type; the reference's message is inside, unchanged.
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from shared.batches import src_tgt  # noqa: E402
from parity_tests.tf_support import build, run_logits  # noqa: E402
from shared.tolerances import assert_close, bound_for  # noqa: E402
from shared import TransformerConfig, make_src_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402

CONFIG = TransformerConfig.preset("tiny")
W = random_weights(CONFIG, 0)
MODEL = build(CONFIG, W)
SRC, TGT = src_tgt(CONFIG, batch=2, src_len=5, tgt_len=4)


def _with(ids, value, row=0):
    out = ids.copy()
    out[row, 1] = value
    return out


BAD_IDS = [
    (SRC[0], TGT, ValueError, r"src: expected token ids of shape \(batch, seq\), got rank 1"),
    (SRC, TGT[None], ValueError, "tgt: expected token ids of shape"),
    (SRC.astype(np.float32), TGT, TypeError, "src: expected integer token ids, got dtype float32"),
    (SRC.astype(np.float64), TGT, TypeError, "src: expected integer token ids, got dtype float64"),
    (SRC, TGT.astype(bool), TypeError, "tgt: expected integer token ids, got dtype bool"),
    (_with(SRC, 13), TGT, ValueError, r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"),
    (SRC, _with(TGT, -1), ValueError, r"tgt: expected token ids in \[0, 17\), got values in \[-1,"),
    (np.ones((2, 65), np.int64), TGT, ValueError, "src: expected at most max_len=64 tokens, got 65"),
    (SRC[:, :0], TGT, ValueError, r"src: expected a non-empty \(batch, seq\), got shape \(2, 0\)"),
    (SRC, TGT[:1], ValueError, "tgt: expected batch size 2 \\(as src\\), got 1"),
]


@pytest.mark.parametrize("src, tgt, error, needle", BAD_IDS)
def test_bad_ids_fail_like_the_reference(src, tgt, error, needle):
    with pytest.raises(error, match=needle) as ours:
        MODEL(src, tgt)
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, src, tgt)
    assert str(theirs.value) in str(ours.value)
    with pytest.raises(error, match=needle):  # tf tensors: the same
        MODEL(tf.constant(src), tf.constant(tgt))


def test_out_of_range_id_raises_in_tf_function():
    """Graph mode: the check is an Assert that guards the lookup; InvalidArgumentError, same text."""
    fn = tf.function(lambda s, t: MODEL(s, t))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"):
        fn(tf.constant(_with(SRC, 13)), tf.constant(TGT))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"tgt: expected token ids in \[0, 17\), got values in \[-5, 16\]"):
        fn(tf.constant(SRC), tf.constant(_with(TGT, -5)))
    assert np.isfinite(fn(tf.constant(SRC), tf.constant(TGT)).numpy()).all()  # the same trace, good ids


def test_length_over_max_len_raises_in_tf_function_with_unknown_length():
    fn = tf.function(lambda s, t: MODEL(s, t), input_signature=[tf.TensorSpec([None, None], tf.int64)] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="src: expected at most max_len=64 tokens"):
        fn(np.full((2, 65), 3, np.int64), TGT)


def test_out_of_range_id_under_xla_gives_nan_rows_never_a_wrong_answer():
    """XLA compiles every Assert to a no-op and clamps gathers, so nothing can raise inside a
    jit_compile=True program: the rows with a bad id come out NaN, the others are unaffected."""
    fn = tf.function(lambda s, t: MODEL(s, t), jit_compile=True)
    good = fn(tf.constant(SRC), tf.constant(TGT)).numpy()
    for src, tgt in [(_with(SRC, 13), TGT), (_with(SRC, -1), TGT), (SRC, _with(TGT, 1000))]:
        out = fn(tf.constant(src), tf.constant(tgt)).numpy()
        assert np.isnan(out[0]).all()
        np.testing.assert_array_equal(out[1], good[1])


def test_predict_checks_ids_eagerly_even_when_compiled_with_xla():
    model = build(CONFIG, W)
    model.compile(jit_compile=True)
    with pytest.raises(ValueError, match=r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"):
        model.predict((_with(SRC, 13), TGT), verbose=0)
    with pytest.raises(ValueError, match=r"tgt: expected token ids in \[0, 17\)"):
        model.predict({"src": SRC, "tgt": _with(TGT, 17)}, verbose=0)


MASKS = [
    (dict(src_mask=np.ones((2, 1, 1, 5), np.int64)), TypeError,
     "src_mask: expected a bool mask .*got dtype int64"),
    (dict(src_mask=np.ones((2, 5), bool)), ValueError, r"src_mask: expected a rank-4 mask"),
    (dict(src_mask=np.ones((2, 1, 5, 5), bool)), ValueError, r"src_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 5), bool)), ValueError,
     r"tgt_mask: expected a mask broadcastable to \(batch\|1"),
    (dict(tgt_mask=np.ones((3, 1, 4, 4), bool)), ValueError, "tgt_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 4), np.float32)), TypeError, "tgt_mask: expected a bool mask"),
]


@pytest.mark.parametrize("kwargs, error, needle", MASKS)
def test_bad_masks_fail_like_the_reference(kwargs, error, needle):
    with pytest.raises(error, match=needle) as ours:
        MODEL(SRC, TGT, **kwargs)
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, SRC, TGT, **kwargs)
    assert str(theirs.value) in str(ours.value)
    with pytest.raises(error, match=needle):
        MODEL(SRC, TGT, **{k: tf.constant(v) for k, v in kwargs.items()})


def test_masks_must_be_arrays():
    with pytest.raises(TypeError, match="tgt_mask: expected a tf bool tensor, got list"):
        MODEL(SRC, TGT, tgt_mask=[[True]])


def test_ids_are_checked_before_any_lookup():
    with pytest.raises(ValueError, match="src: expected token ids in"):
        MODEL.encode(_with(SRC, 100))


def test_broadcast_and_explicit_masks_are_accepted():
    heads = np.ones((1, CONFIG.n_heads, 4, 4), bool) & np.tril(np.ones((4, 4), bool))
    want = R.forward(W, CONFIG, SRC, TGT, tgt_mask=heads)
    got = np.asarray(MODEL(SRC, TGT, tgt_mask=heads))
    assert_close(got, want, bound_for("float32", "tf:reference"))


@pytest.mark.parametrize("dtype", [np.int32, np.int16, np.uint8, np.uint16])
def test_other_integer_dtypes_give_the_same_logits(dtype):
    want = run_logits(MODEL, SRC, TGT)
    np.testing.assert_array_equal(np.asarray(MODEL(SRC.astype(dtype), TGT.astype(dtype))), want)


def test_python_lists_are_accepted():
    np.testing.assert_array_equal(np.asarray(MODEL(SRC.tolist(), TGT.tolist())), run_logits(MODEL, SRC, TGT))


def test_call_needs_tgt():
    with pytest.raises(ValueError, match="tgt: required"):
        MODEL(SRC)


def test_decode_checks_memory_and_requires_src_mask():
    memory = MODEL.encode(SRC)
    mask = make_src_mask(SRC, CONFIG.pad_id)
    with pytest.raises(ValueError, match="src_mask: required by decode"):
        MODEL.decode(TGT, memory, None)
    with pytest.raises(ValueError, match=r"memory: expected a tensor of shape \(batch, src_len, 16\)"):
        MODEL.decode(TGT, memory[..., :8], mask)
    with pytest.raises(TypeError, match="memory: expected dtype float32, got float64"):
        MODEL.decode(TGT, tf.cast(memory, tf.float64), mask)
    with pytest.raises(ValueError, match="tgt: expected batch size 1"):
        MODEL.decode(TGT, memory[:1], mask)
    with pytest.raises(ValueError, match="src_mask: expected a mask broadcastable"):
        MODEL.decode(TGT, memory, mask[..., :3])
