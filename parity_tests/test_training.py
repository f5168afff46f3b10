"""Each backend's training module on its own: the built-in loss against the float64 NumPy loss, the
Noam rates the optimizer actually uses, the paper's Adam over each weight once, train steps that
learn, dropout in training only, gradients in the canonical layout, Adam's moments exported and
imported (where an import puts the schedule, values as stored), and what the loss and a step cannot
compute refused alike in all three, before any update: bad batches, a loss over no target, a
smoothing or a learning rate that is no number for them. (torch vs TF: test_training_parity.py;
framework-only pieces: test_*_only.py.)"""
import re

import numpy as np
import pytest

from parity_tests.backends import backends, dtype_name
from shared import TransformerConfig, noam_lr, tasks
from shared.loss import label_smoothed_cross_entropy
from shared.messages import shown
from shared.tolerances import FLOAT64, assert_close, bound_for
from shared.weights import random_weights

CONFIG = TransformerConfig.preset("tiny", src_vocab=tasks.COPY_VOCAB, tgt_vocab=tasks.COPY_VOCAB,
                                  dropout=0.0, dtype="float64")
CPU = backends(cpu_only=True)


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


def _loss(backend, logits, targets, pad_id=0, smoothing=0.0):
    return backend.training.label_smoothed_loss(backend.tensor(logits), backend.tensor(targets), pad_id,
                                                smoothing)


# -- loss -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_loss_matches_the_numpy_reference(dtype, smoothing, backend):
    logits, targets = loss_case(dtype)
    expected = label_smoothed_cross_entropy(logits.astype(np.float64), targets, 0, smoothing)
    got = _loss(backend, logits, targets, 0, smoothing)
    assert dtype_name(got.dtype) == dtype  # not Keras' float32 default
    bound = FLOAT64 if dtype == "float64" else bound_for(dtype, backend.pair)
    assert_close(float(got), expected, bound, f"loss eps={smoothing}")


@pytest.mark.parametrize("backend", CPU)
def test_loss_takes_any_integer_targets_and_names_what_it_cannot_score(backend):
    """Targets of any integer dtype score as int64 ones (TF's one_hot took no int16, uint16, uint32,
    uint64); integer logits, a pad_id that is no int and float targets are refused with the
    reference's words (torch raised from its kernels or its argument parser)."""
    logits, targets = loss_case("float64")
    want = float(_loss(backend, logits, targets))
    for dtype in (np.int16, np.uint8, np.uint16, np.uint32):
        assert float(_loss(backend, logits, targets.astype(dtype))) == want, np.dtype(dtype).name
    cases = [(dict(logits=logits.astype(np.int64)), "logits: expected floating-point scores, got dtype int64"),
             (dict(pad_id=None), r"pad_id: expected an int \(the id whose targets carry no loss\), got None"),
             (dict(pad_id=1.0), "pad_id: expected an int .*, got 1.0"),
             (dict(targets=targets.astype(np.float32)), "targets: expected integer ids, got dtype float32$")]
    for change, needle in cases:
        args = {"logits": logits, "targets": targets, "pad_id": 0, **change}
        for loss in (lambda: _loss(backend, **args),
                     lambda: label_smoothed_cross_entropy(args["logits"], args["targets"], args["pad_id"])):
            with pytest.raises(TypeError, match=needle):
                loss()


@pytest.mark.parametrize("backend", CPU)
def test_loss_ignores_what_padding_positions_predict(backend):
    logits, targets = loss_case("float64")
    changed = logits.copy()
    changed[targets == 0] = 100.0  # any logits at padding targets
    assert float(_loss(backend, logits, targets, 0, 0.1)) == float(_loss(backend, changed, targets, 0, 0.1))


@pytest.mark.parametrize("backend", CPU)
def test_a_loss_over_no_target_is_refused_as_the_reference_refuses_it(backend):
    """The mean over no target (every target padding, no rows, no columns): before, torch and TF
    returned NaN (0 / 0), which a backward pass spreads into every weight, while the reference
    raised. All three raise the reference's ValueError now; a data-parallel share (``tokens``: the
    global batch's count) of padding alone is 0. TF in a graph raises its InvalidArgumentError with
    the text, under XLA (no assertions) the loss is NaN, as for a target out of range."""
    logits, targets = loss_case("float64")
    message = "^targets: expected at least one non-padding position, got only padding$"
    for got_logits, got_targets in [(logits, np.zeros_like(targets)), (logits[:0], targets[:0]),
                                    (logits[:, :0], targets[:, :0])]:
        for loss in (lambda: _loss(backend, got_logits, got_targets),
                     lambda: label_smoothed_cross_entropy(got_logits, got_targets, 0)):
            with pytest.raises(ValueError, match=message):
                loss()
    share = backend.training.label_smoothed_loss(backend.tensor(logits), backend.tensor(np.zeros_like(targets)),
                                                 0, 0.1, tokens=5)
    assert float(share) == 0.0
    if backend.framework == "tf":
        import tensorflow as tf
        padding = tf.constant(np.zeros_like(targets))
        graph = tf.function(lambda x, t: backend.training.label_smoothed_loss(x, t, 0))
        with pytest.raises(tf.errors.InvalidArgumentError, match=message[1:-1]):
            graph(tf.constant(logits), padding)
        assert float(graph(tf.constant(logits), tf.constant(targets))) == float(_loss(backend, logits, targets))
        xla = tf.function(lambda x, t: backend.training.label_smoothed_loss(x, t, 0), jit_compile=True)
        assert np.isnan(float(xla(tf.constant(logits), padding)))


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("logits_shape, targets, smoothing, error, needle", [
    ((2, 3, 5), np.ones((3, 2), np.int64), 0.0, ValueError,
     r"expected logits \(B, T, V\) and targets \(B, T\)"),
    ((2, 3, 5), np.ones((2, 3), np.float32), 0.0, TypeError, "targets: expected integer ids, got dtype"),
    ((2, 3, 5), np.ones((2, 3), np.int64), 1.0, ValueError,
     r"smoothing: expected a value in \[0, 1\), got 1.0"),
])
def test_loss_bad_arguments(logits_shape, targets, smoothing, error, needle, backend):
    with pytest.raises(error, match=needle):
        _loss(backend, np.zeros(logits_shape, np.float32), targets, 0, smoothing)


