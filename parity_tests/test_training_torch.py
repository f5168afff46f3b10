"""torch_impl.training on its own: the built-in loss against the float64 NumPy loss, the Noam rates
the optimizer actually uses, the paper's Adam, dropout in training only, and bad batches.
(Mirrored test for test in test_training_tf.py; torch vs TF is test_training_parity.py.)"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch_impl  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from parity_tests.torch_support import DEVICES, build  # noqa: E402
from shared import TransformerConfig, noam_lr, tasks  # noqa: E402
from shared.loss import label_smoothed_cross_entropy  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from torch_impl import training  # noqa: E402

CONFIG = TransformerConfig.preset("tiny", src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB,
                                  dropout=0.0, dtype="float64")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models on a shared 2-core machine: one intra-op thread is ~20x faster than two spinning."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def loss_case(dtype: str, seed: int = 0):
    """Logits (3, 6, 11) and targets with padding: a full row, a padded row, an all-padding row."""
    rng = np.random.default_rng(seed)
    logits = (3.0 * rng.normal(size=(3, 6, 11))).astype(dtype)
    targets = rng.integers(1, 11, size=(3, 6))
    targets[1, 4:] = 0
    targets[2, :] = 0
    return logits, targets


def copy_batch(n: int = 4, seed: int = 0):
    pairs = tasks.copy_examples(n, seed)
    sources = [s[: 10 - 2 * i] for i, (s, _) in enumerate(pairs)]  # lengths 10, 8, 6, 4: padding
    return tasks.batch_sequences(sources, sources)


# -- loss -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loss_matches_the_numpy_reference(dtype, smoothing):
    logits, targets = loss_case(dtype)
    expected = label_smoothed_cross_entropy(logits.astype(np.float64), targets, 0, smoothing)
    got = training.label_smoothed_loss(torch.from_numpy(logits), torch.from_numpy(targets), 0, smoothing)
    assert got.dtype == getattr(torch, dtype)
    bound = FLOAT64 if dtype == "float64" else bound_for(dtype, "torch:reference")
    assert_close(got.item(), expected, bound, f"loss eps={smoothing}")


def test_loss_ignores_what_padding_positions_predict():
    logits, targets = loss_case("float64")
    changed = logits.copy()
    changed[targets == 0] = 100.0  # any logits at padding targets
    a = training.label_smoothed_loss(torch.from_numpy(logits), torch.from_numpy(targets), 0, 0.1)
    b = training.label_smoothed_loss(torch.from_numpy(changed), torch.from_numpy(targets), 0, 0.1)
    assert a.item() == b.item()


def test_loss_of_only_padding_is_nan():
    logits, targets = loss_case("float64")
    assert np.isnan(training.label_smoothed_loss(torch.from_numpy(logits), torch.zeros_like(
        torch.from_numpy(targets)), 0).item())


@pytest.mark.parametrize("logits_shape, targets, smoothing, error, needle", [
    ((2, 3, 5), np.ones((3, 2), np.int64), 0.0, ValueError,
     r"expected logits \(B, T, V\) and targets \(B, T\)"),
    ((2, 3, 5), np.ones((2, 3), np.float32), 0.0, TypeError, "targets: expected integer ids, got dtype"),
    ((2, 3, 5), np.ones((2, 3), np.int64), 1.0, ValueError,
     r"smoothing: expected a value in \[0, 1\), got 1.0"),
])
def test_loss_bad_arguments(logits_shape, targets, smoothing, error, needle):
    with pytest.raises(error, match=needle):
        training.label_smoothed_loss(torch.zeros(logits_shape), torch.from_numpy(targets), 0, smoothing)


# -- Noam schedule and Adam -----------------------------------------------------------------------
@pytest.mark.parametrize("d_model, warmup, factor, start_step", [(16, 10, 0.1, 0), (512, 4000, 1.0, 0),
                                                                 (16, 10, 2.0, 7)])
def test_rates_used_at_steps_1_to_n_are_noam(d_model, warmup, factor, start_step):
    model = torch_impl.Transformer(CONFIG)
    optimizer = training.make_optimizer(model, d_model, warmup, factor, start_step)
    used = []
    for _ in range(40):
        used.append(optimizer.param_groups[0]["lr"])  # what this optimizer.step() will use
        optimizer.step()  # no gradients: parameters unchanged, the schedule advances
    assert used == noam_lr(np.arange(1, 41) + start_step, d_model, warmup, factor).tolist()


def test_train_step_reports_the_rate_it_used():
    model = build(CONFIG, random_weights(CONFIG, 0))
    optimizer = training.make_optimizer(model, warmup=10, factor=0.1)
    rates = [training.train_step(model, optimizer, copy_batch()).lr for _ in range(3)]
    assert rates == noam_lr(np.arange(1, 4), CONFIG.d_model, 10, 0.1).tolist()


def test_noam_schedule_needs_base_rate_one():
    optimizer = torch.optim.Adam(torch_impl.Transformer(CONFIG).parameters(), lr=1e-3)
    with pytest.raises(ValueError, match="expected lr=1.0 in every param group"):
        training.noam_schedule(optimizer, 16, 10)
    with pytest.raises(ValueError, match="warmup expected a positive int"):
        training.make_optimizer(torch_impl.Transformer(CONFIG), 16, 0)
    with pytest.raises(ValueError, match="start_step: expected an int >= 0"):
        training.make_optimizer(torch_impl.Transformer(CONFIG), 16, 10, start_step=-1)


def test_optimizer_is_the_papers_adam_over_each_parameter_once():
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    model = torch_impl.Transformer(config)
    optimizer = training.make_optimizer(model)
    assert type(optimizer) is torch.optim.Adam
    group = optimizer.param_groups[0]
    assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0
    assert not group["amsgrad"]
    params = [p for g in optimizer.param_groups for p in g["params"]]
    assert len(params) == len({id(p) for p in params}) == len(random_weights(config))


# -- steps, gradients and dropout -----------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
def test_train_step_learns_and_returns_python_floats(device):
    model = build(CONFIG, random_weights(CONFIG, 0), device)
    optimizer = training.make_optimizer(model, warmup=10, factor=0.5)
    batch = copy_batch()
    results = [training.train_step(model, optimizer, batch) for _ in range(30)]
    assert all(type(r.loss) is float and type(r.lr) is float for r in results)
    assert results[-1].loss < 0.5 * results[0].loss


def test_dropout_is_on_in_training_only_and_the_mode_is_restored():
    config = CONFIG.replace(dropout=0.5)
    weights = random_weights(config, 0)
    model, batch = build(config, weights), copy_batch()  # eval mode
    first, second = (training.gradients(model, batch) for _ in range(2))
    assert not model.training
    assert any(not np.array_equal(first[n], second[n]) for n in first)  # fresh dropout masks
    plain = training.gradients(build(CONFIG, random_weights(CONFIG, 0)), batch, training=False)
    for name, value in training.gradients(model, batch, training=False).items():
        np.testing.assert_array_equal(value, plain[name], err_msg=name)  # dropout off: deterministic
    model.train()
    training.train_step(model, training.make_optimizer(model, warmup=10), batch)
    assert model.training


def test_gradients_use_the_canonical_layout_and_leave_grad_alone():
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    model = build(config, random_weights(config, 0))
    grads = training.gradients(model, copy_batch(), smoothing=0.1)
    schema = {name: value.shape for name, value in random_weights(config).items()}
    assert {name: g.shape for name, g in grads.items()} == schema
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("mutate, error, needle", [
    (lambda b: b[:2], ValueError, r"batch: expected \(src, tgt_in, tgt_out\)"),
    (lambda b: (b[0], b[1], b[2][:, :-1]), ValueError, "tgt_out: expected the shape of tgt_in"),
    (lambda b: (b[0], b[1], np.zeros_like(b[2])), ValueError, "expected at least one non-padding target"),
    (lambda b: (b[0], b[1], b[2] + 100), ValueError, r"tgt_out: expected token ids in \[0, 14\)"),
    (lambda b: (b[0].astype(np.float32), b[1], b[2]), TypeError, "src: expected integer token ids"),
])
def test_bad_batches_are_refused_before_any_update(mutate, error, needle):
    weights = random_weights(CONFIG, 0)
    model = build(CONFIG, weights)
    with pytest.raises(error, match=needle):
        training.train_step(model, training.make_optimizer(model), mutate(copy_batch()))
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)
