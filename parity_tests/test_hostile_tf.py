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