@pytest.mark.parametrize("backend", CPU)
def test_loss_refuses_a_count_or_pad_id_it_cannot_use_alike(backend):
    """``tokens`` (the count a data-parallel share divides by) was never checked: 0 gave inf, -1 a
    negative loss, NaN NaN, True and 1.5 were taken, and text or 2**70 failed in each framework's
    own words; a pad_id past int64 overflowed in each. Both refuse them with one message now (a
    pad_id the reference's too)."""
    logits, targets = loss_case("float32")
    bad_tokens = [(0, ValueError, "got 0"), (-1, ValueError, "got -1"), (2**70, ValueError, f"got {2**70}"),
                  (1.5, TypeError, "got 1.5"), (True, TypeError, "got True"),
                  (float("nan"), TypeError, "got nan"), ("3", TypeError, "got '3'")]
    for tokens, error, got in bad_tokens:
        with pytest.raises(error, match=rf"^tokens: expected an int (>= 1|in \[1, 2\*\*53\]) \(the non-padding "
                                        rf"targets to divide by\), {re.escape(got)}$"):
            backend.training.label_smoothed_loss(backend.tensor(logits), backend.tensor(targets), 0, 0.0, tokens)
    for pad_id in (2**63, -2**63 - 1, 2**70):
        for loss in (lambda: _loss(backend, logits, targets, pad_id),
                     lambda: label_smoothed_cross_entropy(logits, targets, pad_id)):
            with pytest.raises(ValueError, match=rf"^pad_id: expected an int64 \(the id whose targets carry "
                                                 rf"no loss\), got {pad_id}$"):
                loss()
    assert float(_loss(backend, logits, targets, 2**63 - 1)) > 0  # no target is padding: a loss


@pytest.mark.parametrize("backend", CPU)
def test_loss_reads_numpy_arrays_of_any_byte_order_and_type_name(backend):
    """Big-endian logits and targets, targets of ``np.ulonglong`` (uint64 by another name, what
    NumPy 1 makes of ``uint64 + 2**63``) and ``longdouble`` logits failed in torch's words in
    torch_impl's loss ("given numpy array has byte order different from the native byte order",
    "can't convert np.ndarray of type numpy.ulonglong"), longdouble in TensorFlow's in tf_impl's;
    the reference took them all. Each is now read as the reference reads it (`shared.checks.
    as_array`: native, NumPy's own name, at most 64 bits), and the loss is the reference's."""
    logits = np.random.default_rng(0).normal(size=(2, 3, 5))
    targets = np.array([[1, 2, 3], [0, 0, 4]])
    want = label_smoothed_cross_entropy(logits, targets, 0, 0.1)
    for logits_dtype, targets_dtype in ((">f8", ">i8"), (np.longdouble, np.ulonglong), ("<f8", ">u2")):
        got = backend.training.label_smoothed_loss(logits.astype(logits_dtype), targets.astype(targets_dtype),
                                                   0, 0.1)
        assert_close(float(got), want, FLOAT64, f"loss of {np.dtype(logits_dtype)} and {np.dtype(targets_dtype)}")


@pytest.mark.parametrize("backend", CPU)
def test_a_loss_and_a_step_read_views_of_any_stride_as_their_copies(backend, recwarn):
    """Reversed views (negative strides) failed in torch's words in torch_impl's loss,
    `train_step` and `gradients` ("At least one stride in the given numpy array is negative"), and read-only ones
    drew torch's warning that it might write to them; the reference and tf_impl took them. Each is
    now what its C-contiguous copy is, without a warning."""
    logits, targets = loss_case("float64")
    frozen = targets.copy()
    frozen.flags.writeable = False
    for lv, tv in ((logits[::-1], targets[::-1]), (logits[:, ::-1, ::-1], targets[:, ::-1]), (logits, frozen)):
        want = label_smoothed_cross_entropy(np.array(lv), np.array(tv), 0, 0.1)
        assert_close(float(backend.training.label_smoothed_loss(lv, tv, 0, 0.1)), want, FLOAT64, "loss of views")
    model = backend.build(CONFIG, random_weights(CONFIG, 0))
    for batch in ((part[::-1] for part in copy_batch()), (np.broadcast_to(part, part.shape) for part in copy_batch())):
        batch = tuple(batch)
        got = backend.training.gradients(model, batch, training=False)  # train_step's batch, without dropout
        want = backend.training.gradients(model, tuple(np.array(part) for part in batch), training=False)
        for name in ("generator.bias", "src_embed.embeddings"):
            np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert [str(w.message) for w in recwarn if "numpy" in str(w.message).lower()] == []


