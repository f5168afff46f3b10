"""Training with Keras' own tools: the built-in ``CategoricalCrossentropy(label_smoothing=...)``, a
Keras Adam and a Noam ``LearningRateSchedule``; mirrored name for name by `torch_impl.training`.

    model = Transformer(config)
    optimizer = make_optimizer(model, warmup=400)       # Adam(0.9, 0.98, 1e-9) + Noam, lr(1) first
    for batch in batches:                               # (src, tgt_in, tgt_out), see shared.tasks
        loss, lr = train_step(model, optimizer, batch, smoothing=0.1)

Where epsilon enters Adam. Keras' ``Adam`` adds its epsilon to ``sqrt(v)`` before bias correction
("epsilon hat" of Kingma & Ba, section 2): ``var -= lr * sqrt(1 - b2^t) / (1 - b1^t) * m / (sqrt(v) +
eps)``, while ``torch.optim.Adam`` follows Algorithm 1: ``var -= lr / (1 - b1^t) * m / (sqrt(v) /
sqrt(1 - b2^t) + eps)``. Keras' update is torch's with ``eps`` replaced by ``eps / sqrt(1 - b2^t)``
(7x larger at step 1 with b2 = 0.98, decaying to eps): a relative difference of order
``eps / sqrt(v_hat)`` in each update, negligible for training but not for parity (7e-4 apart after 30
steps with gradients down to 1e-12, where float64 parity reaches 1e-17). Stock Keras Adam also casts
the Python floats beta_1 and beta_2 through float32 on float64 variables (1 - 0.98 off by 5e-7).
`KingmaBaAdam` is Keras' Adam with the update written as torch writes it, so both backends take the
same steps.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import keras
import numpy as np
import tensorflow as tf
from keras import ops

from shared.checks import array_kind, as_array, batch_ids, check_flag, ids_array, refusal
from shared.loss import (NO_TARGETS, check_loss_args, check_smoothing, check_some_targets, check_targets_range,
                         check_tokens, targets_range_message)
from shared.moments import FOREIGN_OPTIMIZER, check_moments, listed_names
from shared.schedule import check_start_step, noam_formula, noam_lr
from shared.training import check_learning_rate

from .inputs import check_ids, check_same_batch, in_xla_context, runtime_check
from .model import Transformer, _traced, check_model
from .weights_io import weight_table

# The paper's Adam (section 5.3); eps is added to the bias-corrected sqrt(v), Kingma & Ba Algorithm 1.
BETAS = (0.9, 0.98)
EPS = 1e-9

Batch = Sequence  # (src (B, S), tgt_in (B, T), tgt_out (B, T)): integer ids, NumPy or tf


class StepResult(NamedTuple):
    """What `train_step` reports: the batch's loss (before the update) and the learning rate it used."""
    loss: float
    lr: float


