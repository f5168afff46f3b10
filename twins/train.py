"""`twins train`: the copy and dates demos, trained in either backend, resumable in either.

A run lives in one directory (``--checkpoint DIR``), which is a neutral checkpoint that every
command reads (``twins decode``, ``twins convert``, ``twins compare --checkpoint``,
``load_checkpoint`` in both backends), with two more files::

    DIR/config.json           the model config           } the neutral checkpoint
    DIR/model.safetensors     the weights                }   (shared.weights)
    DIR/optimizer.safetensors Adam's moments by canonical weight name (m.<name>, v.<name>)
    DIR/train_log.json        task, seed, settings, step count, per-step loss and learning rate,
                              every evaluation, and one entry per invocation (backend, steps, time)

The directory is written once, at the end, into a temporary sibling that then takes the place of
DIR (`shared.saving.replace_directory`), so DIR always holds one complete (weights, moments, log)
triple, the old one or the new one, even if the process is killed while saving; the next `twins
train` or `twins decode` of DIR repairs an interrupted save. A run stopped early is saved too, at
the last step it counted, whose weights and moments it saves: by Ctrl-C (SIGINT, exit 130) or
SIGTERM (``timeout``, a batch scheduler: exit 143), with or without ``--workers`` (`_Signals`), and
by an evaluation that failed (out of memory, a full stdout), whose error follows the save.

Resuming: ``--checkpoint DIR`` naming an existing run continues it: the weights, Adam's moments and
the step count are loaded, ``--steps N`` runs N more steps, and the Noam schedule and the data
stream carry on from the step reached (the batch of step k is a function of (seed, k) alone), in
either backend. Training settings not given on the command line come from the log.
"""
from __future__ import annotations

import contextlib
import math
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from shared import TransformerConfig
from shared import weights as neutral
from shared.devices import DEFAULT as DEFAULT_DEVICE
from shared.paths import holds_cwd
from shared.saving import check_not_read_only, naming, recover, temporary_name

from shared.checks import int_argument
from shared.data_parallel import TIMEOUT_S, check_timeout, check_workers
from shared.memory import check_training_batch
from shared.precision import check_precision
from shared.schedule import noam_lr
from shared.threads import check_threads, check_worker_limit

from . import arguments
from . import demo_tasks as tasks
from . import parallel, pipes
from .backends import BACKENDS, make_adapter
from .runs import (LOG_FORMAT, LOG_VERSION, NO_FLOAT16, TRAIN_PRECISIONS, check_run_agrees, read_log, read_moments,
                   save_run)

SETTINGS = ("batch", "warmup", "factor", "smoothing")

MAX_HELDOUT, CHUNK_ROWS = tasks.MAX_HELDOUT, tasks.CHUNK_ROWS  # decode's too (twins/demo_tasks.py)

# The most steps a run may reach: the train log bounds its step count as it bounds the seed
# (`twins.runs.log_problems`), so a run saved past it would be refused by every later command.
STEP_MAX = arguments.SEED_MAX


