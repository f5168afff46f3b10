"""Issue 26, TensorFlow's compiled modes under hostile input: a cached decoding step past the
cache's capacity, and a source longer than ``max_len`` through a relaxed-shape graph, raise or give
NaN in every mode (eager, ``tf.function``, XLA); never finite numbers. And a torch ``DataLoader``
given to Keras' functions is checked batch by batch before an XLA step takes it (torch where
installed: the only test here that imports it).
"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("tensorflow")

import tensorflow as tf  # noqa: E402

from parity_tests.decoding_cases import config64, sources, targets  # noqa: E402
from parity_tests.tf_support import build  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
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


# Keras' words at the end of a pass of unknown length, the loader's as much as the checked one's
@pytest.mark.filterwarnings("ignore:Your input ran out of data")
def test_a_torch_data_loader_is_checked_batch_by_batch_before_an_xla_step():
    """Keras' `fit`, `evaluate` and `predict` take a torch ``DataLoader`` through an adapter of
    their own, and under XLA a bad id embeds as NaN: `fit` trained on the NaN loss and made every
    weight NaN without a word. Each batch is checked as the loader makes it: a bad one among
    Keras' first two reads (it reads them for their shapes) raises the eager ``ValueError``, a
    later one TensorFlow's ``InvalidArgumentError`` with the same words (as a generator's). A good
    loader's batches reach the model unchanged, and a pass over it is the loader's length in
    steps, whether its dataset has a length or not."""
    torch = pytest.importorskip("torch")
    import keras
    config = TransformerConfig.preset("tiny").replace(n_encoder_layers=1, n_decoder_layers=1)
    model = build(config)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    before = [v.numpy() for v in model.variables]
    src, tgt = src_tgt(config, batch=6, src_len=5, tgt_len=4)

    def collate(rows):  # ((src, tgt), tgt_out), as Keras unpacks a batch; torch's default makes lists
        s, t = (torch.stack(column) for column in zip(*rows))
        return (s, t), t

    def loader(ids, sized=True):  # batches of 2 rows
        pairs = torch.utils.data.TensorDataset(torch.tensor(ids), torch.tensor(tgt))

        class Pairs(torch.utils.data.IterableDataset):  # no length: Keras counts no steps ahead
            def __iter__(self):
                return iter(pairs)
        return torch.utils.data.DataLoader(pairs if sized else Pairs(), batch_size=2, collate_fn=collate)

    def bad_at(row):
        ids = src.copy()
        ids[row, 1] = config.src_vocab
        return ids

    bad_id = rf"src: expected token ids in \[0, {config.src_vocab}\), got values in \[0, {config.src_vocab}\]"
    for call in (lambda x: model.fit(x, shuffle=False, verbose=0), lambda x: model.evaluate(x, verbose=0),
                 lambda x: model.predict(x, verbose=0)):
        with pytest.raises(ValueError, match=bad_id):
            call(loader(bad_at(2)))  # the second batch
    for want, variable in zip(before, model.variables):
        np.testing.assert_array_equal(variable.numpy(), want, variable.path)
    assert int(model.optimizer.iterations) == 0
    with pytest.raises(tf.errors.InvalidArgumentError, match=bad_id):  # the third batch, in TF's pipeline
        model.evaluate(loader(bad_at(5)), verbose=0)
    np.testing.assert_array_equal(model.predict(loader(src), verbose=0),  # batches of one shape: the same bits
                                  model.predict((src, tgt), batch_size=2, verbose=0))
    for sized in (True, False):
        steps = []
        model.evaluate(loader(src, sized), verbose=0,
                       callbacks=[keras.callbacks.LambdaCallback(on_test_batch_end=lambda i, logs: steps.append(i))])
        assert steps == [0, 1, 2], (sized, steps)
