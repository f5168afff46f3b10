"""Issue 15, classes 2 to 5: nothing half-loaded, and nothing silently wrong in any execution mode.

Each test states the failing case (what happened before) and shows the fix.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")
torch = pytest.importorskip("torch")

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from shared import TransformerConfig, reference  # noqa: E402
from shared.config import POSITIONAL_TABLE_LIMIT  # noqa: E402
from shared.loss import label_smoothed_cross_entropy  # noqa: E402
from shared.weights import WeightsError, check_weights, random_weights  # noqa: E402
from tf_impl.training import label_smoothed_loss as tf_loss  # noqa: E402
from torch_impl.training import label_smoothed_loss as torch_loss  # noqa: E402

CONFIG = TransformerConfig.preset("tiny", dropout=0.0, n_encoder_layers=1, n_decoder_layers=1)
IDS = tf.TensorSpec([None, None], tf.int64)
MASK = tf.TensorSpec([None, None, None, None], tf.bool)


# -- 2. import reads each tensor once -------------------------------------------------------------
class Flaky(Mapping):
    """A lazy source: the first read of each tensor is right; a later one differs, or raises."""

    def __init__(self, weights: dict, second: str):
        self._weights, self._second, self.reads = weights, second, {}

    def __getitem__(self, name):
        self.reads[name] = self.reads.get(name, 0) + 1
        if self.reads[name] > 1:
            if self._second == "raises":
                raise OSError(f"lazy source: {name} went away")
            return np.full_like(self._weights[name], np.nan)
        return self._weights[name]

    def __iter__(self):
        return iter(self._weights)

    def __len__(self):
        return len(self._weights)


@pytest.mark.parametrize("second", ["differs", "raises"])
@pytest.mark.parametrize("impl", [torch_impl, tf_impl])
def test_import_weights_reads_each_tensor_once(impl, second):
    """Before: check_weights read the mapping, then import_weights read it again to copy; a second
    read that raised left a half-loaded model, one that differed loaded unchecked (NaN) values."""
    weights = random_weights(CONFIG, seed=3)
    source = Flaky(weights, second)
    model = impl.Transformer(CONFIG)
    model.import_weights(source)
    assert set(source.reads.values()) == {1}
    exported = model.export_weights()
    assert all(np.array_equal(exported[n], weights[n]) for n in weights)


@pytest.mark.parametrize("writer", ["reference", "torch", "tf"])
def test_every_reader_of_canonical_weights_reads_each_tensor_once(writer, tmp_path):
    """Before: the float64 reference and both native writers (``.pt``, ``.weights.h5``) checked the
    mapping, then read it again to copy: with a lazy source whose second read differs, the
    reference held NaN weights and torch wrote a ``.pt`` of NaN, without a word."""
    weights = random_weights(CONFIG, seed=3)
    source = Flaky(weights, "differs")
    if writer == "reference":
        got = reference.Model(source, CONFIG).w
    else:
        impl, name = (torch_impl, "w.pt") if writer == "torch" else (tf_impl, "w.weights.h5")
        impl.checkpoints.write_native(tmp_path / name, CONFIG, source)
        got = impl.checkpoints.read_checkpoint(tmp_path / name, CONFIG)[1]
    assert set(source.reads.values()) == {1}
    assert all(np.array_equal(got[n], weights[n]) for n in weights)


def test_an_unreadable_tensor_is_a_listed_problem_and_the_model_is_untouched():
    weights = random_weights(CONFIG, seed=3)
    model = torch_impl.Transformer(CONFIG)
    before = model.export_weights()
    source = Flaky(weights, "raises")
    source.reads = {n: 1 for n in weights}  # every first read already spent: all reads now fail
    with pytest.raises(WeightsError, match="could not be read") as err:
        model.import_weights(source)
    assert len(err.value.problems) == len(weights)
    assert all(np.array_equal(model.export_weights()[n], before[n]) for n in before)


def test_check_weights_returns_owned_copies():
    weights = random_weights(CONFIG, seed=3)
    checked = check_weights(CONFIG, weights)
    name = "generator.bias"
    weights[name][0] += 1.0  # the caller's array changes after the check...
    assert checked[name][0] != weights[name][0]  # ...what was checked does not


# -- 3. checks that hold in every TF execution mode -------------------------------------------------
@pytest.fixture(scope="module")
def tf_model():
    model = tf_impl.Transformer(CONFIG)
    model.import_weights(random_weights(CONFIG, seed=0))
    return model


def _modes(model):
    """The call under each execution mode whose shape checks once depended on static shapes."""
    def call(s, t, m):
        return model(s, t, src_mask=m)
    return {
        "signature": tf.function(call, input_signature=[IDS, IDS, MASK]),
        "reduce_retracing": tf.function(call, reduce_retracing=True),
        "xla": tf.function(call, input_signature=[IDS, IDS, MASK], jit_compile=True),
    }


SRC = np.array([[3, 4, 5, 0, 0]], np.int64)
TGT = np.array([[1, 3, 4]], np.int64)


@pytest.mark.parametrize("mode", ["signature", "reduce_retracing", "xla"])
def test_a_mask_that_broadcasts_over_the_key_axis_fails_in_every_mode(tf_model, mode):
    """Before: with None dimensions the key axis was taken as matching, so a (1, 1, 1, 1) mask
    broadcast over every key and padding was attended, with finite, wrong logits."""
    fn = _modes(tf_model)[mode]
    good = (SRC != 0)[:, None, None, :]
    if mode == "reduce_retracing":  # a first call traces exact shapes; the next ones relax them
        fn(SRC, TGT, good), fn(SRC[:, :4], TGT[:, :2], good[..., :4])
    bad = np.ones((1, 1, 1, 1), bool)
    with pytest.raises(ValueError, match=r"src_mask: expected a mask broadcastable to"):
        tf_model(SRC, TGT, src_mask=bad)  # eager: the reference's ValueError
    if mode == "xla":  # an Assert compiles to nothing: the result is NaN instead
        assert np.isnan(fn(SRC, TGT, bad).numpy()).all()
        assert np.isfinite(fn(SRC, TGT, good).numpy()).all()
    else:
        eager = r"src_mask: expected a mask broadcastable to \(batch\|1, heads\|1, 1\|1, 5\) = " \
                r"\(1\|1, 4\|1, 1\|1, 5\), got shape \(1, 1, 1, 1\)"
        with pytest.raises(tf.errors.InvalidArgumentError, match=eager):
            fn(SRC, TGT, bad)


@pytest.mark.parametrize("mode", ["signature", "xla"])
def test_an_empty_source_fails_in_every_mode(tf_model, mode):
    """Before: under XLA the length assertion compiled to nothing and an empty source gave finite
    logits (attention over no key is a zero row, by convention 3)."""
    fn = tf.function(lambda s, t: tf_model(s, t), input_signature=[IDS, IDS],
                     jit_compile=mode == "xla")
    empty = np.zeros((1, 0), np.int64)
    if mode == "xla":
        assert np.isnan(fn(empty, TGT).numpy()).all()
    else:
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match=r"src: expected a non-empty \(batch, seq\), got shape \(1, 0\)"):
            fn(empty, TGT)


def test_a_batch_mismatch_fails_with_the_eager_message_in_graph_mode(tf_model):
    """Before: it failed deep in a reshape ("Input to reshape is a tensor with 96 values...")."""
    fn = tf.function(lambda s, t: tf_model(s, t), input_signature=[IDS, IDS])
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"tgt: expected batch size 2 \(as src\), got 1"):
        fn(np.repeat(SRC, 2, axis=0), TGT)


def test_a_run_time_check_outside_the_model_refuses_to_trace_under_xla():
    fn = tf.function(lambda s: tf_impl.inputs.check_ids("src", s, 10, 8), input_signature=[IDS],
                     jit_compile=True)
    with pytest.raises(ValueError, match="under XLA"):
        fn(SRC)


# -- 4. loss targets --------------------------------------------------------------------------------
LOGITS = np.random.default_rng(0).normal(size=(1, 3, 5)).astype(np.float32)


@pytest.mark.parametrize("bad", [-1, 5])
def test_a_target_outside_the_vocabulary_is_refused_everywhere_with_one_message(bad):
    """Before: the reference wrapped -1 to the last class, TF's one-hot made a zero row (a finite,
    wrong loss), torch raised a bare IndexError."""
    targets = np.array([[1, bad, 0]])
    message = rf"targets: expected token ids in \[0, 5\), got values in \[{min(bad, 0)}, {max(bad, 1)}\]"
    with pytest.raises(ValueError, match=message):
        label_smoothed_cross_entropy(LOGITS, targets, 0, 0.1)
    with pytest.raises(ValueError, match=message):
        torch_loss(torch.from_numpy(LOGITS), torch.from_numpy(targets), 0, 0.1)
    with pytest.raises(ValueError, match=message):
        tf_loss(LOGITS, targets, 0, 0.1)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message):
        tf.function(lambda a, b: tf_loss(a, b, 0, 0.1))(LOGITS, targets)
    xla = tf.function(lambda a, b: tf_loss(a, b, 0, 0.1), jit_compile=True)
    assert math.isnan(float(xla(LOGITS, targets)))
    good = np.array([[1, 4, 0]])
    assert np.isclose(float(xla(LOGITS, good)), label_smoothed_cross_entropy(LOGITS, good, 0, 0.1),
                      rtol=1e-5)


# -- 5. config values that cannot compute ----------------------------------------------------------
@pytest.mark.parametrize("eps", [math.inf, math.nan])
def test_a_non_finite_norm_eps_is_refused(eps):
    """Before: inf passed (`> 0`) and every layer norm gave zeros; NaN failed as "positive"."""
    with pytest.raises(ValueError, match="TransformerConfig.norm_eps: expected a positive finite float"):
        TransformerConfig.preset("tiny", norm_eps=eps)


def test_a_positional_table_too_large_to_allocate_is_refused_by_name():
    """Before: max_len=10**9 was accepted and the backends died with a MemoryError building the table."""
    with pytest.raises(ValueError, match="POSITIONAL_TABLE_LIMIT"):
        TransformerConfig.preset("tiny", max_len=10 ** 9)
    TransformerConfig.preset("tiny", max_len=POSITIONAL_TABLE_LIMIT // 16)  # the limit itself is fine
