"""A `twins train` run directory: a neutral checkpoint (``config.json``, ``model.safetensors``) and

    optimizer.safetensors   Adam's moments by canonical weight name (m.<name>, v.<name>), the step
    train_log.json          task, seed, settings, losses, evaluations, one entry per invocation

read by ``twins train`` (to resume), ``twins decode`` and ``twins figures``, written crash-safely
by `save_run` (`shared.saving.replace_directory`).
"""
from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np

from shared import TransformerConfig
from shared import weights as neutral
from shared.moments import moment_names, moment_problems
from shared.paths import read_json
from shared.precision import ALIASES
from shared.saving import replace_directory, umask

from .arguments import SEED_MAX

LOG_FILE = "train_log.json"
OPTIMIZER_FILE = "optimizer.safetensors"
LOG_FORMAT = "twins-train-log"
LOG_VERSION = 1
# The precisions a run trains in (`shared.precision`'s names; a log from before the canonical names
# says fp32 or bf16). Not float16: its training needs loss scaling, which twins train does not do.
TRAIN_PRECISIONS = ("float32", "bfloat16")
NO_FLOAT16 = ("float16 training needs loss scaling, which twins train does not do; train in "
              "bfloat16 and decode in float16")


def read_log(path: str | os.PathLike) -> dict | None:
    """The train log of a run directory, or None when it has none."""
    file = Path(path) / LOG_FILE
    return read_log_file(file) if file.is_file() else None


def read_log_file(file: str | os.PathLike) -> dict:
    """A train_log.json, checked to be one."""
    file = Path(file)
    log = read_json(file)  # a ValueError naming the file: not UTF-8, not JSON, not a file
    if not isinstance(log, dict) or log.get("format") != LOG_FORMAT:
        raise ValueError(f"{str(file)!r}: not a twins train log (expected format {LOG_FORMAT!r})")
    if not _int(log.get("version")) or log["version"] != LOG_VERSION:  # true == 1: refused
        raise ValueError(f"{str(file)!r}: unknown version {log.get('version')!r}, this reads {LOG_VERSION}")
    problems = log_problems(log)
    if problems:  # before a resumed run trains (a bad field used to fail after its steps) or a figure
        raise ValueError(f"{str(file)!r}: not a usable train log: {'; '.join(problems)}")
    return log


def _int(value, low: int = 0, high: int | None = None) -> bool:
    return (isinstance(value, int) and not isinstance(value, bool) and value >= low
            and (high is None or value <= high))


def _real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def log_problems(log: dict) -> list[str]:
    """What `twins train` and `twins figures` read of a log, each field of the type they use:
    ``"settings.batch: expected an int >= 1, got 'abc'"``, one line a field."""
    problems = []

    def need(where: str, ok: bool, expected: str, value) -> bool:
        if not ok:
            problems.append(f"{where}: expected {expected}, got {value!r}"[:200])
        return ok

    kinds = {"task": str, "seed": int, "step": int, "settings": dict, "config": dict, "segments": list,
             "history": dict, "evals": list}
    for key, kind in kinds.items():
        if key not in log:
            problems.append(f"{key}: missing")
        else:
            need(key, isinstance(log[key], kind) and not isinstance(log[key], bool),
                 f"a JSON {kind.__name__}", log[key])
    if problems:
        return problems
    need("seed", _int(log["seed"], 0, SEED_MAX), f"an int in [0, {SEED_MAX}]", log["seed"])
    # the step bounded as the seed is: a run seeds its dropout with seed + step (+ the rank's share)
    need("step", _int(log["step"], 0, SEED_MAX), f"an int in [0, {SEED_MAX}]", log["step"])
    s = log["settings"]
    for key in ("batch", "warmup"):
        need(f"settings.{key}", _int(s.get(key), 1), "an int >= 1", s.get(key))
    need("settings.factor", _real(s.get("factor")) and s.get("factor") > 0, "a positive number",
         s.get("factor"))
    need("settings.smoothing", _real(s.get("smoothing")) and 0 <= s.get("smoothing") < 1,
         "a number in [0, 1)", s.get("smoothing"))
    if "precision" in s:  # absent: a run from before --precision, float32
        need("settings.precision", isinstance(s["precision"], str)
             and ALIASES.get(s["precision"]) in TRAIN_PRECISIONS,
             f"one of {', '.join(TRAIN_PRECISIONS)}", s["precision"])
    h = log["history"]
    columns = {key: h.get(key) for key in ("step", "loss", "lr")}
    if all(need(f"history.{k}", isinstance(v, list), "a list", v) for k, v in columns.items()):
        need("history", len({len(v) for v in columns.values()}) == 1, "step, loss and lr of one length",
             {k: len(v) for k, v in columns.items()})
        need("history.step", all(_int(x, 1) for x in columns["step"]), "ints >= 1", columns["step"])
        for key in ("loss", "lr"):
            need(f"history.{key}", all(_real(x) for x in columns[key]), "finite numbers", columns[key])
    for i, e in enumerate(log["evals"]):
        need(f"evals[{i}]", isinstance(e, dict) and _int(e.get("step")) and isinstance(e.get("backend"), str)
             and _real(e.get("accuracy")), "an object with step, backend and accuracy", e)
    for i, g in enumerate(log["segments"]):
        need(f"segments[{i}]", isinstance(g, dict) and isinstance(g.get("backend"), str),
             "an object with a backend", g)
    # where present, as `twins figures` draws them
    for i, g in enumerate(log["segments"]):
        if isinstance(g, dict) and "seconds" in g:
            need(f"segments[{i}].seconds", _real(g["seconds"]) and g["seconds"] >= 0,
                 "a finite number >= 0", g["seconds"])
    for i, e in enumerate(log["evals"]):
        if isinstance(e, dict) and "n" in e:
            need(f"evals[{i}].n", _int(e["n"]), "an int >= 0", e["n"])
    return problems