@pytest.mark.parametrize("backend", CPU)
def test_a_loss_and_a_step_refuse_masked_entries_as_the_reference_does(backend):
    """A masked array's masked entries were scored and trained on (its data), by the reference
    and both backends; refused now by name, as `import_weights` refuses masked weights."""
    from shared.loss import label_smoothed_cross_entropy as reference_loss
    logits, targets = loss_case("float64")
    hidden = np.ma.masked_array(targets, mask=targets == 0)
    message = r"^targets: a masked array with 8 masked entries; fill them \(\.filled\(value\)\) or pass \.data$"
    for loss in (reference_loss, backend.training.label_smoothed_loss):
        with pytest.raises(ValueError, match=message):
            loss(logits, hidden, 0, 0.1)
        with pytest.raises(ValueError, match=r"^logits: a masked array with 1 masked entry; "):
            loss(np.ma.masked_array(logits, mask=logits == logits.max()), targets, 0, 0.1)
    src, tgt_in, tgt_out = copy_batch()
    model = backend.build(CONFIG, random_weights(CONFIG, 0))
    hidden = np.zeros(tgt_out.shape, bool)
    hidden[0, 0] = True
    with pytest.raises(ValueError, match=r"^tgt_out: a masked array with 1 masked entry; "):
        backend.training.gradients(model, (src, tgt_in, np.ma.masked_array(tgt_out, mask=hidden)))


@pytest.mark.parametrize("backend", CPU)
def test_loss_names_what_is_no_array_as_the_reference_does(backend):
    """Before: None, rows of different lengths, objects and text reached TF's conversion (its
    ``ValueError``s: "Attempt to convert a value (None)", "non-rectangular Python sequence"), torch's
    ("expected an array of numbers, got NoneType (can't convert np.ndarray of type numpy.object_...")
    and the reference's (a rank-0 shape; NumPy's "inhomogeneous shape"; dtype ``<U1``). One type
    and text now, in all three."""
    logits = np.zeros((2, 3, 5))
    targets = np.ones((2, 3), np.int64)
    cases = [
        (None, targets, TypeError, "logits: expected a tensor or array, got NoneType"),
        (logits, None, TypeError, "targets: expected a tensor or array, got NoneType"),
        (logits, [[1, 2, 3], [1, 2]], ValueError,
         "targets: expected token ids of shape (batch, seq), every row of one length, got rows of "
         "lengths [3, 2]; pad the rows to one length (with pad_id)"),
        (logits, np.array([[1, None, 2], [1, 2, 3]], dtype=object), TypeError,
         "targets: expected a tensor or array of numbers, got an ndarray of dtype object"),
        (logits, [[1, None, 2], [1, 2, 3]], TypeError, "targets: expected a tensor or array, got list"),
        (logits, np.array([["a", "b", "c"]] * 2), TypeError, "targets: expected integer ids, got dtype string"),
        (logits.astype(str), targets, TypeError, "logits: expected floating-point scores, got dtype string"),
        # Dtypes TensorFlow holds none of: tf_impl converted them before the checks, and failed in
        # TensorFlow's words ("Failed to convert a NumPy array to a Tensor (Unsupported numpy type:
        # NPY_TIMEDELTA)"); it checks the arrays first now, as torch_impl does.
        (logits, targets.astype("m8[s]"), TypeError, "targets: expected integer ids, got dtype timedelta64[s]"),
        (logits.astype("M8[s]"), targets, TypeError, "logits: expected floating-point scores, got dtype datetime64[s]"),
        ("x", targets.astype("m8[s]"), ValueError,
         "label_smoothed_loss: expected logits (B, T, V) and targets (B, T), got () and (2, 3)"),
    ]
    for got_logits, got_targets, error, message in cases:
        for loss in (backend.training.label_smoothed_loss, label_smoothed_cross_entropy):
            named = message.replace("label_smoothed_loss", loss.__name__)  # the reference's own name
            with pytest.raises(error, match=f"^{re.escape(named)}$"):
                loss(got_logits, got_targets, 0)
    # nested lists are read as NumPy reads them (TF made float32 of Python floats, torch float64)
    listed = backend.training.label_smoothed_loss((logits + np.arange(5)).tolist(), targets.tolist(), 0)
    assert dtype_name(listed.dtype) == "float64"
    assert_close(float(listed), label_smoothed_cross_entropy(logits + np.arange(5), targets, 0), FLOAT64,
                 "loss of lists")


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("smoothing, error, shown", [
    ("0.5", TypeError, "'0.5' (str)"), (True, TypeError, "True (bool)"), (None, TypeError, "None (NoneType)"),
    (1.0, ValueError, "1.0 (float)"), (np.float32(-0.5), ValueError, "np.float32(-0.5) (float32)")])