def add_arguments(parser) -> None:
    parser.add_argument("--task", required=True, choices=tasks.TASKS, help="copy or dates")
    parser.add_argument("--backend", required=True, choices=BACKENDS, help="torch or tf")
    parser.add_argument("--steps", type=arguments.integer, required=True,
                        help="optimizer steps to run now (on a resumed run: more steps)")
    parser.add_argument("--checkpoint", required=True, metavar="DIR", type=arguments.path,
                        help="the run directory: created, or resumed when it holds a run")
    parser.add_argument("--seed", type=arguments.seed, help="data, initial weights and dropout (default 0; a "
                        "resumed run keeps its own)")
    model = parser.add_mutually_exclusive_group()
    model.add_argument("--preset", type=arguments.preset,
                       help="architecture of a named config (tiny, small, base, big); the task sets "
                       "vocabulary and special ids (default: the task's model)")
    model.add_argument("--config", metavar="FILE.json", type=arguments.path,
                       help="a TransformerConfig as JSON, with the task's vocabulary and special ids")
    parser.add_argument("--batch", type=arguments.integer, help="examples per step (task default)")
    parser.add_argument("--warmup", type=arguments.integer, help="Noam warmup steps (task default)")
    parser.add_argument("--factor", type=float, help="Noam factor (task default)")
    parser.add_argument("--smoothing", type=float, help="label smoothing eps (task default)")
    parser.add_argument("--eval-every", type=arguments.integer,
                        help="evaluate every K steps (task default; 0: only at the end)")
    parser.add_argument("--heldout", type=lambda text: int_argument(text, 1, MAX_HELDOUT), metavar="N",
                        help=f"held-out examples per evaluation (copy 100, dates 1000; N <= {MAX_HELDOUT})")
    parser.add_argument("--stop-at", type=float, metavar="ACC", help="stop once an evaluation "
                        "reaches this exact-match accuracy (0..1)")
    parser.add_argument("--threads", type=arguments.integer,
                        help="CPU threads of the framework (default: its own)")
    parser.add_argument("--device", type=arguments.device, default=DEFAULT_DEVICE,
                        help="where the model trains: cpu (default), cuda or cuda:N (float32 "
                        "products in float32 there: TF32 off; shared/devices.py); not with --workers")
    parser.add_argument("--workers", "--nproc", type=arguments.integer, metavar="N",
                        help="data-parallel workers, each on --batch / N rows of every global batch "
                        "(torch: N gloo processes launched with torchrun; tf: MirroredStrategy over "
                        "N logical CPU devices); default: one process, no engine")
    parser.add_argument("--precision", metavar=arguments.choices(TRAIN_PRECISIONS),
                        type=arguments.precision(*TRAIN_PRECISIONS, why=NO_FLOAT16),
                        help="bfloat16 (or bf16): bfloat16 mixed precision (float32 weights, loss "
                        "and Adam; torch.autocast / Keras mixed_bfloat16); default float32 (fp32), "
                        "or the resumed run's")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"torch workers: a collective waiting longer fails (default {TIMEOUT_S:g})")
    parser.add_argument("--no-progress", action="store_true",
                        help="no progress bar (it is off anyway when stderr is not a terminal)")


# -- evaluation -----------------------------------------------------------------------------------
def evaluate(backend, task: str, examples) -> tuple[np.ndarray, np.ndarray]:
    """Greedy-decode the held-out sources: ``(tokens (N, target_len + 1), exact (N,) bool)``,
    `CHUNK_ROWS` rows at a time, as `twins decode --heldout` does: one batch of every example grew
    with ``--heldout`` until the framework's allocator failed, after training."""
    src = tasks.pad(examples.sources)
    max_len = max(len(t) for t in examples.targets) + 1
    tokens = [backend.greedy(src[start:start + CHUNK_ROWS], max_len).tokens
              for start in range(0, len(src), CHUNK_ROWS)]
    tokens = tokens[0] if len(tokens) == 1 else np.concatenate(tokens)
    return tokens, tasks.exact(tokens, examples.targets)


# -- the command ----------------------------------------------------------------------------------
def _positive(name: str, value, allow_zero: bool = False) -> None:
    if value is not None and (not math.isfinite(value) or value < 0 or (value == 0 and not allow_zero)):
        raise ValueError(f"--{name}: expected {'an int >= 0' if allow_zero else 'a positive number'}, "
                         f"got {value}")


def _check_args(args) -> None:
    if args.steps < 1:
        raise ValueError(f"--steps: expected an int >= 1, got {args.steps}")
    if args.steps > STEP_MAX:
        raise ValueError(f"--steps: expected an int <= {STEP_MAX} (the most steps a train log "
                         f"holds), got {args.steps}")
    _check_checkpoint(args.checkpoint)
    for name in ("batch", "warmup", "factor", "heldout"):
        _positive(name, getattr(args, name))
    check_threads(args.threads)
    if args.workers is not None and args.device != DEFAULT_DEVICE:  # before any worker starts
        raise ValueError(f"--device {args.device} with --workers {args.workers}: data-parallel training "
                         "runs on CPU processes (torch: gloo; tf: logical CPU devices); drop one")
    _positive("eval-every", args.eval_every, allow_zero=True)
    if args.smoothing is not None and not 0.0 <= args.smoothing < 1.0:
        raise ValueError(f"--smoothing: expected a value in [0, 1), got {args.smoothing}")
    if args.stop_at is not None and not 0.0 < args.stop_at <= 1.0:
        raise ValueError(f"--stop-at: expected an accuracy in (0, 1], got {args.stop_at}")
    if args.stop_at is not None and args.eval_every == 0:  # it was ignored: nothing to stop at
        raise ValueError("--stop-at: stops at an evaluation during training, and --eval-every 0 "
                         "evaluates only at the end; give --eval-every K")
    if args.timeout is not None:
        check_timeout(args.timeout, "--timeout")
        if args.backend != "torch" or (args.workers is None and not parallel.in_torchrun()):
            # it was ignored: no collective waits (TensorFlow's replicas share one process)
            raise ValueError("--timeout: how long a collective of torch's --workers waits, and "
                             + ("--backend tf runs its workers in one process" if args.backend != "torch"
                                else "--workers is not given"))
    args.timeout = TIMEOUT_S if args.timeout is None else args.timeout
    if args.workers is not None:  # in the launching process, before anything starts
        log = _peek_log(args)
        batch = _run_batch(args, log)
        check_worker_limit(args.workers, batch)
        check_workers(batch, args.workers)
        _check_before_launch(args, log)