def label_smoothed_loss(logits: tf.Tensor, targets: tf.Tensor, pad_id: int,
                        smoothing: float = 0.0, tokens=None) -> tf.Tensor:
    """Mean label-smoothed cross-entropy over the non-padding targets (docs/design.md,
    convention 14).

    ``keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=eps)`` on one-hot
    targets: the target distribution is ``(1 - eps) * onehot + eps / V``. Padding targets get sample
    weight 0 and the weighted sum is divided by the number of non-padding targets. (Keras'
    ``"sum_over_batch_size"`` would divide by B * T, padding included; the loss runs in the logits'
    dtype, not Keras' float32 default.) Targets must lie in ``[0, V)`` (``tf.one_hot`` would map any
    other id to an all-zero row), and at least one must not be padding (the mean over none, with
    every target padding, ``B = 0`` or ``T = 0``, is NaN: `shared.loss.check_some_targets`):
    eagerly a batch that breaks either raises the reference's ``ValueError``
    (`shared.loss.check_targets_range`; the flag is read back with the range, no transfer of its
    own), in graph mode an assertion with the same text fails, and under XLA, where assertions
    compile to nothing, the loss is NaN.

    ``tokens``: divide the summed loss by this count instead (a data-parallel replica's share of the
    global batch divides by the global batch's non-padding targets, `shared.data_parallel`); a
    share of padding alone is then 0, not refused.
    bfloat16 logits (mixed precision) are cast to float32 first: the loss is never computed in
    bfloat16.

    Shape: logits ``(B, T, V)``, targets ``(B, T)`` integer -> a scalar tensor.
    """
    # NumPy arrays and nested lists converted as torch_impl and the reference convert them: what
    # holds no numbers gets the shared error, not TensorFlow's words; Python floats are float64
    logits, targets = _as_tensor("logits", logits, as_array), _as_tensor("targets", targets, ids_array)
    (targets_dtype, targets_integer, _), (logits_dtype, _, logits_floating) = map(_kind, (targets, logits))
    logits_shape, targets_shape = _shape(logits), _shape(targets)
    if len(logits_shape) == 3 and len(targets_shape) == 2:  # sizes unknown at trace time match anything
        targets_shape = [t if t is not None else l for t, l in zip(targets_shape, logits_shape)]
        logits_shape[:2] = [l if l is not None else t for l, t in zip(logits_shape[:2], targets_shape)]
    check_loss_args("label_smoothed_loss", logits_shape, targets_shape, targets_dtype, targets_integer,
                    smoothing, logits_dtype, logits_floating, pad_id)
    logits, targets = tf.convert_to_tensor(logits), tf.convert_to_tensor(targets)  # checked: numbers
    if logits.dtype in (tf.bfloat16, tf.float16):
        logits = tf.cast(logits, tf.float32)
    if not tf.is_tensor(tokens):
        check_tokens(tokens)
    vocab = logits.shape[-1]
    ok = None
    if tf.executing_eagerly():
        any_target = False
        if tf.size(targets) > 0:  # the flag rides with the range: one device-to-host transfer
            lo, hi, any_target = (int(v) for v in tf.stack([
                tf.reduce_min(targets), tf.reduce_max(targets),
                tf.cast(_any_target(targets, pad_id), targets.dtype)]).numpy())
            check_targets_range(vocab, lo, hi)
        if tokens is None:  # not asked of a data-parallel share: its padding alone gives 0
            check_some_targets(bool(any_target))
    else:
        # pad_id joins the ids so that an empty batch has a min and a max (pad is always in range)
        flat = tf.concat([tf.reshape(targets, [-1]), tf.constant([pad_id], targets.dtype)], 0)
        lo, hi = tf.reduce_min(flat), tf.reduce_max(flat)
        ok = tf.logical_and(lo >= 0, hi < vocab)
        checks = [(ok, targets_range_message(vocab, "{}", "{}"), (lo, hi))]
        if tokens is None:
            any_target = _any_target(targets, pad_id)
            checks.append((any_target, NO_TARGETS, ()))
            ok = tf.logical_and(ok, any_target)
        if not in_xla_context():
            targets = runtime_check(targets, checks)
            ok = None
    targets = tf.cast(targets, tf.int64)  # in range: tf.one_hot takes no (u)int16, uint32, uint64
    keep = tf.cast(targets != pad_id, logits.dtype)  # (B, T): 1 = a real target
    loss = keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=float(smoothing),
                                                reduction="sum", dtype=logits.dtype.name)
    total = loss(tf.one_hot(targets, vocab, dtype=logits.dtype), logits, sample_weight=keep)
    mean = total / (tf.reduce_sum(keep) if tokens is None else tf.cast(tokens, logits.dtype))
    return mean if ok is None else tf.where(ok, mean, tf.constant(np.nan, mean.dtype))


def _any_target(targets: tf.Tensor, pad_id: int) -> tf.Tensor:
    """Whether any of ``targets`` is not ``pad_id`` (a scalar bool), compared as int64: an id past
    int64 is out of range anyway (refused first), and pad_id is an int64 (`check_loss_args`)."""
    return tf.reduce_any(tf.cast(targets, tf.int64) != pad_id)