def test_a_smoothing_that_is_no_number_shows_its_type(smoothing, error, shown, backend):
    """Before: ``smoothing="0.5"`` was refused as "got 0.5" (str() of the string), which reads as a
    value in range. The value as repr writes it, and its type, from every entry point of all three."""
    message = f"^{re.escape(f'smoothing: expected a value in [0, 1), got {shown}')}$"
    logits, targets = loss_case("float64")
    model = backend.build(CONFIG)
    for call in (lambda: _loss(backend, logits, targets, 0, smoothing),
                 lambda: label_smoothed_cross_entropy(logits, targets, 0, smoothing),
                 lambda: backend.training.train_step(model, backend.training.make_optimizer(model),
                                                     copy_batch(), smoothing),
                 lambda: backend.training.gradients(model, copy_batch(), smoothing)):
        with pytest.raises(error, match=message):
            call()


@pytest.mark.torch
def test_torch_noam_schedule_shows_a_base_rate_as_given():
    """A param group's lr of "1.0" (set after the optimizer was made) was shown as 1.0."""
    import torch
    from torch_impl import training
    optimizer = torch.optim.Adam([torch.nn.Parameter(torch.zeros(2))], lr=1.0)
    optimizer.param_groups[0]["lr"] = "1.0"
    with pytest.raises(ValueError, match=r"got '1.0' \(str\)$"):
        training.noam_schedule(optimizer, 16, 10)


# -- Noam schedule and Adam -----------------------------------------------------------------------
def _rates_used(backend, optimizer, n: int) -> list[float]:
    """The rate each of the next ``n`` updates uses, advancing the schedule without gradients."""
    used = []
    for _ in range(n):
        if backend.framework == "torch":
            used.append(optimizer.param_groups[0]["lr"])  # what this optimizer.step() will use
            optimizer.step()  # no gradients: parameters unchanged, the schedule advances
        else:
            # Keras evaluates the schedule at ``optimizer.iterations`` (0 at the first update,
            # advanced by each apply); that the update really uses this rate is
            # test_tf_only.test_adam_update_is_algorithm_1's business.
            used.append(float(optimizer.learning_rate))
            optimizer.iterations.assign_add(1)  # as apply does, without 92 eager variable updates
    return used


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("d_model, warmup, factor, start_step", [
    (16, 10, 0.1, 0), (512, 4000, 1.0, 0), (16, 10, 2.0, 7),
    # NumPy's numbers, as TransformerConfig takes them (np.float32 was refused as no float)
    (np.int64(16), np.int32(10), np.float32(0.1), np.int64(7))])
def test_rates_used_at_steps_1_to_n_are_noam(d_model, warmup, factor, start_step, backend):
    model = backend.impl.Transformer(CONFIG)
    optimizer = backend.training.make_optimizer(model, d_model, warmup, factor, start_step)
    assert _rates_used(backend, optimizer, 40) == noam_lr(np.arange(1, 41) + start_step, d_model, warmup,
                                                          factor).tolist()


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("start_step", [0, 3, 5])
def test_import_moments_places_the_schedule_after_its_step(start_step, backend):
    """The step given to import_moments is where the whole optimizer resumes, its schedule
    included: the next update takes Noam step ``step + 1`` whatever ``start_step`` the optimizer
    was made with, and however far it had run. Before, with step 3: torch took Noam step 1
    (start_step 0) or 6 (start_step 5), TF step 4 + start_step (tf_impl's docstring asked for 0,
    twins passes torch the step itself)."""
    model = backend.impl.Transformer(CONFIG)
    optimizer = backend.training.make_optimizer(model, 16, 10, 0.1, start_step)
    moments = backend.training.export_moments(model, optimizer)
    backend.training.import_moments(model, optimizer, moments, 3)
    assert _rates_used(backend, optimizer, 4) == noam_lr(np.arange(4, 8), 16, 10, 0.1).tolist()
    backend.training.import_moments(model, optimizer, moments, 2)  # after it ran: back to step 3
    assert _rates_used(backend, optimizer, 2) == noam_lr(np.arange(3, 5), 16, 10, 0.1).tolist()


@pytest.mark.parametrize("backend", CPU)
def test_the_last_countable_step_is_taken_and_the_one_after_is_not_refused_after_the_fact(backend):
    """torch_impl's scheduler computes the next step's rate after each update: the update that
    reached 2**53 (`shared.moments.MAX_STEP`) was made, then refused (``noam_lr: step expected an
    int in [1, 2**53]``), the weights changed; and `import_moments` at step 2**53 set every moment
    before it refused. The rate of a step past 2**53 is 2**53's now, in both backends (TF's float64
    step rounds to it): nothing is refused once it has happened."""
    from shared.moments import MAX_STEP
    model = backend.impl.Transformer(CONFIG)
    optimizer = backend.training.make_optimizer(model, 16, 10, 0.1, MAX_STEP - 2)
    last = noam_lr(MAX_STEP, 16, 10, 0.1)
    assert _rates_used(backend, optimizer, 3) == [noam_lr(MAX_STEP - 1, 16, 10, 0.1), last, last]
    moments = backend.training.export_moments(model, optimizer)
    backend.training.import_moments(model, optimizer, moments, MAX_STEP)
    assert _rates_used(backend, optimizer, 1) == [last]
    with pytest.raises(ValueError, match=rf"^step: expected an int in \[0, {MAX_STEP}\]"):
        backend.training.import_moments(model, optimizer, moments, MAX_STEP + 1)