def _check_checkpoint(given: str) -> None:
    """Refuse, before anything trains, a run directory that no save can replace (the save at the
    end swaps a new directory into its place): the current directory or one that contains it
    (``--checkpoint .``: rename says "Device or resource busy" after every step had run), or a
    mount point (an empty path is refused while the command line is parsed, `arguments.path`)."""
    real = Path(os.path.realpath(given))
    which = holds_cwd(real)
    if which is not None:
        raise ValueError(f"--checkpoint {given!r}: expected a run directory a save can replace, got "
                         f"{which}; name a directory inside it (such as {os.path.join(given, 'run')!r})")
    if real.is_dir() and os.path.ismount(real):
        raise ValueError(f"--checkpoint {given!r}: expected a run directory a save can replace, got a "
                         f"mount point; name a directory inside it (such as {os.path.join(given, 'run')!r})")
    check_not_read_only(real)  # the save would refuse it, after every step had run


def _peek_log(args) -> dict | None:
    """The log of the run ``--checkpoint`` names, for the launcher's early checks; None when there
    is none or it is unreadable (refused later, with its own message, by the command itself)."""
    try:
        return read_log(args.checkpoint) if Path(args.checkpoint).is_dir() else None
    except (OSError, ValueError):
        return None


def _check_last_step(args, log: dict | None) -> None:
    """The run's last step (its step count plus ``--steps``) must fit the train log (`STEP_MAX`):
    a run saved past it is refused by every command that reads it."""
    step = (log or {}).get("step", 0)
    if not isinstance(step, int) or isinstance(step, bool):
        return  # a broken log: refused by `read_log` with its own message
    if step + args.steps <= STEP_MAX:
        return
    where = f"--steps {args.steps}: the run in {args.checkpoint!r} is at step {step}"
    if step >= STEP_MAX:
        raise ValueError(f"{where}, the most steps a train log holds; it cannot train further")
    raise ValueError(f"{where}: it would end at step {step + args.steps}, past the most steps a train "
                     f"log holds ({STEP_MAX}); expected --steps <= {STEP_MAX - step}")


def _run_batch(args, log: dict | None) -> int:
    """The global batch the run will use: ``--batch``, else the resumed run's, else the task's."""
    if args.batch is not None:
        return args.batch
    batch = ((log or {}).get("settings") or {}).get("batch")
    valid = isinstance(batch, int) and not isinstance(batch, bool) and batch >= 1
    return batch if valid else tasks.spec(args.task).batch


