"""tf_impl.training on its own: the built-in loss against the float64 NumPy loss, the Noam rates
the optimizer actually uses, the Adam update written as Algorithm 1, dropout in training only, one
trace for every batch shape, and bad batches. (Mirrors test_training_torch.py.)"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import tf_impl  # noqa: E402
from parity_tests.tf_support import build  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from shared import TransformerConfig, noam_lr, tasks  # noqa: E402
from shared.loss import label_smoothed_cross_entropy  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl import training  # noqa: E402

CONFIG = TransformerConfig.preset("tiny", src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB,
                                  dropout=0.0, dtype="float64")


def loss_case(dtype: str, seed: int = 0):
    """Logits (3, 6, 11) and targets with padding: a full row, a padded row, an all-padding row."""
    rng = np.random.default_rng(seed)
    logits = (3.0 * rng.normal(size=(3, 6, 11))).astype(dtype)
    targets = rng.integers(1, 11, size=(3, 6))
    targets[1, 4:] = 0
    targets[2, :] = 0
    return logits, targets


def copy_batch(n: int = 4, seed: int = 0, length: int = 10):
    pairs = tasks.copy_examples(n, seed, length)
    sources = [s[: length - 2 * i] for i, (s, _) in enumerate(pairs)]  # progressively padded
    return tasks.batch_sequences(sources, sources)


@pytest.fixture(scope="module")
def trained():
    """One model and optimizer for the tests that train (the step is traced once for all of them)."""
    model = build(CONFIG, random_weights(CONFIG, 0))
    return model, training.make_optimizer(model, warmup=10, factor=0.5)


# -- loss -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loss_matches_the_numpy_reference(dtype, smoothing):
    logits, targets = loss_case(dtype)
    expected = label_smoothed_cross_entropy(logits.astype(np.float64), targets, 0, smoothing)
    got = training.label_smoothed_loss(tf.constant(logits), tf.constant(targets), 0, smoothing)
    assert got.dtype.name == dtype  # not Keras' float32 default
    bound = FLOAT64 if dtype == "float64" else bound_for(dtype, "tf:reference")
    assert_close(float(got), expected, bound, f"loss eps={smoothing}")


def test_loss_ignores_what_padding_positions_predict():
    logits, targets = loss_case("float64")
    changed = logits.copy()
    changed[targets == 0] = 100.0  # any logits at padding targets
    a = training.label_smoothed_loss(logits, targets, 0, 0.1)
    b = training.label_smoothed_loss(changed, targets, 0, 0.1)
    assert float(a) == float(b)


def test_loss_of_only_padding_is_nan():
    logits, targets = loss_case("float64")
    assert np.isnan(float(training.label_smoothed_loss(logits, np.zeros_like(targets), 0)))


@pytest.mark.parametrize("logits_shape, targets, smoothing, error, needle", [
    ((2, 3, 5), np.ones((3, 2), np.int64), 0.0, ValueError,
     r"expected logits \(B, T, V\) and targets \(B, T\)"),
    ((2, 3, 5), np.ones((2, 3), np.float32), 0.0, TypeError, "targets: expected integer ids, got dtype"),
    ((2, 3, 5), np.ones((2, 3), np.int64), 1.0, ValueError,
     r"smoothing: expected a value in \[0, 1\), got 1.0"),
])
def test_loss_bad_arguments(logits_shape, targets, smoothing, error, needle):
    with pytest.raises(error, match=needle):
        training.label_smoothed_loss(tf.zeros(logits_shape), tf.constant(targets), 0, smoothing)


# -- Noam schedule and Adam -----------------------------------------------------------------------
@pytest.mark.parametrize("d_model, warmup, factor, start_step", [(16, 10, 0.1, 0), (512, 4000, 1.0, 0),
                                                                 (16, 10, 2.0, 7)])
def test_rates_used_at_steps_1_to_n_are_noam(d_model, warmup, factor, start_step):
    """Keras evaluates the schedule at ``optimizer.iterations`` (0 at the first update, advanced by each
    apply); that the update really uses this rate is test_adam_update_is_algorithm_1's business."""
    model = tf_impl.Transformer(CONFIG)
    optimizer = training.make_optimizer(model, d_model, warmup, factor, start_step)
    used = []
    for _ in range(40):
        used.append(float(optimizer.learning_rate))  # what the next apply will use
        optimizer.iterations.assign_add(1)  # as apply does, without 92 eager variable updates
    assert used == noam_lr(np.arange(1, 41) + start_step, d_model, warmup, factor).tolist()