def _as_tensor(name: str, value, convert) -> tf.Tensor | np.ndarray:
    """``value`` as a tensor if it is one (symbolic ones too), else ``convert(name, value)``: a
    NumPy array, or the shared error for what holds no numbers (`shared.checks.as_array`).
    Converted to a tensor only after the loss's checks, as torch_impl's: TensorFlow holds no
    duration or date, and would name one in its own words."""
    if tf.is_tensor(value) or isinstance(value, tf.Variable):
        return tf.convert_to_tensor(value)
    return convert(name, value)


def _kind(x) -> tuple[str, bool, bool]:
    """A tensor's or a NumPy array's dtype as the shared checks name it (``float32``, ``string``),
    whether it holds integers (not bool) and whether floats."""
    if isinstance(x, np.ndarray):
        return array_kind(x)
    return x.dtype.name, x.dtype.is_integer, x.dtype.is_floating


def _shape(x) -> list:
    """A tensor's or a NumPy array's shape as a list, None for a size unknown at trace time."""
    return list(x.shape) if isinstance(x, np.ndarray) else x.shape.as_list()


@keras.saving.register_keras_serializable(package="tf_impl")
class NoamSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """The rate of optimizer step ``n`` (counted from 1) is ``shared.noam_lr(start_step + n, d_model,
    warmup, factor)``. Keras calls the schedule with ``optimizer.iterations``, which is 0 at the first
    step, so ``__call__(i)`` evaluates Noam at ``start_step + i + 1``: the expression of
    `shared.schedule.noam_formula`, in float64 TF ops (it runs inside ``tf.function``).
    ``start_step``: steps already taken (to resume a run); Adam's moments still start from zero.
    `import_moments` sets it to 0 (``iterations`` then holds the imported step).
    """

    def __init__(self, d_model: int, warmup: int, factor: float = 1.0, start_step: int = 0):
        start_step = check_start_step(start_step)
        noam_lr(start_step + 1, d_model, warmup, factor)  # the shared argument checks, before anything
        # Python numbers (NumPy's are taken): the formula's constants, and what get_config writes
        self.d_model, self.warmup, self.factor = int(d_model), int(warmup), float(factor)
        # The offset a traced step reads when it runs, not a constant baked into the trace: a step
        # compiled before import_moments moved it would go on at the old offset. (init_scope: made
        # eagerly even where the schedule is built inside a tf.function.)
        with tf.init_scope():
            self._start = tf.Variable(float(start_step), dtype=tf.float64, trainable=False,
                                      name="noam_start_step")
        self.start_step = start_step

    @property
    def start_step(self) -> int:
        return self._start_step

    @start_step.setter
    def start_step(self, value: int) -> None:
        self._start_step = check_start_step(value)
        self._start.assign(float(self._start_step))  # exact: at most 2**53 - 1

    def __call__(self, step) -> tf.Tensor:
        noam_step = tf.cast(step, tf.float64) + (self._start + 1.0)  # exact below 2**53
        return noam_formula(noam_step, self.d_model, self.warmup, self.factor, xp=tf)

    def get_config(self) -> dict:
        return {"d_model": self.d_model, "warmup": self.warmup, "factor": self.factor,
                "start_step": self.start_step}


def noam_schedule(d_model: int, warmup: int, factor: float = 1.0, start_step: int = 0) -> NoamSchedule:
    """The Noam `NoamSchedule`, for a Keras optimizer's ``learning_rate``."""
    return NoamSchedule(d_model, warmup, factor, start_step)


