"""Training with PyTorch's own tools: the built-in label-smoothed cross-entropy, ``torch.optim.Adam``
and a ``LambdaLR`` Noam schedule; mirrored name for name by `tf_impl.training`.

    model = Transformer(config)
    optimizer = make_optimizer(model, warmup=400)       # Adam(0.9, 0.98, 1e-9) + Noam, lr(1) first
    for batch in batches:                               # (src, tgt_in, tgt_out), see shared.tasks
        loss, lr = train_step(model, optimizer, batch, smoothing=0.1)

The returned optimizer advances its own schedule: a step post-hook calls ``LambdaLR.step()`` after
every ``optimizer.step()``, as a Keras optimizer advances its ``LearningRateSchedule`` through
``optimizer.iterations``. So a training step needs only the model, the optimizer and the batch, in
both backends. (tf_impl.training adds two classes this file does not need: ``NoamSchedule``, as Keras
takes a schedule object, and ``KingmaBaAdam``, as Keras' Adam adds epsilon where torch's does not.)
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from shared.checks import array_kind, as_array, batch_ids, check_flag, ids_array, refusal
from shared.loss import check_loss_args, check_smoothing, check_some_targets, check_targets_range, check_tokens
from shared.messages import shown
from shared.moments import FOREIGN_OPTIMIZER, MAX_STEP, check_moments
from shared.schedule import check_start_step, noam_lr
from shared.training import check_learning_rate

from .cache import _mode
from .inputs import _as_ids, _from_array, _id_summary, _is_integer, check_same_batch
from .model import Transformer, check_model
from .weights_io import weight_table

# The paper's Adam (section 5.3); eps is added to the bias-corrected sqrt(v), Kingma & Ba Algorithm 1.
BETAS = (0.9, 0.98)
EPS = 1e-9

Batch = Sequence  # (src (B, S), tgt_in (B, T), tgt_out (B, T)): integer ids, NumPy or torch


class StepResult(NamedTuple):
    """What `train_step` reports: the batch's loss (before the update) and the learning rate it used."""
    loss: float
    lr: float


def label_smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, pad_id: int,
                        smoothing: float = 0.0, tokens: int | None = None) -> torch.Tensor:
    """Mean label-smoothed cross-entropy over the non-padding targets (docs/design.md,
    convention 14).

    ``F.cross_entropy(label_smoothing=eps, ignore_index=pad_id)``: the target distribution is
    ``(1 - eps) * onehot + eps / V``, positions whose target is ``pad_id`` carry no loss and the mean
    divides by the number of the others (`shared.loss.label_smoothed_cross_entropy` is the float64
    reference).

    Targets must lie in ``[0, V)`` (pad included): any other id raises the reference's
    ``ValueError`` (`shared.loss.check_targets_range`). So does a batch with no target to average
    (every one padding, ``B = 0`` or ``T = 0``: `shared.loss.check_some_targets`), whose mean would
    be NaN (0 / 0): the check costs no transfer of its own, it rides with the range's.

    ``tokens``: divide the summed loss by this count instead (a data-parallel worker's share of the
    global batch divides by the global batch's non-padding targets, `shared.data_parallel`); a
    share of padding alone is then 0, not refused.
    bfloat16 logits (mixed precision) are cast to float32 first: the loss is never computed in
    bfloat16 (``torch.autocast`` would do the same inside its context; this loss runs outside it).

    Shape: logits ``(B, T, V)``, targets ``(B, T)`` integer -> a scalar tensor.
    """
    # NumPy arrays and nested lists too, converted as tf_impl and the reference convert them
    logits, targets = _as_tensor("logits", logits, as_array), _as_tensor("targets", targets, ids_array)
    (targets_dtype, targets_integer, _), (logits_dtype, _, logits_floating) = map(_kind, (targets, logits))
    check_loss_args("label_smoothed_loss", logits.shape, targets.shape, targets_dtype, targets_integer,
                    smoothing, logits_dtype, logits_floating, pad_id)
    if not isinstance(tokens, torch.Tensor):
        check_tokens(tokens)
    # checked: numbers
    logits, targets = (x if isinstance(x, torch.Tensor) else _from_array(x) for x in (logits, targets))
    vocab = logits.shape[-1]
    # Before the lookup: cross_entropy raises a bare IndexError (CUDA: an assert). One
    # device-to-host transfer for the range and the non-padding check together (on a GPU each read
    # is a sync; the range needs one anyway).
    any_target = False
    if targets.numel():
        lo, hi, any_target = _id_summary(targets, pad_id)
        check_targets_range(vocab, lo, hi)
    if tokens is None:
        check_some_targets(any_target)
    return _smoothed_loss(logits, targets, pad_id, smoothing, tokens)