@pytest.mark.parametrize("backend", CPU)
def test_optimizer_is_the_papers_adam_over_each_weight_once(backend):
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    model = backend.impl.Transformer(config)
    optimizer = backend.training.make_optimizer(model)
    if backend.framework == "torch":
        import torch
        assert type(optimizer) is torch.optim.Adam
        group = optimizer.param_groups[0]
        assert group["betas"] == (0.9, 0.98) and group["eps"] == 1e-9 and group["weight_decay"] == 0
        assert not group["amsgrad"]
        params = [p for g in optimizer.param_groups for p in g["params"]]
    else:
        import keras
        assert isinstance(optimizer, keras.optimizers.Adam) and optimizer.built
        assert (optimizer.beta_1, optimizer.beta_2, optimizer.epsilon) == (0.9, 0.98, 1e-9)
        assert not optimizer.amsgrad and optimizer.weight_decay is None
        params = model.trainable_variables
    assert len(params) == len({id(p) for p in params}) == len(random_weights(config))


# -- steps, gradients and dropout -----------------------------------------------------------------
@pytest.mark.parametrize("backend", backends())
def test_train_step_learns_and_reports_the_rate_it_used(backend):
    """30 steps on one batch: the loss halves, and each step reports, as Python floats, its loss and
    the Noam rate of its own step (1, 2, ...)."""
    model = backend.build(CONFIG)
    optimizer = backend.training.make_optimizer(model, warmup=10, factor=0.5)
    batch = copy_batch()
    results = [backend.training.train_step(model, optimizer, batch) for _ in range(30)]
    assert all(type(r.loss) is float and type(r.lr) is float for r in results)
    assert [r.lr for r in results] == noam_lr(np.arange(1, 31), CONFIG.d_model, 10, 0.5).tolist()
    assert results[-1].loss < 0.5 * results[0].loss
    if backend.framework == "tf":  # TF only: the compiled step takes every batch shape in one trace
        for n, length in [(2, 6), (5, 12)]:  # (here, not in test_tf_only: a trace costs ~3 s)
            backend.training.train_step(model, optimizer, copy_batch(n, seed=n, length=length))
        step = backend.training._compiled_step(model, optimizer, 0.0)
        assert step.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("backend", CPU)
def test_dropout_is_on_in_training_only(backend):
    config = CONFIG.replace(dropout=0.5)
    model, batch = backend.build(config), copy_batch()  # eval mode (torch)
    gradients = backend.training.gradients
    first, second = (gradients(model, batch) for _ in range(2))
    assert any(not np.array_equal(first[n], second[n]) for n in first)  # fresh dropout masks
    plain = gradients(backend.build(CONFIG), batch, training=False)
    for name, value in gradients(model, batch, training=False).items():
        np.testing.assert_array_equal(value, plain[name], err_msg=name)  # dropout off: deterministic
    if backend.framework == "torch":  # gradients() leaves the module's mode as it found it
        assert not model.training
        model.train()
        model.encoder.eval()  # each module's own mode comes back, not the root's
        backend.training.train_step(model, backend.training.make_optimizer(model, warmup=10), batch)
        assert model.training and not model.encoder.training and model.decoder.training
    # a flag, not a truth: tf_impl took "no" as dropout on, torch_impl refused only what changed
    # the model's mode (0 on a model in eval mode passed)
    for value in ("no", None, 0, np.float64(1.0)):
        with pytest.raises(TypeError, match=rf"^training: expected True or False, got {re.escape(shown(value))} "):
            gradients(model, batch, training=value)