@keras.saving.register_keras_serializable(package="tf_impl")
class KingmaBaAdam(keras.optimizers.Adam):
    """``keras.optimizers.Adam`` with epsilon added to the bias-corrected ``sqrt(v_hat)`` (Kingma & Ba
    Algorithm 1, as ``torch.optim.Adam``) instead of to ``sqrt(v)`` (see the module docstring).

    The update is written in torch's order: ``m = m + (1 - b1) * (g - m)``, ``v = v * b2 + (1 - b2) *
    g * g``, ``var -= lr / (1 - b1^t) * (m / (sqrt(v) / sqrt(1 - b2^t) + eps))``, with the scalar
    factors in float64 and cast to the variable's dtype where they meet it, as torch's Python floats
    are. ``amsgrad`` is not supported.
    """

    def __init__(self, *args, amsgrad: bool = False, **kwargs):
        if amsgrad:
            raise ValueError("amsgrad: not supported by KingmaBaAdam, got True")
        super().__init__(*args, **kwargs)

    def _distributed_tf_update_step(self, distribution, grads_and_vars, learning_rate):
        # The bias corrections once per update, not once per variable: tf.function traces every op.
        # Keras' TF optimizer runs this once per update, after summing the replicas' gradients (in
        # the cross-replica context under a tf.distribute strategy; directly without one), so one
        # value serves every variable and every replica's copy of it; `apply` would run once per
        # replica thread. (Set past Keras' attribute tracking: a plain, temporary value.)
        object.__setattr__(self, "_corrections", self._bias_corrections())
        try:
            return super()._distributed_tf_update_step(distribution, grads_and_vars, learning_rate)
        finally:
            object.__setattr__(self, "_corrections", None)

    def _bias_corrections(self) -> tuple[tf.Tensor, tf.Tensor]:
        """``(1 - b1^t, sqrt(1 - b2^t))`` in float64 for this update's step ``t`` (from 1)."""
        # Python floats become tensors directly in the dtype they are used in: ``ops.cast(0.98, d)``
        # would round through float32 first (a 5e-7 relative error in 1 - beta_2, stock Adam's).
        step = ops.cast(self.iterations + 1, "float64")
        return (1.0 - ops.power(_constant(self.beta_1, "float64"), step),
                ops.sqrt(1.0 - ops.power(_constant(self.beta_2, "float64"), step)))

    def update_step(self, gradient, variable, learning_rate):
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        bias_correction1, bias_correction2_sqrt = (getattr(self, "_corrections", None)
                                                   or self._bias_corrections())
        step_size = ops.cast(ops.cast(learning_rate, "float64") / bias_correction1, dtype)
        m = self._momentums[self._get_variable_index(variable)]
        v = self._velocities[self._get_variable_index(variable)]
        beta_1, beta_2 = self.beta_1, self.beta_2
        self.assign(m, m + _constant(1.0 - beta_1, dtype) * (gradient - m))  # torch: lerp
        self.assign(v, v * _constant(beta_2, dtype) + _constant(1.0 - beta_2, dtype) * gradient * gradient)
        denom = ops.sqrt(v) / ops.cast(bias_correction2_sqrt, dtype) + _constant(self.epsilon, dtype)
        self.assign_sub(variable, step_size * (m / denom))


def _constant(value: float, dtype) -> tf.Tensor:
    return tf.constant(value, dtype=dtype)


def make_optimizer(model: Transformer, d_model: int | None = None, warmup: int = 4000,
                   factor: float = 1.0, start_step: int = 0) -> KingmaBaAdam:
    """`KingmaBaAdam` ``(beta_1=0.9, beta_2=0.98, epsilon=1e-9)`` with the Noam `NoamSchedule` as its
    learning rate, built on the model's variables (tied ones once).

    Args:
        d_model: the schedule's ``d_model`` (default ``model.config.d_model``).
        warmup, factor: the Noam schedule's (docs/design.md, convention 13); the paper uses 4000
            and 1.0.
        start_step: optimizer steps already taken, to resume the schedule where a run stopped
            without Adam's moments (they start from zero). To resume with them, `import_moments`
            places the schedule at its own step, whatever ``start_step`` was (0, or that step).
    """
    check_model(model)
    d_model = model.config.d_model if d_model is None else d_model
    optimizer = KingmaBaAdam(learning_rate=noam_schedule(d_model, warmup, factor, start_step),
                             beta_1=BETAS[0], beta_2=BETAS[1], epsilon=EPS)
    optimizer.build(model.trainable_variables)  # slots created eagerly, not inside the first trace
    return optimizer