def _smoothed_loss(logits: torch.Tensor, targets: torch.Tensor, pad_id: int, smoothing: float,
                   tokens: int | None) -> torch.Tensor:
    """`label_smoothed_loss` of arguments it has checked (or `_batch` has: ids in range, some
    not padding; so a step reads no tensor back for the loss's checks)."""
    if logits.dtype in (torch.bfloat16, torch.float16):
        logits = logits.float()
    vocab = logits.shape[-1]
    reduction = "mean" if tokens is None else "sum"
    loss = F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1).long(), ignore_index=pad_id,
                           label_smoothing=float(smoothing), reduction=reduction)
    return loss if tokens is None else loss / tokens


def _as_tensor(name: str, value, convert):
    """``value`` as it is if a tensor, else ``convert(name, value)``: a NumPy array, or the shared
    error for what holds no numbers (`shared.checks.as_array`). Converted to a tensor only after the
    loss's checks, which name text by its dtype (torch holds none)."""
    return value if isinstance(value, torch.Tensor) else convert(name, value)


def _kind(x) -> tuple[str, bool, bool]:
    """A tensor's or a NumPy array's dtype as the shared checks name it (``float32``, ``string``),
    whether it holds integers (not bool) and whether floats."""
    if isinstance(x, torch.Tensor):
        return str(x.dtype)[6:], _is_integer(x.dtype), x.dtype.is_floating_point
    return array_kind(x)