@pytest.mark.parametrize("backend", CPU)
def test_gradients_use_the_canonical_layout(backend):
    config = CONFIG.replace(share_embeddings=True, tie_output=True)
    model = backend.build(config)
    grads = backend.training.gradients(model, copy_batch(), smoothing=0.1)
    schema = {name: value.shape for name, value in random_weights(config).items()}
    assert {name: g.shape for name, g in grads.items()} == schema
    assert all(type(g) is np.ndarray for g in grads.values())  # TF: embedding IndexedSlices made dense
    if backend.framework == "torch":  # .grad untouched
        assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("mutate, error, needle", [
    (lambda b: b[:2], ValueError, r"batch: expected \(src, tgt_in, tgt_out\), got tuple of length 2$"),
    (lambda b: dict(enumerate(b)), TypeError, r"batch: expected \(src, tgt_in, tgt_out\), got dict$"),
    (lambda b: (b[0], b[1], b[2][:, :-1]), ValueError, "tgt_out: expected the shape of tgt_in"),
    (lambda b: (b[0], b[1], np.zeros_like(b[2])), ValueError, "expected at least one non-padding target"),
    (lambda b: (b[0], b[1], b[2] + 100), ValueError, r"tgt_out: expected token ids in \[0, 14\)"),
    (lambda b: (b[0].astype(np.float32), b[1], b[2]), TypeError, "src: expected integer token ids"),
    # TF's compiled step would raise its own InvalidArgumentError from the graph's assertion
    (lambda b: (b[0], b[1][:1], b[2][:1]), ValueError, r"tgt_in: expected batch size \d+ \(as src\), got 1"),
    # torch_impl converted before checking: NumPy's or torch's own words, and tgt_out named first
    (lambda b: ([b[0][0].tolist(), b[0][1][:-1].tolist()], b[1], b[2]), ValueError,
     r"src: expected token ids of shape \(batch, seq\), every row of one length"),
    (lambda b: (None, b[1], b[2]), TypeError, "src: expected a tensor or array, got NoneType"),
    (lambda b: (b[0], b[1], b[2].astype(str)), TypeError, "tgt_out: expected integer token ids, got dtype string"),
    (lambda b: (b[0][:0], b[1][:0], b[2][:0]), ValueError, r"src: expected a non-empty \(batch, seq\)"),
])
def test_bad_batches_are_refused_before_any_update(mutate, error, needle, backend):
    weights = random_weights(CONFIG, 0)
    model = backend.build(CONFIG, weights)
    with pytest.raises(error, match=needle):
        backend.training.train_step(model, backend.training.make_optimizer(model), mutate(copy_batch()))
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("part, value, error, message", [
    (2, None, TypeError, "tgt_out: expected a tensor or array, got NoneType"),
    (2, lambda b: [row[:-1] if i == 0 else row for i, row in enumerate(b[2].tolist())], ValueError,
     "tgt_out: expected token ids of shape (batch, seq), every row of one length, got rows of lengths "
     "[10, 11, 11, 11]; pad the rows to one length (with pad_id)"),
    (2, lambda b: b[2].astype(object), TypeError,
     "tgt_out: expected a tensor or array of numbers, got an ndarray of dtype object"),
    (2, lambda b: b[2][0].astype(str), ValueError,
     "tgt_out: expected token ids of shape (batch, seq), got rank 1 shape (11,)"),
    (0, None, TypeError, "src: expected a tensor or array, got NoneType"),
    (1, lambda b: b[1].astype(object), TypeError,
     "tgt_in: expected a tensor or array of numbers, got an ndarray of dtype object"),
], ids=["tgt_out-None", "tgt_out-ragged", "tgt_out-objects", "tgt_out-text", "src-None", "tgt_in-objects"])
def test_a_batch_part_that_is_no_array_is_named_alike(part, value, error, message, backend):
    """Before: tf_impl passed tgt_out straight to TensorFlow (``ValueError: Attempt to convert a
    value (None)``, "Can't convert non-rectangular Python sequence to Tensor.", "Failed to convert a
    NumPy array"), and added TensorFlow's words to src's; torch_impl raised the shared messages.
    The same type and text now, from train_step and gradients alike, with the weights untouched."""
    weights = random_weights(CONFIG, 0)
    model = backend.build(CONFIG, weights)
    batch = list(copy_batch())
    batch[part] = value(batch) if callable(value) else value
    for call in (lambda: backend.training.train_step(model, backend.training.make_optimizer(model), batch),
                 lambda: backend.training.gradients(model, batch)):
        with pytest.raises(error, match=f"^{re.escape(message)}$"):
            call()
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


@pytest.mark.parametrize("backend", CPU)
@pytest.mark.parametrize("rate, error, message", [
    (-1.0, ValueError, "optimizer: expected a learning rate that is finite and >= 0, got -1.0"),
    (float("nan"), ValueError, "optimizer: expected a learning rate that is finite and >= 0, got nan"),
    (float("inf"), ValueError, "optimizer: expected a learning rate that is finite and >= 0, got inf"),
], ids=["negative", "nan", "inf"])
def test_a_step_at_a_rate_that_is_no_rate_is_refused(rate, error, message, backend):
    """Before: TF's train_step with a Keras optimizer of learning rate -1 trained uphill and
    reported lr=-1.0, and a rate of NaN (TF; torch: a param group's lr set after the optimizer was
    made, which torch's own check at construction never sees) made every weight NaN without a word.
    Refused now in both, with the same words, before anything is computed or changed."""
    weights = random_weights(CONFIG, 0)
    model = backend.build(CONFIG, weights)
    if backend.framework == "torch":
        import torch
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        optimizer.param_groups[0]["lr"] = rate
    else:
        import keras
        optimizer = keras.optimizers.SGD(learning_rate=rate)
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        backend.training.train_step(model, optimizer, copy_batch())
    for name, value in model.export_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


def test_a_rate_is_a_number_finite_and_not_negative():
    """The shared check both steps use: a number of any kind (floats, ints, 0-d arrays), 0 included."""
    from shared.training import check_learning_rate
    for rate in (0, 0.0, 0.5, np.float32(0.25), np.array(2.0), 10**300):
        assert check_learning_rate(rate) == float(rate)
    for rate, error, got in (("0.5", TypeError, "a number, got '0.5' (str)"),
                             (True, TypeError, "a number, got True (bool)"),
                             (None, TypeError, "a number, got None (NoneType)"),
                             (-1e-300, ValueError, "finite and >= 0, got -1e-300")):
        with pytest.raises(error, match=f"^{re.escape(f'optimizer: expected a learning rate that is {got}')}$"):
            check_learning_rate(rate)