def _batch(model: Transformer, batch: Batch) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
    """``(src, tgt_in, tgt_out)`` as checked int64 tensors; tgt_out shaped like tgt_in, its ids in
    range and at least one of them not padding (else the mean loss is 0 / 0)."""
    sequence = isinstance(batch, (tuple, list))
    if not sequence or len(batch) != 3:
        raise refusal(sequence)(f"batch: expected (src, tgt_in, tgt_out), got {type(batch).__name__}"
                                + (f" of length {len(batch)}" if sequence else ""))
    c = model.config
    # Non-tensors through the shared conversion torch_impl's _batch makes (`shared.checks.batch_ids`):
    # None, ragged rows, objects and text named in its words, not TensorFlow's.
    src = check_ids("src", _ids_tensor("src", batch[0]), c.src_vocab, c.max_len)
    tgt_in = check_ids("tgt_in", _ids_tensor("tgt_in", batch[1]), c.tgt_vocab, c.max_len)
    # Here, eagerly: inside the compiled step the model's own check is a graph assertion, which
    # fails as TensorFlow's InvalidArgumentError rather than torch_impl's ValueError.
    check_same_batch(src, tgt_in, "tgt_in")
    tgt_out = _ids_tensor("tgt_out", batch[2])
    if tgt_out.shape != tgt_in.shape:
        raise ValueError(f"tgt_out: expected the shape of tgt_in {tuple(tgt_in.shape)}, "
                         f"got {tuple(tgt_out.shape)}")
    tgt_out = check_ids("tgt_out", tgt_out, c.tgt_vocab, c.max_len)
    # Refused here, naming tgt_out, before any work: a mean over no target is NaN, and the update
    # would make every weight NaN. (A read to the host, a sync on a GPU, as torch_impl's.)
    if not bool(tf.reduce_any(tgt_out != c.pad_id)):
        raise ValueError(f"tgt_out: expected at least one non-padding target, got only pad_id={c.pad_id}")
    return tuple(tf.cast(x, tf.int64) for x in (src, tgt_in, tgt_out))


def _ids_tensor(name: str, value) -> tf.Tensor:
    """A batch's ids as a tensor: tensors as they are, anything else through `shared.checks.batch_ids`
    (which refuses what TensorFlow could not hold)."""
    return tf.convert_to_tensor(_as_tensor(name, value, batch_ids))


def _loss(model: Transformer, src, tgt_in, tgt_out, smoothing: float, training: bool,
          tokens=None) -> tf.Tensor:
    logits = model(src, tgt_in, training=training)  # (B, T, V)
    return label_smoothed_loss(logits, tgt_out, model.config.pad_id, smoothing, tokens)


_IDS = tf.TensorSpec([None, None], tf.int64)


def _compiled_step(model: Transformer, optimizer: keras.optimizers.Optimizer, smoothing: float):
    """One ``tf.function`` per (model, optimizer, smoothing), traced once for every batch shape.

    Cached on the optimizer (in its ``__dict__``, past Keras' attribute tracking), so it lives and
    dies with it; the step holds the model, so the ``id`` in the key stays that model's. Made
    again when the model's structure changes (`tf_impl.model._structure`: a precision set, LoRA
    enabled), which a trace would not see."""
    def make():
        # No tensor-dependent Python control flow here or in the model: AutoGraph's conversion
        # would only add tracing time (the trace, ~6000 ops, is the slow part of a short run).
        @tf.function(input_signature=[_IDS, _IDS, _IDS], autograph=False)
        def step(src, tgt_in, tgt_out):
            variables = model.trainable_variables
            with tf.GradientTape() as tape:
                loss = _loss(model, src, tgt_in, tgt_out, smoothing, training=True)
            # Dense gradients (embedding lookups give IndexedSlices), as torch's are.
            grads = [tf.convert_to_tensor(g) for g in tape.gradient(loss, variables)]
            lr = tf.cast(optimizer.learning_rate, tf.float64)  # read before apply advances iterations
            optimizer.apply_gradients(zip(grads, variables))
            return loss, lr
        return step

    steps = optimizer.__dict__.setdefault("_tf_impl_train_steps", {})
    return _traced(steps, (id(model), float(smoothing)), model, make)