def check_run_agrees(path: Path, log: dict, config: TransformerConfig) -> None:
    """Refuse a run to resume whose files disagree, one of them changed since the run saved them:
    the log's config against ``config.json``'s (``config``), the log's step against the last step
    of its last segment. Resumed, such a run would train another model than the one its log
    describes, or repeat or skip steps of its data stream and its learning-rate schedule.

    Raises:
        ValueError: naming the log, every disagreement, and both values of each.
    """
    problems = []
    try:
        logged = TransformerConfig.from_dict(log["config"])
    except (TypeError, ValueError) as err:
        problems.append(f"its config is not a model's ({err})"[:300])
    else:
        if logged != config:
            problems.append(f"its config is not {neutral.CONFIG_FILE}'s ({neutral.config_differences(logged, config)}; "
                            f"the log's vs {neutral.CONFIG_FILE}'s)")
    last = log["segments"][-1].get("last_step", log["step"]) if log["segments"] else log["step"]
    if isinstance(last, bool) or last != log["step"]:
        problems.append(f"its step is {log['step']!r}, but its last segment ended at step {last!r}")
    if problems:
        raise ValueError(f"{str(Path(path) / LOG_FILE)!r}: disagrees with the run it logs: {'; '.join(problems)}; "
                         "a file of the run was changed since it was saved")


def read_moments(path: Path, config: TransformerConfig, step: int | None = None) -> dict[str, np.ndarray] | None:
    """Adam's moments of a run, checked against the config and (``step``: the log's) the step they
    were saved at; None (with a note) when absent or unfit."""
    file = path / OPTIMIZER_FILE
    if not file.is_file():
        return None
    from safetensors import safe_open
    try:
        with safe_open(str(file), "numpy") as handle:  # the file read once: its tensors and its step
            saved_at = (handle.metadata() or {}).get("step")
            moments = {name: handle.get_tensor(name) for name in handle.keys()}
    except Exception as err:  # noqa: BLE001  (safetensors raises several kinds)
        print(f"note: {file} unreadable ({err}); Adam's moments restart from zero", file=sys.stderr)
        return None
    if step is not None and saved_at is not None and saved_at != str(step):  # absent: written elsewhere
        print(f"note: {file} was saved at step {saved_at[:40]!r}, the run's log is at step {step}; Adam's "
              "moments restart from zero", file=sys.stderr)
        return None
    # the checks of import_moments: a NaN or a negative second moment would poison the first step,
    # and the loss, not the file, would be blamed
    problems = moment_problems(config, moments)
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        print(f"note: {file} does not fit the model: {problems[0]}{more}; Adam's moments restart "
              "from zero", file=sys.stderr)
        return None
    return moments


def save_run(path: Path, config: TransformerConfig, weights: dict, moments: dict, log: dict) -> None:
    """Write the run directory crash-safely (`shared.saving.replace_directory`): staged in a
    temporary sibling, then swapped with ``path``, which holds the complete old run or the complete
    new one at every instant; an interrupted save is repaired when the run is next read."""
    from safetensors.numpy import save_file
    weights = neutral.check_weights(config, weights, source="save_run: weights")

    def fill(new: Path) -> None:
        neutral.write_checkpoint_files(new, config, weights)
        save_file({n: np.ascontiguousarray(moments[n]) for n in moment_names(config)},
                  str(new / OPTIMIZER_FILE), metadata={"step": str(log["step"])})
        os.chmod(new / OPTIMIZER_FILE, 0o666 & ~umask())  # safetensors writes 0600 files
        with open(new / LOG_FILE, "w", encoding="utf-8") as f:
            json.dump(log, f, indent=1)
            f.write("\n")

    # The run's own files; anything else in the directory (notes, figures) is the user's and kept.
    replace_directory(path, fill, owned=(neutral.CONFIG_FILE, neutral.WEIGHTS_FILE, OPTIMIZER_FILE, LOG_FILE))