def test_schedule_is_exact_in_a_graph_and_serialises():
    schedule = training.noam_schedule(512, 4000, 1.0)
    steps = np.arange(0, 20000)
    rates = tf.function(schedule)(tf.constant(steps)).numpy()
    assert rates.dtype == np.float64 and (rates == noam_lr(steps + 1, 512, 4000)).all()  # bit for bit
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(again) is training.NoamSchedule and again.get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="start_step: expected an int >= 0"):
        training.noam_schedule(16, 10, start_step=-1)


def test_optimizer_is_the_papers_adam_over_each_variable_once():
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    model = tf_impl.Transformer(config)
    optimizer = training.make_optimizer(model)
    assert isinstance(optimizer, keras.optimizers.Adam) and optimizer.built
    assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
    assert not optimizer.amsgrad and optimizer.weight_decay is None
    variables = model.trainable_variables
    assert len({id(v) for v in variables}) == len(variables) == len(random_weights(config))
    with pytest.raises(ValueError, match="amsgrad: not supported"):
        training.KingmaBaAdam(amsgrad=True)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adam_update_is_algorithm_1(dtype):
    """KingmaBaAdam against Kingma & Ba's Algorithm 1 written out in float64 NumPy (eps added to
    the bias-corrected sqrt(v_hat)), over gradients from large to near eps and zero."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(4, 5))
    grads = [rng.normal(size=(4, 5)) * 10.0 ** rng.integers(-12, 1, size=(4, 5)) for _ in range(30)]
    grads[3][0] = 0.0
    variable = keras.Variable(start.astype(dtype))
    optimizer = training.KingmaBaAdam(learning_rate=training.noam_schedule(16, 10, 0.1),
                                      beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    w, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for t, g in enumerate(grads, start=1):
        optimizer.apply_gradients([(tf.constant(g.astype(dtype)), variable)])
        m = 0.9 * m + 0.1 * g
        v = 0.98 * v + 0.02 * g * g
        lr = noam_lr(t, 16, 10, 0.1)
        w = w - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.98 ** t)) + 1e-9)
    bound = FLOAT64 if dtype == "float64" else bound_for(dtype, "tf:reference")
    assert_close(variable.numpy(), w, bound, "variable after 30 Adam steps")


# -- steps, gradients and dropout -----------------------------------------------------------------
def test_train_step_learns_and_returns_python_floats(trained):
    model, optimizer = trained
    batch = copy_batch()
    results = [training.train_step(model, optimizer, batch) for _ in range(30)]
    assert all(type(r.loss) is float and type(r.lr) is float for r in results)
    assert results[-1].loss < 0.5 * results[0].loss


def test_train_step_is_traced_once_for_every_batch_shape(trained):
    model, optimizer = trained
    for n, length in [(4, 10), (2, 6), (5, 12)]:
        training.train_step(model, optimizer, copy_batch(n, seed=n, length=length))
    step = training._compiled_step(model, optimizer, 0.0)
    assert step.experimental_get_tracing_count() == 1


def test_dropout_is_on_in_training_only():
    config = CONFIG.replace(dropout=0.5)
    model, batch = build(config, random_weights(config, 0)), copy_batch()
    first, second = (training.gradients(model, batch) for _ in range(2))
    assert any(not np.array_equal(first[n], second[n]) for n in first)  # fresh dropout masks
    plain = training.gradients(build(CONFIG, random_weights(CONFIG, 0)), batch, training=False)
    for name, value in training.gradients(model, batch, training=False).items():
        np.testing.assert_array_equal(value, plain[name], err_msg=name)  # dropout off: deterministic


def test_gradients_use_the_canonical_layout():
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    grads = training.gradients(build(config, random_weights(config, 0)), copy_batch(), smoothing=0.1)
    schema = {name: value.shape for name, value in random_weights(config).items()}
    assert {name: g.shape for name, g in grads.items()} == schema
    assert all(type(g) is np.ndarray for g in grads.values())  # embedding IndexedSlices made dense


@pytest.mark.parametrize("mutate, error, needle", [
    (lambda b: b[:2], ValueError, r"batch: expected \(src, tgt_in, tgt_out\)"),
    (lambda b: (b[0], b[1], b[2][:, :-1]), ValueError, "tgt_out: expected the shape of tgt_in"),
    (lambda b: (b[0], b[1], np.zeros_like(b[2])), ValueError, "expected at least one non-padding target"),
    (lambda b: (b[0], b[1], b[2] + 100), ValueError, r"tgt_out: expected token ids in \[0, 14\)"),
    (lambda b: (b[0].astype(np.float32), b[1], b[2]), TypeError, "src: expected integer token ids"),
])
def test_bad_batches_are_refused_before_any_update(trained, mutate, error, needle):
    model, optimizer = trained
    before = model.export_weights()
    with pytest.raises(error, match=needle):
        training.train_step(model, optimizer, mutate(copy_batch()))
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