@pytest.mark.parametrize("backend", CPU)
def test_an_optimizer_of_another_model_is_refused(backend):
    """torch's Adam made for model ``a`` stepped nothing of ``b`` and reported a loss; Keras' raised
    its own error; export_moments gave zeros (torch) or a KeyError (TF). One ValueError now."""
    weights = random_weights(CONFIG, 0)
    a, b = backend.build(CONFIG, weights), backend.build(CONFIG, weights)
    optimizer = backend.training.make_optimizer(a)
    moments = backend.training.export_moments(a, optimizer)
    needle = r"optimizer: expected one over this model's parameters \(make_optimizer\(model\)\)"
    for call in (lambda: backend.training.train_step(b, optimizer, copy_batch()),
                 lambda: backend.training.export_moments(b, optimizer),
                 lambda: backend.training.import_moments(b, optimizer, moments, 0)):
        with pytest.raises(ValueError, match=needle):
            call()
    with pytest.raises(TypeError, match="optimizer: expected a .*Optimizer .*, got str"):
        backend.training.train_step(a, "adam", copy_batch())
    for name, value in b.export_weights().items():
        np.testing.assert_array_equal(value, weights[name], err_msg=name)


@pytest.mark.parametrize("backend", CPU)
def test_import_moments_checks_all_of_them_before_setting_any(backend):
    """A missing or misshapen moment, a NaN, a negative second moment or a bad step used to be
    found part-way (torch: at the next step, after most weights had moved; TF: after the step
    count and some moments were set). Each is refused with the optimizer as it was."""
    model = backend.build(CONFIG, random_weights(CONFIG, 0))
    optimizer = backend.training.make_optimizer(model)
    rng = np.random.default_rng(0)  # moments as a step leaves them (without tracing one: 3 s in TF)
    backend.training.import_moments(model, optimizer, {
        name: np.abs(rng.normal(size=value.shape)).astype(value.dtype)
        for name, value in backend.training.export_moments(model, optimizer).items()}, 1)
    before = backend.training.export_moments(model, optimizer)
    assert all(value.any() for value in before.values())
    bias = "m.generator.bias"
    cases = [
        ({k: v for k, v in before.items() if k != "v.generator.bias"}, 1, ValueError,
         r"^moments: missing: \['v.generator.bias'\]$"),
        ({**before, bias: before[bias][:-1]}, 1, ValueError,
         rf"^moments: {bias}: expected shape \(14,\), got \(13,\)$"),
        ({**before, bias: np.full_like(before[bias], np.nan)}, 1, ValueError,
         rf"^moments: {bias}: expected finite values, got NaN or inf$"),
        ({**before, "v.generator.bias": -before["v.generator.bias"] - 1}, 1, ValueError,
         r"^moments: v.generator.bias: expected second moments >= 0"),
        ({**before, "x": before[bias]}, 1, ValueError, r"^moments: unexpected: \['x'\]$"),
        # a masked array was imported as its data, as import_weights refuses it (session 38)
        ({**before, bias: np.ma.masked_array(before[bias], mask=np.arange(14) < 3)}, 1, ValueError,
         rf"^moments: {bias}: a masked array with 3 masked entries; fill them"),
        (before, -1, ValueError, r"^step: expected an int in \[0, 9007199254740992\]"),
        (before, None, TypeError, r"^step: expected an int >= 0 \(the updates already made\), got None$"),
    ]
    for moments, step, error, needle in cases:
        with pytest.raises(error, match=needle):
            backend.training.import_moments(model, optimizer, moments, step)
        after = backend.training.export_moments(model, optimizer)
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)
    if backend.framework == "tf":  # the step count too
        assert int(optimizer.iterations.numpy()) == 1


@pytest.mark.parametrize("backend", CPU)
def test_init_workers_takes_a_count_of_at_least_one(backend):
    """torch_impl took True as one worker and said 0, 2.0 or "2" needed torchrun."""
    import importlib
    distributed = importlib.import_module(f"{backend.framework}_impl.distributed")
    for workers, error in ((True, TypeError), (0, ValueError), (-1, ValueError), (2.0, TypeError), ("2", TypeError)):
        with pytest.raises(error, match=rf"^workers: expected an int >= 1, got {re.escape(repr(workers))}$"):
            distributed.init_workers(workers)


@pytest.mark.parametrize("backend", CPU)
def test_init_workers_takes_the_same_timeouts_in_both_backends(backend):
    """tf_impl took any timeout (its replicas wait on no peer), torch_impl failed in ``timedelta``
    (a TypeError for "nonsense") or in gloo ("Invalid timeout" past 8.6e13 s), and took any once
    its group existed. Both refuse alike now, before anything starts."""
    import importlib
    distributed = importlib.import_module(f"{backend.framework}_impl.distributed")
    expected = "timeout: expected a positive number of seconds, at most 1,000,000,000, got "
    for timeout, kind in (("nonsense", TypeError), (True, TypeError), (None, TypeError), (0, ValueError),
                          (-5.0, ValueError), (float("nan"), ValueError), (1e12, ValueError)):
        shown = repr(timeout) if kind is TypeError else str(timeout)
        with pytest.raises(kind, match=f"^{re.escape(expected + shown)}$"):
            distributed.init_workers(1, timeout)