def check_optimizer(model: Transformer, optimizer) -> None:
    """``optimizer`` is a Keras optimizer which, once built, holds some of ``model``'s trainable
    variables (torch_impl's check is the same): one built for another model cannot step this one.
    Read from Keras' private ``_trainable_variables`` here and nowhere else."""
    check_model(model)
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"optimizer: expected a keras.optimizers.Optimizer (make_optimizer(model)), "
                        f"got {type(optimizer).__name__}")
    known = getattr(optimizer, "_trainable_variables", None) if optimizer.built else None
    mine = {id(v) for v in model.trainable_variables}
    if known is not None and not any(id(v) in mine for v in known):
        raise ValueError(FOREIGN_OPTIMIZER)


def train_step(model: Transformer, optimizer: keras.optimizers.Optimizer, batch: Batch,
               smoothing: float = 0.0) -> StepResult:
    """One update: loss of ``batch`` with dropout active (``training=True``), gradients, Adam step;
    compiled with ``tf.function`` (traced once per model, optimizer and smoothing, any batch shape).

    Args:
        batch: ``(src (B, S), tgt_in (B, T), tgt_out (B, T))`` integer ids (NumPy or tf), as
            `shared.tasks.batch_sequences` makes them; ``pad_id`` targets carry no loss.
        smoothing: label smoothing eps in [0, 1).

    Returns:
        ``StepResult(loss, lr)``: the loss before the update and the learning rate of this step.

    Raises ``ValueError`` naming ``optimizer`` for a learning rate that is not finite and >= 0 (a
    Keras optimizer made with ``learning_rate=-1.0`` or NaN: Keras takes them), before anything
    is computed (`shared.training.check_learning_rate`).
    """
    check_smoothing(smoothing)  # before tracing: it is a Python constant of the compiled step
    check_optimizer(model, optimizer)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    _check_rate(optimizer)
    loss, lr = _compiled_step(model, optimizer, smoothing)(*_batch(model, batch))
    return StepResult(float(loss.numpy()), float(lr.numpy()))


def _check_rate(optimizer: keras.optimizers.Optimizer) -> None:
    """The rate the next update takes, refused unless finite and >= 0, as torch_impl's step
    refuses it. `make_optimizer`'s `NoamSchedule` is not read: its arguments were checked when it
    was made (`shared.schedule.noam_lr`), so every rate it gives is finite and > 0, and reading it
    here would cost a read from the device each step (``iterations`` on a GPU). Any other rate (a
    float, another schedule, a callable) is evaluated eagerly, one read of the device a step."""
    if not isinstance(getattr(optimizer, "_learning_rate", None), NoamSchedule):
        check_learning_rate(optimizer.learning_rate)


def gradients(model: Transformer, batch: Batch, smoothing: float = 0.0,
              training: bool = True) -> dict[str, np.ndarray]:
    """The gradient of `label_smoothed_loss` on ``batch`` for every canonical weight (eagerly):
    ``{name: ndarray}`` in the canonical layout (kernels ``(in, out)``, as Keras stores them); a
    tied weight appears once, with the sum over its uses; a frozen one too (the tape watches it).
    ``training``: dropout on (as in `train_step`) or off (True or False)."""
    check_model(model)
    check_flag(training, "training")
    table = weight_table(model, "gradients")
    check_smoothing(smoothing)  # before the batch and the forward pass, as torch_impl's
    src, tgt_in, tgt_out = _batch(model, batch)
    with tf.GradientTape() as tape:
        loss = _loss(model, src, tgt_in, tgt_out, smoothing, training)
    grads = tape.gradient(loss, list(table.values()))
    return {name: np.asarray(tf.convert_to_tensor(g)) for name, g in zip(table, grads)}