def _start_or_resume(args, path: Path):
    """``(config, weights, moments, log)`` of a new run or of the run in ``path``."""
    spec = tasks.spec(args.task)
    recover(path)  # a save that a crash interrupted: finished (or refused, naming the data) first
    log = read_log(path) if path.is_dir() else None
    if path.exists() and not path.is_dir():
        raise ValueError(f"--checkpoint {str(path)!r}: exists and is not a directory")
    if log is None and path.is_dir() and any(path.iterdir()):
        what = ("a checkpoint without a train log (not a `twins train` run)"
                if (path / neutral.CONFIG_FILE).exists() else "other files")
        raise ValueError(f"--checkpoint {str(path)!r}: holds {what}; give a new or empty "
                         "directory, or a run directory to resume")
    if log is None:  # a new run
        config = _new_config(args)
        _check_batch_fits(args, config, _run_batch(args, None))
        seed = 0 if args.seed is None else args.seed
        settings = {k: getattr(args, k) if getattr(args, k) is not None else getattr(spec, k)
                    for k in SETTINGS}
        settings["precision"] = args.precision or "float32"
        log = {"format": LOG_FORMAT, "version": LOG_VERSION, "task": args.task, "seed": seed,
               "step": 0, "settings": settings, "config": config.to_dict(), "segments": [],
               "history": {"step": [], "loss": [], "lr": []}, "evals": []}
        return config, neutral.init_weights(config, seed), None, log
    _check_resume(args, path, log)
    config, weights = neutral.load_checkpoint(path)
    check_run_agrees(path, log, config)
    _check_same_model(args, path, config)
    tasks.check_config(args.task, config)
    _check_batch_fits(args, config, _run_batch(args, log))
    for k in SETTINGS:
        if getattr(args, k) is not None:
            log["settings"][k] = getattr(args, k)
    if args.precision is not None:
        log["settings"]["precision"] = args.precision
    return config, weights, read_moments(path, config, log["step"]), log


def _check_resume(args, path: Path, log: dict) -> None:
    """What the log of the run being resumed alone refuses: another task, a last step past the
    log's limit, another seed."""
    if log.get("task") != args.task:
        raise ValueError(f"--checkpoint {str(path)!r}: a run of the {log.get('task')} task, "
                         f"not {args.task}")
    _check_last_step(args, log)
    if args.seed is not None and args.seed != log["seed"]:
        raise ValueError(f"--seed {args.seed}: the run in {str(path)!r} has seed {log['seed']}; a "
                         "resumed run keeps its seed (its data stream)")


def _check_same_model(args, path: Path, config: TransformerConfig) -> None:
    """``--preset`` / ``--config`` given to a resumed run must name the model it holds."""
    if args.preset or args.config:
        wanted = tasks.task_config(args.task, args.preset, args.config)
        if wanted != config:
            raise ValueError(f"--preset/--config: the run in {str(path)!r} has another model "
                             f"({neutral.config_differences(wanted, config)}); drop the option to resume")


def _new_config(args) -> TransformerConfig:
    """The model of a new run: ``--config``, ``--preset`` or the task's default, checked to be
    buildable on this machine."""
    config = tasks.task_config(args.task, args.preset, args.config)
    neutral.check_buildable(config, "train", f"--config {args.config!r}" if args.config
                            else f"--preset {args.preset or 'the ' + args.task + ' default'}")
    return config


def _check_batch_fits(args, config: TransformerConfig, batch: int) -> None:
    """Refuse, before any batch is drawn, a global batch whose training step cannot fit this
    machine's memory (`shared.memory.training_floor`; data-parallel workers share the machine):
    ``--batch 3000000`` ended in the framework's allocator error."""
    spec = tasks.spec(args.task)
    what = f"--batch {batch}" if args.batch is not None else f"the run's batch of {batch}"
    check_training_batch(config, batch, spec.shortest_source, spec.target_len + 1, what)


def _check_before_launch(args, log: dict | None) -> None:
    """The launcher's refusals, from the command line and the resumed run's log (the workers load
    the checkpoint and check it again): one message, before any worker starts, instead of one from
    every worker."""
    path = Path(args.checkpoint)
    if log is None:
        config = _new_config(args)
    else:
        _check_resume(args, path, log)
        try:
            config = neutral.read_config_file(path / neutral.CONFIG_FILE)
        except (OSError, ValueError):
            return  # refused by the workers, which read the whole checkpoint
        check_run_agrees(path, log, config)
        _check_same_model(args, path, config)
    _check_batch_fits(args, config, _run_batch(args, log))


def _check_writable(path: Path) -> None:
    """Fail now, not after training, when the run directory cannot be written (a read-only folder,
    a path under a file): the save at the end stages a sibling of ``path`` exactly like this."""
    import tempfile
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=temporary_name(path), suffix=".probe", dir=path.parent))
    except OSError as err:
        raise naming(err, path) from err