@pytest.mark.parametrize("backend", CPU)
def test_every_entry_point_names_a_model_that_is_not_one(backend, tmp_path):
    """Each took ``None`` (or a module of another kind) as far as ``model.config`` and raised
    ``AttributeError: 'NoneType' object has no attribute 'config'`` (`weights_io`'s did until
    session 40)."""
    import importlib
    impl = importlib.import_module(f"{backend.framework}_impl")
    checkpoints = importlib.import_module(f"{backend.framework}_impl.checkpoints")
    precision = importlib.import_module(f"{backend.framework}_impl.precision")
    weights_io = importlib.import_module(f"{backend.framework}_impl.weights_io")
    calls = [lambda: backend.training.make_optimizer(None),
             lambda: backend.training.gradients(None, copy_batch()),
             lambda: backend.training.export_moments(None, None),
             lambda: checkpoints.save_checkpoint(None, tmp_path / "m.pt"),
             lambda: checkpoints.load_into(None, tmp_path / "m.pt"),
             lambda: precision.set_precision(None, "bf16"),
             lambda: impl.greedy_decode(None, np.ones((1, 2), np.int64), 2),
             lambda: weights_io.import_weights(None, random_weights(CONFIG, 0)),
             lambda: weights_io.export_weights(None),
             lambda: weights_io.weight_table(None),
             lambda: weights_io.quantized_projections(None)]
    for call in calls:
        with pytest.raises(TypeError, match=rf"^model: expected a {backend.framework}_impl.Transformer, "
                                            r"got NoneType$"):
            call()
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("backend", CPU)
def test_exported_moments_are_a_snapshot(backend):
    """Before: torch's export_moments gave NumPy views of Adam's state on the CPU, which the next
    update changed in place: a run saved in memory at step 3 and resumed later resumed from the
    moments of the last step taken (TF's were copies already)."""
    model = backend.build(CONFIG, random_weights(CONFIG, 0))
    optimizer = backend.training.make_optimizer(model)

    def update():  # one Adam update, in place (TF: eagerly, without tracing a step)
        if backend.framework == "torch":
            backend.training.train_step(model, optimizer, copy_batch())
        else:
            optimizer.apply_gradients([(np.ones(v.shape), v) for v in model.trainable_variables])

    update()
    exported = backend.training.export_moments(model, optimizer)
    kept = {name: value.copy() for name, value in exported.items()}
    update()
    now = backend.training.export_moments(model, optimizer)
    assert any(not np.array_equal(value, kept[name]) for name, value in now.items())
    for name, value in exported.items():
        np.testing.assert_array_equal(value, kept[name], err_msg=name)


@pytest.mark.parametrize("backend", CPU)
def test_import_moments_refuses_values_the_models_dtype_cannot_hold(backend):
    """Before: finiteness was checked before the cast to the model's dtype, so a float64 moment of
    1e39 (or a long double of 1e400 for a float64 model) passed, was stored as inf, and the next
    ``train_step`` made every weight NaN without a word. Refused now, naming the tensor, with the
    optimizer as it was."""
    for dtype, big in (("float32", np.float64(1e39)), ("float32", np.longdouble(1e39)),
                       ("float64", np.longdouble("1e400"))):
        config = CONFIG.replace(dtype=dtype)
        model = backend.build(config, random_weights(config, 0))
        optimizer = backend.training.make_optimizer(model)
        before = backend.training.export_moments(model, optimizer)
        moments = {name: value.astype(big.dtype) for name, value in before.items()}
        moments["v.generator.bias"][3] = big
        needle = "^" + re.escape(f"moments: v.generator.bias: expected finite values in {dtype} (at most "
                                 f"{np.finfo(dtype).max:.4g} in magnitude), got {big}, which overflows it") + "$"
        with pytest.raises(ValueError, match=needle):
            backend.training.import_moments(model, optimizer, moments, 1)
        after = backend.training.export_moments(model, optimizer)
        for name, value in before.items():
            np.testing.assert_array_equal(after[name], value, err_msg=name)
        if backend.framework == "tf":
            assert int(optimizer.iterations.numpy()) == 0
        # values at the edge of the dtype round to its largest finite number: taken
        moments["v.generator.bias"][3] = np.finfo(dtype).max
        backend.training.import_moments(model, optimizer, moments, 1)
        assert np.isfinite(backend.training.export_moments(model, optimizer)["v.generator.bias"]).all()


def test_moment_problems_judge_the_values_as_stored():
    """`twins train` reads a run's moments through `moment_problems` (twins/runs.py): the same rule."""
    from shared.moments import moment_problems
    config = CONFIG.replace(dtype="float32")
    moments = {f"{kind}.{name}": np.zeros(value.shape) for kind in ("m", "v")
               for name, value in random_weights(config, 0).items()}
    assert moment_problems(config, moments) == []
    moments["m.generator.bias"][0] = -1e39
    assert moment_problems(config, moments) == [
        "m.generator.bias: expected finite values in float32 (at most 3.403e+38 in magnitude), got "
        "-1e+39, which overflows it"]
    assert moment_problems(config.replace(dtype="float64"), moments) == []
