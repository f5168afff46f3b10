"""Issue 26, TensorFlow's compiled modes under hostile input: a cached decoding step past the
cache's capacity, and a source longer than ``max_len`` through a relaxed-shape graph, raise or give
NaN in every mode (eager, ``tf.function``, XLA); never finite numbers.
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tensorflow as tf  # noqa: E402

from parity_tests.decoding_cases import config64, sources, targets  # noqa: E402
from parity_tests.tf_support import build  # noqa: E402
from shared.tolerances import FLOAT64, assert_close  # noqa: E402
from tf_impl.inputs import make_src_mask  # noqa: E402

CAPACITY = 2


@pytest.fixture(scope="module")
def model_and_cache():
    config = config64("tiny-post-standard")
    model = build(config, seed=1)
    src = sources(config, 0, lengths=(7, 3))
    tgt = targets(config, 2, CAPACITY + 1, 2)
    memory = model.encode(src)
    cache = model.init_cache(memory, make_src_mask(src, config.pad_id), max_len=CAPACITY)
    for t in range(CAPACITY):
        _, cache = model.decode_step(tgt[:, t], cache)
    return model, cache, tf.constant(tgt[:, CAPACITY])


def test_eager_step_past_the_cache_raises(model_and_cache):
    model, full, tokens = model_and_cache
    with pytest.raises(ValueError, match=r"^cache: expected a free position, got a full cache \(2 positions"):
        model.decode_step(tokens, full)


def test_graph_step_past_the_cache_raises(model_and_cache):
    model, full, tokens = model_and_cache
    step = tf.function(lambda t, c: model.decode_step(t, c), jit_compile=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"cache: expected a free position, got a full cache"):
        step(tokens, full)


def test_xla_step_past_the_cache_gives_nan_logits_not_finite_ones(model_and_cache):
    """The issue's case: a third step on a cache sized for two positions, compiled with XLA. The
    same compiled function on a cache with a free position gives the eager step's logits."""
    model, full, tokens = model_and_cache
    step = tf.function(lambda t, c: model.decode_step(t, c)[0], jit_compile=True)
    logits = step(tokens, full).numpy()
    assert logits.shape == (2, model.config.tgt_vocab) and np.isnan(logits).all()
    free = full._replace(length=tf.constant(CAPACITY - 1, tf.int32))  # the last position again
    assert_close(step(tokens, free).numpy(), model.decode_step(tokens, free)[0].numpy(), FLOAT64,
                 "XLA step on a free position")


def test_a_relaxed_shape_source_longer_than_max_len_raises_or_gives_nan(model_and_cache):
    """A graph traced with unknown lengths (``None`` in the input_signature): a source past
    ``max_len`` raises the project's message in ``tf.function`` and gives NaN under XLA (it failed
    with XLA's "Incompatible shapes: [2,65,16] vs. [64,16]"); a source within it is computed."""
    model = model_and_cache[0]
    max_len = model.config.max_len
    spec = tf.TensorSpec([None, None], tf.int32)
    src = np.ones((2, max_len + 1), np.int32)
    tgt = np.ones((2, 3), np.int32)
    graph = tf.function(lambda s, t: model(s, t), input_signature=[spec, spec], jit_compile=False)
    with pytest.raises(tf.errors.InvalidArgumentError, match=rf"src: expected at most max_len={max_len} tokens, got {max_len + 1}"):
        graph(src, tgt)
    xla = tf.function(lambda s, t: model(s, t), input_signature=[spec, spec], jit_compile=True)
    assert np.isnan(xla(src, tgt).numpy()).all()
    assert_close(xla(src[:, :max_len], tgt).numpy(), model(src[:, :max_len], tgt).numpy(), FLOAT64,
                 "relaxed-shape XLA within max_len")


def test_a_ragged_list_is_named_as_in_the_reference(model_and_cache):
    model = model_and_cache[0]
    with pytest.raises(ValueError, match=r"src: expected token ids of shape \(batch, seq\), every row of "
                                         r"one length, got rows of lengths \[2, 1\]; pad the rows"):
        model([[1, 2], [3]], [[1, 2], [1, 2]])


@pytest.mark.parametrize("attribute, value, expected", [
    ("format", np.array([b"a", b"b"]), r"expected format 'twin-transformer/tf_impl', got \[b'a', b'b'\]"),
    ("format_version", np.array([1, 2]), r"unknown format_version \[1, 2\], this version reads 1"),
    ("config", np.array([1.0]), r"attribute twin_transformer.config expected a JSON string, got list"),
])
def test_a_malformed_weights_file_attribute_is_named(model_and_cache, tmp_path, attribute, value, expected):
    """An array where a tf_impl .weights.h5 keeps a string or an int (it gave NumPy's "truth value
    of an array is ambiguous")."""
    import h5py
    import tf_impl
    path = tmp_path / "model.weights.h5"
    tf_impl.save_checkpoint(model_and_cache[0], path)
    with h5py.File(path, "r+") as f:
        f.attrs[f"twin_transformer.{attribute}"] = value
    with pytest.raises(ValueError, match=rf"^{str(path)!r}: {expected}"):
        tf_impl.load_checkpoint(path)


def test_an_unsigned_id_past_int64_is_reported_as_given(model_and_cache):
    model = model_and_cache[0]
    ids = np.array([[2**63 + 5, 1]], dtype=np.uint64)
    with pytest.raises(ValueError, match=rf"src: expected token ids in \[0, {model.config.src_vocab}\), got "
                                         r"values in \[1, 9223372036854775813\]"):
        model(ids, np.ones((1, 2), np.int64))