def run(args) -> int:
    started = time.perf_counter()
    _check_args(args)
    if parallel.must_launch(args):  # torch --workers N: this process starts N workers running this
        return parallel.launch(args)
    workers = args.workers
    if workers is None and args.backend == "torch" and parallel.in_torchrun():
        workers = int(os.environ["WORLD_SIZE"])  # started by hand: torchrun ... -m twins train
    signals = _Signals()  # installed when the steps begin; removed when this process is done
    try:
        if workers is None:
            return _train(args, started, None, 0, 1, signals)
        engine = parallel.distributed(args.backend, args.threads)
        rank, workers = engine.init_workers(workers, args.timeout)
        try:
            return _train(args, started, engine, rank, workers, signals)
        finally:
            engine.close()  # still held: torchrun's agent passes a signal on once more
    finally:
        signals.restore()


def _prepare(args, path: Path, engine, rank: int, workers: int):
    """`_start_or_resume` on every worker, after rank 0 alone has repaired an interrupted save and
    probed the folder; then the workers agree, or all fail (`twins.parallel`)."""
    if engine is None:
        prepared = _start_or_resume(args, path)
        _check_writable(path)
        return prepared
    try:
        if rank == 0:
            recover(path)
            _check_writable(path)
        ready = {"ready": True}
    except Exception as err:  # noqa: BLE001  (every worker must hear of it)
        ready = err
    engine.agree(ready)
    try:
        prepared = _start_or_resume(args, path)
        config, log = prepared[0], prepared[3]
        check_workers(log["settings"]["batch"], workers)
        description = parallel.describe(args, config, log, workers)
    except Exception as err:  # noqa: BLE001
        description = err
    engine.agree(description)
    return prepared