# -- Adam's moments in the canonical layout (the same functions in torch_impl.training) -----------
def export_moments(model: Transformer, optimizer: keras.optimizers.Optimizer | None) -> dict[str, np.ndarray]:
    """Adam's moments as ``{"m.<name>": first, "v.<name>": second}`` for every canonical weight
    name, in the canonical layout (kernels ``(in, out)``, as Keras keeps them); zeros without an
    optimizer. With `import_moments` a run saved from either backend resumes in the other. Keras
    keeps them in private slots (``_momentums``, ``_velocities``): read here and nowhere else.
    Zeros too for a weight the optimizer was not built with (frozen when it was made), which has
    none, as torch_impl's zeros for a weight without state."""
    check_model(model)
    if optimizer is not None:
        check_optimizer(model, optimizer)
    out = {}
    table = weight_table(model, "export_moments")
    for kind in ("m", "v"):
        for name, variable in table.items():
            index = None if optimizer is None else _slot_index(optimizer, variable)
            if index is None:  # no optimizer, or a weight it does not train: zeros, as torch_impl's
                out[f"{kind}.{name}"] = np.zeros(tuple(variable.shape), dtype=model.config.dtype)
                continue
            slots = optimizer._momentums if kind == "m" else optimizer._velocities
            out[f"{kind}.{name}"] = np.asarray(slots[index].numpy())
    return out


def _slot_index(optimizer: keras.optimizers.Optimizer, variable) -> int | None:
    """The index of ``variable``'s moments in the optimizer's slots, or None for a variable it was
    not built with (frozen when `make_optimizer` ran: LoRA's kernels, a layer set untrainable),
    which has none (Keras' ``_get_variable_index`` raised a bare KeyError)."""
    return optimizer._trainable_variables_indices.get(optimizer._var_key(variable))


def import_moments(model: Transformer, optimizer: keras.optimizers.Optimizer, moments, step: int) -> None:
    """Set ``optimizer``'s Adam state to ``moments`` (the layout of `export_moments`) after
    ``step`` updates, so that the next update is the one the saved run would have made.

    ``step`` places the whole optimizer, in both backends: Keras' one step count
    (``iterations``, which Adam's bias corrections and the schedule read) and the `NoamSchedule`
    of `make_optimizer`, whose offset is set to 0 so that the next rate is Noam step ``step + 1``
    whatever ``start_step`` the optimizer was made with and however far it ran (a saved run holds
    one step, which must place both). So ``make_optimizer(model)`` and ``make_optimizer(model,
    start_step=step)`` resume alike, from a save of either backend.

    A weight the optimizer was not built with (frozen when `make_optimizer` ran) has no moments
    here: zeros for it are passed over, other values refused (``ValueError``), before anything is
    set. torch_impl's optimizer holds every parameter, frozen ones too, and takes them.
    """
    check_optimizer(model, optimizer)
    moments = check_moments(model.config, moments, step)  # all of it, before any state is set
    table = weight_table(model, "import_moments")
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    indices = {name: _slot_index(optimizer, variable) for name, variable in table.items()}
    # A weight the optimizer holds no moments for (frozen when it was made) takes zeros, as it
    # exports them; other moments would be lost, so they are refused, before anything is set.
    lost = [f"{kind}.{name}" for name, index in indices.items() if index is None
            for kind in ("m", "v") if np.any(moments[f"{kind}.{name}"])]
    if lost:
        raise ValueError(f"moments: {listed_names(lost)} are not zero, and the optimizer holds no moments "
                         "for their weights (not trainable when it was made); make the optimizer "
                         "after unfreezing them")
    optimizer.iterations.assign(step)
    for name, index in indices.items():
        if index is not None:
            optimizer._momentums[index].assign(moments[f"m.{name}"])
            optimizer._velocities[index].assign(moments[f"v.{name}"])
    _resume_schedule(optimizer)


def _resume_schedule(optimizer: keras.optimizers.Optimizer) -> None:
    """`make_optimizer`'s `NoamSchedule` (if ``optimizer`` has one) counted from ``iterations``
    alone, which `import_moments` has just set: torch_impl's `import_moments` places its scheduler
    the same. A learning rate the user made otherwise is theirs to place. (Keras keeps the
    schedule in the private ``_learning_rate``: read here and in `_check_rate`.)"""
    schedule = getattr(optimizer, "_learning_rate", None)
    if isinstance(schedule, NoamSchedule):
        schedule.start_step = 0