def noam_schedule(optimizer: torch.optim.Optimizer, d_model: int, warmup: int, factor: float = 1.0,
                  start_step: int = 0) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` that sets the rate of optimizer step ``n`` (counted from 1) to
    ``shared.noam_lr(start_step + n, d_model, warmup, factor)``.

    ``LambdaLR`` multiplies each group's initial ``lr`` by the lambda, so that ``lr`` must be 1.0; and
    it calls the lambda with 0 at construction (the rate of the first step), so scheduler step ``s``
    maps to Noam step ``s + 1`` and Noam's step 0 (undefined) is never asked for. Call
    ``scheduler.step()`` after each ``optimizer.step()`` (`make_optimizer` does it with a hook).
    ``start_step``: steps already taken (to resume a run); Adam's moments still start from zero.
    The scheduler is kept on the optimizer, so that `import_moments` moves it to its step.
    """
    start_step = check_start_step(start_step)
    noam_lr(start_step + 1, d_model, warmup, factor)  # the shared argument checks, before anything
    for group in optimizer.param_groups:
        if group["lr"] != 1.0:
            raise ValueError(f"optimizer: expected lr=1.0 in every param group (LambdaLR multiplies it "
                             f"by the Noam rate), got {shown(group['lr'])} ({type(group['lr']).__name__})")
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _NoamRate(d_model, warmup, factor, start_step))
    optimizer._noam_scheduler = scheduler  # the one place it is set; read by _resume_schedule
    return scheduler


class _NoamRate:
    """``LambdaLR``'s lambda: scheduler step ``s`` -> ``noam_lr(start_step + s + 1, ...)``. An
    object, not a closure, so that `_resume_schedule` can move ``start_step`` (and
    ``LambdaLR.state_dict`` keeps it: it saves a callable object's attributes, not a function's)."""

    def __init__(self, d_model: int, warmup: int, factor: float, start_step: int):
        # Python numbers (NumPy's are taken), as tf_impl's schedule keeps them
        self.d_model, self.warmup, self.factor = int(d_model), int(warmup), float(factor)
        self.start_step = start_step

    def __call__(self, s: int) -> float:
        # LambdaLR asks for the next step's rate after each update, and a step past MAX_STEP (2**53)
        # is past what noam_lr takes: that update was made, so it is not refused after the fact
        # (the weights changed, then a ValueError). Its rate is MAX_STEP's, as tf_impl's float64
        # schedule rounds a step past 2**53 to it (the rates of the two differ by under 1e-16).
        step = min(self.start_step + s + 1, MAX_STEP)
        return noam_lr(step, self.d_model, self.warmup, self.factor)


def _resume_schedule(optimizer: torch.optim.Optimizer, step: int) -> None:
    """Put `noam_schedule`'s scheduler of ``optimizer`` (if it has one) after ``step`` updates: its
    next rate is Noam step ``step + 1``, whatever ``start_step`` it was made with and however far
    it ran; tf_impl's `import_moments` does the same to its schedule. A scheduler the user made
    otherwise is theirs to place."""
    scheduler = getattr(optimizer, "_noam_scheduler", None)
    if scheduler is None:
        return
    for rate in scheduler.lr_lambdas:
        if isinstance(rate, _NoamRate):
            rate.start_step = 0
    scheduler.last_epoch = step  # scheduler step ``step`` is Noam step ``step + 1``
    scheduler._last_lr = []
    for group, base, rate in zip(optimizer.param_groups, scheduler.base_lrs, scheduler.lr_lambdas):
        group["lr"] = base * rate(step)  # what LambdaLR.step() sets
        scheduler._last_lr.append(group["lr"])


def make_optimizer(model: Transformer, d_model: int | None = None, warmup: int = 4000,
                   factor: float = 1.0, start_step: int = 0) -> torch.optim.Adam:
    """``torch.optim.Adam(betas=(0.9, 0.98), eps=1e-9)`` over the model's parameters (tied ones once),
    with the Noam schedule of `noam_schedule` attached: every ``optimizer.step()`` advances it.

    Args:
        d_model: the schedule's ``d_model`` (default ``model.config.d_model``).
        warmup, factor: the Noam schedule's (docs/design.md, convention 13); the paper uses 4000
            and 1.0.
        start_step: optimizer steps already taken, to resume the schedule where a run stopped
            without Adam's moments (they start from zero). To resume with them, `import_moments`
            places the schedule at its own step, whatever ``start_step`` was (0, or that step).
    """
    check_model(model)
    optimizer = torch.optim.Adam(model.parameters(), lr=1.0, betas=BETAS, eps=EPS)
    d_model = model.config.d_model if d_model is None else d_model
    scheduler = noam_schedule(optimizer, d_model, warmup, factor, start_step)
    optimizer.register_step_post_hook(lambda opt, args, kwargs: scheduler.step())
    return optimizer


def check_optimizer(model: Transformer, optimizer) -> None:
    """``optimizer`` is a ``torch.optim.Optimizer`` over some of ``model``'s trainable parameters
    (tf_impl's check is the same): one made for another model steps nothing of this one."""
    check_model(model)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer: expected a torch.optim.Optimizer (make_optimizer(model)), got "
                        f"{type(optimizer).__name__}")
    mine = {id(p) for p in model.parameters() if p.requires_grad}
    if not any(id(p) in mine for group in optimizer.param_groups for p in group["params"]):
        raise ValueError(FOREIGN_OPTIMIZER)


def _batch(model: Transformer, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(src, tgt_in, tgt_out)`` as tensors on the model's device; tgt_out shaped like tgt_in and
    holding at least one non-padding target (else the mean loss is 0 / 0)."""
    sequence = isinstance(batch, (tuple, list))
    if not sequence or len(batch) != 3:
        raise refusal(sequence)(f"batch: expected (src, tgt_in, tgt_out), got {type(batch).__name__}"
                                + (f" of length {len(batch)}" if sequence else ""))
    c, device = model.config, next(model.parameters()).device
    # in tf_impl's order: src, tgt_in, their batches, then tgt_out; each named as the batch's
    # documentation names it (tgt_in is the model's tgt)
    src = _as_ids("src", batch[0], c.src_vocab, c.max_len, device)
    tgt_in = _as_ids("tgt_in", batch[1], c.tgt_vocab, c.max_len, device)
    check_same_batch(src, tgt_in, "tgt_in")
    tgt_out = batch[2] if isinstance(batch[2], torch.Tensor) else _from_array(batch_ids("tgt_out", batch[2]))
    if tgt_out.shape != tgt_in.shape:
        raise ValueError(f"tgt_out: expected the shape of tgt_in {tuple(tgt_in.shape)}, "
                         f"got {tuple(tgt_out.shape)}")
    tgt_out = _as_ids("tgt_out", tgt_out, c.tgt_vocab, c.max_len, device)
    # Refused here, naming tgt_out, before any work: a mean over no target is NaN, and the update
    # would make every weight NaN. (A read to the host, a sync on a GPU; the step skips the loss's
    # own read of the same facts instead, `_smoothed_loss`.)
    if not bool((tgt_out != model.config.pad_id).any()):
        raise ValueError(f"tgt_out: expected at least one non-padding target, got only pad_id="
                         f"{model.config.pad_id}")
    return src, tgt_in, tgt_out


def _loss(model: Transformer, batch: Batch, smoothing: float, training: bool) -> torch.Tensor:
    check_smoothing(smoothing)  # before the batch and the forward pass, as tf_impl's
    src, tgt_in, tgt_out = _batch(model, batch)
    with _mode(model, training):  # dropout on for the step only: each module's mode comes back
        logits = model(src, tgt_in)  # (B, T, V)
    # _batch has checked tgt_out as the loss would (range, not all padding): not read again
    return _smoothed_loss(logits, tgt_out, model.config.pad_id, smoothing, None)


def train_step(model: Transformer, optimizer: torch.optim.Optimizer, batch: Batch,
               smoothing: float = 0.0) -> StepResult:
    """One update: loss of ``batch`` with dropout active, backward, ``optimizer.step()``.

    Args:
        batch: ``(src (B, S), tgt_in (B, T), tgt_out (B, T))`` integer ids (NumPy or torch), as
            `shared.tasks.batch_sequences` makes them; ``pad_id`` targets carry no loss.
        smoothing: label smoothing eps in [0, 1).

    Returns:
        ``StepResult(loss, lr)``: the loss before the update and the learning rate of this step
        (the first param group's).

    Raises ``ValueError`` naming ``optimizer`` for a learning rate that is not finite and >= 0 (a
    param group's ``lr`` set after the optimizer was made: torch's Adam refuses them only then),
    before anything is computed (`shared.training.check_learning_rate`).
    """
    check_smoothing(smoothing)  # first, as tf_impl's
    check_optimizer(model, optimizer)
    # Every group's rate, refused unless finite and >= 0 before anything is computed: Python floats
    # (LambdaLR sets them), so no read from a device; a tensor rate is read once (a sync on a GPU).
    lr = [check_learning_rate(group["lr"]) for group in optimizer.param_groups][0]
    loss = _loss(model, batch, smoothing, training=True)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    return StepResult(float(loss.item()), lr)


def gradients(model: Transformer, batch: Batch, smoothing: float = 0.0,
              training: bool = True) -> dict[str, np.ndarray]:
    """The gradient of `label_smoothed_loss` on ``batch`` for every canonical weight, without touching
    ``.grad``: ``{name: ndarray}`` in the canonical layout (kernels ``(in, out)``, transposed from
    ``nn.Linear``'s ``(out, in)``); a tied weight appears once, with the sum over its uses; a frozen
    one (``requires_grad`` False) too, as tf_impl's tape gives it, and it stays frozen.
    ``training``: dropout on (as in `train_step`) or off (True or False)."""
    check_model(model)
    check_flag(training, "training")
    table = weight_table(model, "gradients")
    # a frozen weight's gradient too, as tf_impl's tape gives it (torch refused the call: "One of
    # the differentiated Tensors does not require grad"); frozen again whatever happens
    frozen = [param for param, _ in table.values() if not param.requires_grad]
    try:
        for param in frozen:
            param.requires_grad_(True)
        loss = _loss(model, batch, smoothing, training)
        grads = torch.autograd.grad(loss, [param for param, _ in table.values()])
    finally:
        for param in frozen:
            param.requires_grad_(False)
    return {name: np.ascontiguousarray((g.T if transposed else g).detach().cpu().numpy())
            for (name, (_, transposed)), g in zip(table.items(), grads)}


# -- Adam's moments in the canonical layout (the same functions in tf_impl.training) --------------
def export_moments(model: Transformer, optimizer: torch.optim.Optimizer | None) -> dict[str, np.ndarray]:
    """Adam's moments as ``{"m.<name>": first, "v.<name>": second}`` for every canonical weight
    name, in the canonical layout (kernels ``(in, out)``: ``nn.Linear``'s ``(out, in)``
    transposed back); zeros for a weight without state yet (or without an optimizer). With
    `import_moments` a run saved from either backend resumes in the other."""
    check_model(model)
    if optimizer is not None:
        check_optimizer(model, optimizer)
    out = {}
    table = weight_table(model, "export_moments")
    for kind, key in (("m", "exp_avg"), ("v", "exp_avg_sq")):
        for name, (param, transposed) in table.items():
            state = optimizer.state.get(param) if optimizer is not None else None
            if state and key in state:
                a = state[key].detach().cpu().numpy()  # on the CPU, a view of the state itself
                # a copy: the next update changes the state in place, and with it a view
                out[f"{kind}.{name}"] = np.array(a.T if transposed else a, order="C", copy=True)
            else:
                out[f"{kind}.{name}"] = np.zeros(tuple(reversed(param.shape)) if transposed
                                                 else tuple(param.shape), dtype=model.config.dtype)
    return out


def import_moments(model: Transformer, optimizer: torch.optim.Optimizer, moments, step: int) -> None:
    """Set ``optimizer``'s Adam state to ``moments`` (the layout of `export_moments`) after
    ``step`` updates, so that the next update is the one the saved run would have made.

    ``step`` places the whole optimizer, in both backends: Adam's step count (torch keeps one per
    parameter, set here) and the Noam schedule of `make_optimizer` / `noam_schedule`, whose next
    rate is Noam step ``step + 1`` whatever ``start_step`` the optimizer was made with and however
    far it ran (a saved run holds one step, which must place both). So ``make_optimizer(model)``
    and ``make_optimizer(model, start_step=step)`` resume alike, from a save of either backend.
    """
    check_optimizer(model, optimizer)
    moments = check_moments(model.config, moments, step)  # all of it, before any state is set
    for name, (param, transposed) in weight_table(model, "import_moments").items():
        m, v = (moments[f"{k}.{name}"] for k in ("m", "v"))
        optimizer.state[param] = {"step": torch.tensor(float(step)),
                                  "exp_avg": _as_param(m, param, transposed),
                                  "exp_avg_sq": _as_param(v, param, transposed)}
    _resume_schedule(optimizer, step)


def _as_param(array: np.ndarray, param: torch.Tensor, transposed: bool) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array.T if transposed else array).copy()).to(
        param.device, param.dtype)