def _train(args, started: float, engine, rank: int, workers: int, signals: "_Signals") -> int:
    """The training run of one process; ``engine``: the backend's ``distributed`` module (None: one
    process, no engine); rank 0 alone evaluates, prints and saves; ``signals``: installed here,
    before the first step (`_Signals`)."""
    lead = rank == 0
    path = Path(args.checkpoint)
    config, weights, moments, log = _prepare(args, path, engine, rank, workers)
    spec = tasks.spec(args.task)
    s = log["settings"]
    s.setdefault("precision", "float32")  # a run from before --precision
    try:  # named as the user wrote it, or as the resumed run's log says it (an older run's: bf16)
        s["precision"] = check_precision(s["precision"], config.dtype)
    except ValueError as err:
        raise ValueError(f"--precision {s['precision']}: {str(err).removeprefix('precision: ')}") from None
    try:  # the schedule's own checks (a peak rate float32 holds), before a model is built
        noam_lr(1, config.d_model, s["warmup"], s["factor"])
    except ValueError as err:
        raise ValueError(f"--factor {s['factor']} with --warmup {s['warmup']} and d_model "
                         f"{config.d_model}: {str(err).removeprefix('noam_lr: ')}") from None
    eval_every = spec.eval_every if args.eval_every is None else args.eval_every
    n_heldout = spec.heldout if args.heldout is None else args.heldout
    first = log["step"] + 1
    last = log["step"] + args.steps

    # Dropout differs between workers (each its own stream), as in any data-parallel run.
    with arguments.flags("device"):
        backend = make_adapter(args.backend, config, weights, seed=log["seed"] + log["step"] + 1_000_003 * rank,
                               threads=args.threads, workers=None if engine is None else workers,
                               device=args.device)
    backend.set_precision(s["precision"])  # before the first (TF: traced) step
    backend.make_optimizer(s["warmup"], s["factor"], log["step"], moments)
    data = tasks.TrainingData(args.task, log["seed"], s["batch"], config.start_id)
    examples = tasks.heldout(args.task, n_heldout)
    resumed = f"resuming at step {log['step']}, " if log["step"] else ""
    adam = "" if not log["step"] else ("Adam's moments restored; " if moments is not None
                                       else "Adam's moments restart from zero; ")
    on = (f"{args.backend}" + (f" x {workers} workers" if engine is not None else "")
          + (f" ({args.device})" if args.device != DEFAULT_DEVICE else ""))
    if lead:
        print(f"twins train: {args.task} on {on}, {resumed}{adam}steps {first}..{last}; "
              f"d_model={config.d_model} heads={config.n_heads} d_ff={config.d_ff} layers="
              f"{config.n_encoder_layers}+{config.n_decoder_layers} dropout={config.dropout} "
              f"({neutral.parameter_count(config):,} parameters); batch={s['batch']} warmup="
              f"{s['warmup']} factor={s['factor']} smoothing={s['smoothing']} precision={s['precision']} "
              f"seed={log['seed']}",
              flush=True)

    from tqdm import tqdm

    from .quiet import stderr_is_terminal
    # on a terminal only; asked of what stderr was before twins.quiet piped it (tqdm's own test,
    # disable=None, would see the pipe and never draw)
    bar = tqdm(total=args.steps, desc=f"{args.task}/{args.backend}", unit="step", dynamic_ncols=True,
               disable=args.no_progress or not lead or not stderr_is_terminal(), file=sys.stderr,
               leave=False)
    history = log["history"]
    segment = {"backend": args.backend, "first_step": first, "last_step": first - 1,
               "settings": dict(s), "threads": args.threads, "workers": workers, "device": args.device,
               "seconds": 0.0}
    log["segments"].append(segment)
    train_start = time.perf_counter()
    step, status, loss = log["step"], 0, float("nan")
    evaluating, in_step, counted, failure = False, False, None, None

    def do_eval() -> float:
        nonlocal evaluating
        evaluating = True
        with signals.interruptible():  # an evaluation is long: a signal stops it at once
            t0 = time.perf_counter()
            _, ok = evaluate(backend, args.task, examples)
            accuracy = float(ok.mean())
            log["evals"].append({"step": step, "backend": args.backend, "accuracy": accuracy,
                                 "correct": int(ok.sum()), "n": int(ok.size),
                                 "seconds": round(time.perf_counter() - train_start, 3),
                                 "eval_seconds": round(time.perf_counter() - t0, 3)})
            bar.write(f"step {step}: loss {loss:.4f}, held-out exact match {int(ok.sum())}/{ok.size} "
                      f"= {accuracy:.1%} ({time.perf_counter() - train_start:.1f} s)", file=sys.stdout)
            sys.stdout.flush()
        evaluating = False
        return accuracy

    signals.install()  # SIGINT and SIGTERM from here on: saved (the class says when)
    try:
        accuracy = None
        while step < last:
            signals.check(engine)  # a signal to any worker, held through the last step: stop here
            batch = data.batch(step + 1)
            in_step = True
            if engine is not None:
                counted = _adam_steps(backend)
            loss, lr = backend.train_step(batch, s["smoothing"])
            step += 1
            if not np.isfinite(loss):
                raise ValueError(f"the loss became {loss} at step {step}; try a smaller --factor")
            history["step"].append(step)
            history["loss"].append(round(loss, 6))
            history["lr"].append(lr)
            in_step = False
            bar.update(1)
            if step % 10 == 0 or step == last:
                bar.set_postfix(loss=f"{loss:.4f}", lr=f"{lr:.2e}", refresh=False)
            accuracy = None
            if eval_every and step % eval_every == 0 and step != last:
                accuracy = do_eval() if lead else 0.0
                stop = lead and args.stop_at is not None and accuracy >= args.stop_at
                if engine is not None and args.stop_at is not None:
                    stop = engine.broadcast(float(stop)) > 0  # rank 0 decided; every worker stops
                if stop:
                    if lead:
                        bar.write(f"stopping: {accuracy:.1%} >= --stop-at {args.stop_at:.1%}",
                                  file=sys.stdout)
                    break
        if accuracy is None and lead:
            accuracy = do_eval()
    except KeyboardInterrupt as err:
        status = 128 + err.signum if isinstance(err, Interrupted) else 130
        if lead:
            bar.write(f"interrupted at step {step}: saving the run", file=sys.stderr)
    except Exception as err:  # noqa: BLE001  (re-raised unless the steps can be kept)
        if engine is not None and signals.received is not None and (
                not lead or not in_step or (counted is not None and _adam_steps(backend) == counted)):
            # Data-parallel, signalled: a worker that stopped at the end of step K while
            # another had begun step K + 1 leaves that one's collective failing; the update
            # of K + 1 never ran (Adam's count says so), and step K is what every worker has.
            status = 128 + signals.received
            if lead:
                bar.write(f"interrupted at step {step}: saving the run", file=sys.stderr)
        elif evaluating and not in_step:  # the steps trained are kept: saved, then the error
            failure = err
            if not pipes.caused_by_closed_stdout(err):
                bar.write(f"stopped at step {step} while evaluating: saving the run", file=sys.stderr)
        else:
            raise
    finally:
        bar.close()
    segment["last_step"] = step
    segment["seconds"] = round(time.perf_counter() - train_start, 3)
    segment["wall_seconds"] = round(time.perf_counter() - started, 3)
    log["step"] = step
    log["config"] = config.to_dict()
    if log["evals"] and log["evals"][-1]["step"] == step:
        log["final"] = log["evals"][-1]
    if not lead:  # rank 0 writes the run: the weights are the same on every worker
        return status
    save_run(path, config, backend.export_weights(), backend.export_moments(), log)
    if failure is not None:
        raise failure
    final = log.get("final")
    done = (f"final held-out exact match {final['correct']}/{final['n']} = {final['accuracy']:.1%}; "
            if final and final["step"] == step else "")
    print(f"twins train: step {step}, {done}training {segment['seconds']:.1f} s, total "
          f"{time.perf_counter() - started:.1f} s; saved {path}", flush=True)
    return status


