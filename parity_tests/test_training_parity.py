"""Training parity, torch_impl vs tf_impl from identical weights and data, dropout 0: the gradient of
every canonical weight and the loss (against the float64 NumPy loss of the reference logits), one
Adam update, 50 steps of Adam + Noam with the weights compared after every step, and a run saved by
one backend resumed in the other.

Attention key biases are gradient-free: softmax over the keys ignores ``q . b_k``, the same for every
key, so their exact gradient is 0 and each backend computes rounding noise (< 1e-16 of the gradient
scale in float64, ~3e-8 in float32). Adam divides by ``sqrt(v_hat) + 1e-9``: float64 noise moves
them by ~lr * noise / eps, and float32 noise, being larger than eps, by ~lr in a random direction.
Neither changes the model's function, so trajectories compare them apart from the other weights.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402
import tf_impl  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from parity_tests.matrix import VARIANTS, copy_batches  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from parity_tests.torch_support import DEVICES, build  # noqa: E402
from shared import noam_lr, tasks  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.loss import label_smoothed_cross_entropy  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl import training as tf_training  # noqa: E402
from torch_impl import training as torch_training  # noqa: E402

GRAD_VARIANTS = ["tiny-pre-annotated", "tiny-post-standard", "tiny-tied", "tiny-shared-tied-post"]
STEPS, WARMUP, FACTOR = 50, 10, 0.1  # peak rate 0.0079 at step 10, then decay: a realistic Adam run


def bound(dtype: str, pair: str):
    return FLOAT64 if dtype == "float64" else bound_for(dtype, pair)


def tf_model(config, weights):
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    return model


def padded_batch(config, seed: int = 0):
    """(src, tgt_in, tgt_out): a full row, a padded row and an all-padding row (its targets too)."""
    src, tgt_in = src_tgt(config, batch=3, src_len=7, tgt_len=6, seed=seed, src_lengths=[7, 4, 0],
                          tgt_lengths=[6, 3, 0])
    tgt_out = np.roll(tgt_in, -1, axis=1)  # the next token; EOS where tgt_in's tokens end
    tgt_out[:, -1] = config.eos_id
    tgt_out[tgt_in == config.pad_id] = config.pad_id
    tgt_out[1, 2] = config.eos_id
    return src, tgt_in, tgt_out


def normalised(grads: dict, scale: float) -> dict:
    return {name: g / scale for name, g in grads.items()}


# -- gradients and loss ---------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", GRAD_VARIANTS)
def test_every_weight_gets_the_same_gradient(variant, dtype, device):
    """With label smoothing 0 and 0.1. Compared relative to the gradient's scale, its largest entry
    over the model (torch's): float64's 1e-12 means 1e-12 of the biggest gradient, whatever its size."""
    config = VARIANTS[variant].replace(dtype=dtype, dropout=0.0)
    weights, batch = random_weights(config, 1), padded_batch(config)
    torch_model, tf_model_ = build(config, weights, device), tf_model(config, weights)
    for smoothing in (0.0, 0.1):
        expected = torch_training.gradients(torch_model, batch, smoothing)
        got = tf_training.gradients(tf_model_, batch, smoothing)
        assert list(got) == list(expected) == list(weights)  # every canonical name, tied ones once
        scale = max(float(np.abs(g).max()) for g in expected.values())
        assert scale > 0.1  # a real gradient, not a vanished one
        expected, got = normalised(expected, scale), normalised(got, scale)
        for name in expected:
            assert_close(got[name], expected[name], bound(dtype, "grad:torch:tf"),
                         f"grad {name} (smoothing {smoothing})")


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_key_bias_gradients_vanish_in_both(dtype):
    config = VARIANTS["tiny-post-standard"].replace(dtype=dtype, dropout=0.0)
    weights, batch = random_weights(config, 1), padded_batch(config)
    limit = {"float64": 1e-15, "float32": 1e-6}[dtype]  # measured <= 1e-16 and 4e-8 of the scale
    for grads in (torch_training.gradients(build(config, weights), batch, 0.1),
                  tf_training.gradients(tf_model(config, weights), batch, 0.1)):
        scale = max(float(np.abs(g).max()) for g in grads.values())
        for name, g in grads.items():
            if name.endswith(".key.bias"):
                assert np.abs(g).max() <= limit * scale, name


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_losses_equal_the_numpy_loss_of_the_reference_logits(dtype, smoothing):
    config = VARIANTS["tiny-shared-tied-post"].replace(dtype=dtype, dropout=0.0)
    weights, (src, tgt_in, tgt_out) = random_weights(config, 2), padded_batch(config, seed=2)
    f64 = config.replace(dtype="float64")
    logits = R.forward({n: w.astype(np.float64) for n, w in weights.items()}, f64, src, tgt_in)
    expected = label_smoothed_cross_entropy(logits, tgt_out, config.pad_id, smoothing)
    with torch.no_grad():
        torch_logits = build(config, weights)(torch.from_numpy(src), torch.from_numpy(tgt_in))
        torch_loss = torch_training.label_smoothed_loss(torch_logits, torch.from_numpy(tgt_out),
                                                        config.pad_id, smoothing).item()
    tf_loss = float(tf_training.label_smoothed_loss(tf_model(config, weights)(src, tgt_in), tgt_out,
                                                    config.pad_id, smoothing))
    assert_close(torch_loss, expected, bound(dtype, "torch:reference"), "torch loss")
    assert_close(tf_loss, expected, bound(dtype, "tf:reference"), "tf loss")


# -- Adam -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_one_variable_takes_the_same_adam_steps(dtype):
    """torch.optim.Adam + LambdaLR(Noam) and KingmaBaAdam + NoamSchedule, 30 steps of gradients from
    1 down to 1e-12 (below eps, where Keras' stock Adam parts from torch: 7e-4 here) and zeros."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(4, 5)).astype(dtype)
    grads = [(rng.normal(size=(4, 5)) * 10.0 ** rng.integers(-12, 1, size=(4, 5))).astype(dtype)
             for _ in range(30)]
    grads[3][0] = 0.0
    param = torch.tensor(start, requires_grad=True)
    torch_opt = torch.optim.Adam([param], lr=1.0, betas=torch_training.BETAS, eps=torch_training.EPS)
    scheduler = torch_training.noam_schedule(torch_opt, 16, WARMUP, FACTOR)
    variable = keras.Variable(start)
    tf_opt = tf_training.KingmaBaAdam(learning_rate=tf_training.noam_schedule(16, WARMUP, FACTOR),
                                      beta_1=tf_training.BETAS[0], beta_2=tf_training.BETAS[1],
                                      epsilon=tf_training.EPS)
    for g in grads:
        param.grad = torch.from_numpy(g)
        torch_opt.step()
        scheduler.step()
        tf_opt.apply_gradients([(tf.constant(g), variable)])
        assert_close(variable.numpy(), param.detach().numpy(), bound(dtype, "train:torch:tf"), "variable")


# -- trajectories ---------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fifty_adam_noam_steps_stay_together(dtype):
    config = VARIANTS["tiny-shared-tied-post"].replace(src_vocab=tasks.COPY_VOCAB,
                                                       tgt_vocab=tasks.COPY_VOCAB, dtype=dtype,
                                                       dropout=0.0)
    weights = random_weights(config, 0)
    torch_model, tf_model_ = build(config, weights), tf_model(config, weights)
    torch_opt = torch_training.make_optimizer(torch_model, warmup=WARMUP, factor=FACTOR)
    tf_opt = tf_training.make_optimizer(tf_model_, warmup=WARMUP, factor=FACTOR)
    weight_bound, key_bias_drift = bound(dtype, "train:torch:tf"), 0.0
    for step, batch in enumerate(copy_batches(STEPS), start=1):
        a = torch_training.train_step(torch_model, torch_opt, batch)
        b = tf_training.train_step(tf_model_, tf_opt, batch)
        assert a.lr == b.lr == noam_lr(step, config.d_model, WARMUP, FACTOR), step
        assert_close(b.loss, a.loss, weight_bound, f"loss at step {step}")
        expected, got = torch_model.export_weights(), tf_model_.export_weights()
        for name in expected:
            if name.endswith(".key.bias"):  # gradient-free: see the module docstring
                key_bias_drift = max(key_bias_drift, float(np.abs(got[name] - expected[name]).max()))
            else:
                assert_close(got[name], expected[name], weight_bound, f"{name} after step {step}")
    assert np.isfinite(key_bias_drift)
    if dtype == "float64":  # each step moves them by at most lr * noise / eps, noise < 1e-15
        assert key_bias_drift <= 2 * sum(noam_lr(np.arange(1, STEPS + 1), config.d_model, WARMUP, FACTOR)) \
            * 1e-15 / torch_training.EPS


# -- resuming -------------------------------------------------------------------------------------
def trainable(weights: dict) -> dict:
    """The weights a trajectory compares: key biases are gradient-free (the module docstring)."""
    return {name: value for name, value in weights.items() if not name.endswith(".key.bias")}


# float64 only: the rule is the same in every dtype, and float64's bound is the tight one (each
# dtype costs a traced TF step, 2.5 s on the 2-core machine)
@pytest.mark.parametrize("dtype", ["float64"])
def test_a_run_saved_by_either_backend_resumes_in_the_other(dtype):
    """A run saved (weights, `export_moments`, its step) by one backend goes on in the other
    through ``make_optimizer(start_step=S)`` and ``import_moments(..., step)``, taking Noam step
    ``step + 1`` next and the weights of the uninterrupted run. torch runs steps 1 to 6 and is saved
    at step 3; TF resumes that save in an optimizer made with S = 3 that has already stepped (a
    resume without moments: its step traced with that offset), runs steps 4 to 6 and is saved at
    step 5; torch resumes TF's save with S = 5 (as twins resumes torch) and S = 0 (as twins resumes
    TF). Before: TF took Noam steps 7 to 9 where it should take 4 to 6, torch with S = 0 step 1 for 6."""
    config = VARIANTS["tiny-shared-tied-post"].replace(src_vocab=tasks.COPY_VOCAB,
                                                       tgt_vocab=tasks.COPY_VOCAB, dtype=dtype,
                                                       dropout=0.0)
    batches, rates = list(copy_batches(6)), noam_lr(np.arange(1, 7), config.d_model, WARMUP, FACTOR)
    weights, weight_bound = random_weights(config, 0), bound(dtype, "train:torch:tf")

    def compare(got: dict, expected: dict, label: str):
        for name, value in trainable(expected).items():
            assert_close(got[name], value, weight_bound, f"{name}, {label}")

    torch_model = build(config, weights)
    optimizer = torch_training.make_optimizer(torch_model, warmup=WARMUP, factor=FACTOR)
    for step, batch in enumerate(batches, start=1):
        assert torch_training.train_step(torch_model, optimizer, batch).lr == rates[step - 1], step
        if step == 3:
            torch_save = torch_model.export_weights(), torch_training.export_moments(torch_model, optimizer)
    uninterrupted = torch_model.export_weights()

    model = tf_model(config, torch_save[0])
    optimizer = tf_training.make_optimizer(model, warmup=WARMUP, factor=FACTOR, start_step=3)
    assert tf_training.train_step(model, optimizer, batches[3]).lr == rates[3]  # fresh Adam at step 4
    model.import_weights(torch_save[0])
    tf_training.import_moments(model, optimizer, torch_save[1], 3)
    for step, batch in enumerate(batches[3:], start=4):
        assert tf_training.train_step(model, optimizer, batch).lr == rates[step - 1], ("tf", step)
        if step == 5:
            tf_save = model.export_weights(), tf_training.export_moments(model, optimizer)
    compare(model.export_weights(), uninterrupted, "tf resumed at step 3 vs torch uninterrupted")

    for start_step in (5, 0):
        model = build(config, tf_save[0])
        optimizer = torch_training.make_optimizer(model, warmup=WARMUP, factor=FACTOR,
                                                  start_step=start_step)
        torch_training.import_moments(model, optimizer, tf_save[1], 5)
        assert torch_training.train_step(model, optimizer, batches[5]).lr == rates[5], start_step
        compare(model.export_weights(), uninterrupted,
                f"torch resumed at TF's step 5 (start_step={start_step}) vs torch uninterrupted")
