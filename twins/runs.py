"""A `twins train` run directory: a neutral checkpoint (``config.json``, ``model.safetensors``) and

    optimizer.safetensors   Adam's moments by canonical weight name (m.<name>, v.<name>), the step
    train_log.json          task, seed, settings, losses, evaluations, one entry per invocation

read by ``twins train`` (to resume), ``twins decode`` and ``twins figures``, written crash-safely
by `save_run` (`shared.saving.replace_directory`).
"""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np

from shared import TransformerConfig
from shared import weights as neutral
from shared.paths import read_json
from shared.saving import replace_directory, umask

from .backends import moment_names

LOG_FILE = "train_log.json"
OPTIMIZER_FILE = "optimizer.safetensors"
LOG_FORMAT = "twins-train-log"
LOG_VERSION = 1


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
    if log.get("version") != LOG_VERSION:
        raise ValueError(f"{str(file)!r}: unknown version {log.get('version')!r}, this reads {LOG_VERSION}")
    return log


def read_moments(path: Path, config: TransformerConfig) -> dict[str, np.ndarray] | None:
    """Adam's moments of a run, checked against the config; None (with a note) when absent or unfit."""
    file = path / OPTIMIZER_FILE
    if not file.is_file():
        return None
    from safetensors.numpy import load_file
    try:
        moments = load_file(str(file))
    except Exception as err:  # noqa: BLE001  (safetensors raises several kinds)
        print(f"note: {file} unreadable ({err}); Adam's moments restart from zero", file=sys.stderr)
        return None
    schema = neutral.weight_schema(config)
    expected = {f"{k}.{n}": shape for k in ("m", "v") for n, shape in schema.items()}
    if set(moments) != set(expected) or any(tuple(moments[n].shape) != s for n, s in expected.items()):
        print(f"note: {file} does not fit the model; Adam's moments restart from zero", file=sys.stderr)
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

    replace_directory(path, fill)