# -- signals --------------------------------------------------------------------------------------
class Interrupted(KeyboardInterrupt):
    """The signal (``signum``: SIGINT or SIGTERM) that stopped a run; its exit status is
    ``128 + signum`` (130, 143), as a shell reports a process that the signal ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Signals:
    """SIGINT (Ctrl-C) and SIGTERM (``timeout``, ``kill``, a batch scheduler; torchrun's agent
    passes either on to its workers) while a run trains and saves: both stop the run, which is
    saved at the last step counted (SIGTERM's default, death, lost every step of the invocation).

    A signal is held, and acted on when the step in flight has run and been counted (the update,
    ``step += 1``, its history: `check`, before the next step), or at once while the run evaluates
    (`interruptible`): never between an update and its count. (A TF step interrupted as its
    tf.function returned was saved with the weights and moments of step K + 1 under the count K;
    the resume replayed batch K + 1.) After the first signal every later one is held too, so the
    save runs to its end (a worker signalled directly hears it again from torchrun's agent).
    Installed in the main thread only (the one Python delivers signals to) when the steps begin;
    `restore` puts the previous handlers back."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self):
        self.received: int | None = None  # the first signal's number
        self._open = False
        self._previous: dict = {}

    def install(self) -> None:
        if threading.current_thread() is threading.main_thread() and not self._previous:
            for number in self.SIGNALS:
                self._previous[number] = signal.signal(number, self._handle)

    def restore(self) -> None:
        """The handlers from before `install` (a signal still held is dropped: the run is saved)."""
        defaults = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
        for number, handler in self._previous.items():
            signal.signal(number, defaults[number] if handler is None else handler)
        self._previous = {}

    def _handle(self, number: int, frame) -> None:
        if self.received is None:
            self.received = number
            if self._open:
                self._open = False
                raise Interrupted(number)

    def check(self, engine=None) -> None:
        """Raise `Interrupted` if a signal came: to this process, or, data-parallel (``engine``, the
        backend's ``distributed`` module), to any worker. The workers ask each other before every
        step, so all stop after the same step and rank 0 saves it: a signal to one worker alone
        (a ``kill`` of its pid) stopped that one, and the others failed in the next step's
        collective, every step of the invocation lost."""
        received = self.received or 0
        if engine is not None:
            received = engine.largest(received)  # SIGTERM (15) over SIGINT (2) if both came
        if received:
            raise Interrupted(received)

    @contextlib.contextmanager
    def interruptible(self):
        """Within the block a signal raises `Interrupted` at once (as it does if one came before)."""
        self._open = True
        try:
            self.check()
            yield
        finally:
            self._open = False


def _adam_steps(backend) -> int | None:
    """Adam's own count of its updates (Keras' ``iterations``, the ``step`` of torch's state; 0
    before the first), or None where it cannot be read."""
    optimizer = backend.optimizer
    try:
        if hasattr(optimizer, "iterations"):
            return int(optimizer.iterations.numpy())
        state = next(iter(optimizer.state.values()), {})
        return int(float(state["step"])) if "step" in state else 0
    except Exception:  # noqa: BLE001  (then the steps are not kept: the error is raised)
        return None
