"""Issue 15, class 1: a save that replaces a directory never loses the previous one.

The failing case, before: `shared.weights.save_checkpoint` (and `twins train`'s run directory)
swapped the new directory in with two renames, ``path -> .path.XXX.old/ckpt`` then ``staging ->
path``. A crash between them left nothing at ``path`` (the old checkpoint hidden in a dot folder):
`load_checkpoint` said "no checkpoint", and `twins train` resuming such a run silently started
again at step 1. Leftover temporary folders stayed forever.

The fix (`shared.saving`, docs/design.md "Saving and recovery"): the staged directory is exchanged
with ``path`` atomically (``renameat2(RENAME_EXCHANGE)``), or, where that is unavailable, swapped
under a marker that the next load uses to finish the swap; dead temporaries are removed. Shown here
with real SIGKILLs (``TWINS_FAULT_AT``) at every step of the save, in both protocols.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from shared import TransformerConfig
from shared import saving
from shared.weights import init_weights, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[1]
CONFIG = TransformerConfig.preset("tiny", n_encoder_layers=1, n_decoder_layers=1)

# A process that saves checkpoint `new` (seed 2) over whatever is at argv[1].
SAVER = """
import sys
from shared import TransformerConfig
from shared.weights import init_weights, save_checkpoint
config = TransformerConfig.preset("tiny", n_encoder_layers=1, n_decoder_layers=1)
save_checkpoint(sys.argv[1], config, init_weights(config, seed=2))
"""

# (protocol, step) -> which checkpoint a later load must find: before the swap the old one, from
# the swap on the new one (the marker protocol rolls forward once the old one has moved away).
EXCHANGE = {"config-written": "old", "staging": "old", "staged": "old", "swapped": "new",
            "cleaned": "new"}
MARKER = {"config-written": "old", "staging": "old", "staged": "old", "marked": "old",
          "moved-old": "new", "swapped": "new", "cleaned": "new"}


def _env(**extra) -> dict:
    env = importable.project_environ(ROOT, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TWINS_FAULT_AT", None)
    env.pop("TWINS_NO_EXCHANGE", None)
    env.update(extra)
    return env


def _killed_save(path: Path, step: str, exchange: bool) -> None:
    env = _env(TWINS_FAULT_AT=step, **({} if exchange else {"TWINS_NO_EXCHANGE": "1"}))
    proc = subprocess.run([sys.executable, "-c", SAVER, str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == -9, (step, proc.returncode, proc.stderr)  # it really was SIGKILLed


def _which(weights: dict) -> str:
    for label, seed in (("old", 1), ("new", 2)):
        expected = init_weights(CONFIG, seed=seed)
        if all(np.array_equal(weights[n], expected[n]) for n in expected):
            return label
    return "neither"


def _temporaries(path: Path) -> list[str]:
    return sorted(n for n in os.listdir(path.parent) if n.startswith(f".{path.name}."))


@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "marker"])
def test_a_save_killed_at_any_step_keeps_the_old_or_the_new_checkpoint(tmp_path, exchange):
    table = EXCHANGE if exchange else MARKER
    for step, expected in table.items():
        path = tmp_path / step / "ckpt"
        save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=1))
        _killed_save(path, step, exchange)
        if exchange:  # the path is never absent with the exchange, not even before recovery
            assert path.is_dir(), step
        config, weights = load_checkpoint(path)  # recovers an interrupted swap first
        assert config == CONFIG
        assert _which(weights) == expected, step
        assert _temporaries(path) == [], step  # the dead process's temporaries are gone
        save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=1))  # and saving works again
        assert _which(load_checkpoint(path)[1]) == "old"


def test_a_first_save_killed_leaves_no_checkpoint_and_no_debris(tmp_path):
    path = tmp_path / "ckpt"
    _killed_save(path, "staged", exchange=True)
    assert not path.exists() and _temporaries(path)  # the dead process's staging folder...
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(path)
    assert _temporaries(path) == []  # ...is removed by the next look at the path


def test_an_unrepairable_interrupted_save_names_where_the_data_is(tmp_path, monkeypatch):
    """The marker protocol killed between its renames, then the repair itself fails (as in a
    read-only folder): the load refuses and says where the complete copy is."""
    path = tmp_path / "ckpt"
    save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=1))
    _killed_save(path, "moved-old", exchange=False)
    assert not path.exists()

    def refuse(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(args[0]))
    monkeypatch.setattr(saving.os, "rename", refuse)
    with pytest.raises(saving.InterruptedSave, match=r"its data is in \[.*\.new.*\]") as err:
        load_checkpoint(path)
    assert str(path) in str(err.value)
    monkeypatch.undo()
    assert _which(load_checkpoint(path)[1]) == "new"


@pytest.mark.parametrize("step", ["marked", "moved-old", "swapped"])
def test_an_exception_between_the_renames_loses_nothing(tmp_path, monkeypatch, step):
    """The marker protocol stopped by an exception, not a kill (the second rename or its fsync
    failing, Ctrl-C): before the second rename the old checkpoint is put back, after it the new
    one stays; no temporary is left. Before, an exception after the first rename removed both
    copies: the path was gone, and the marker named two folders that no longer existed."""
    path = tmp_path / "ckpt"
    save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=1))

    def stop(at):
        if at == step:
            raise KeyboardInterrupt
    monkeypatch.setenv("TWINS_NO_EXCHANGE", "1")
    monkeypatch.setattr(saving, "fault_point", stop)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=2))
    monkeypatch.undo()
    assert _which(load_checkpoint(path)[1]) == ("new" if step == "swapped" else "old")
    assert _temporaries(path) == []


def test_a_live_process_staging_folder_is_never_removed(tmp_path):
    path = tmp_path / "ckpt"
    live = tmp_path / f".ckpt.twins-{os.getpid()}-abc.new"
    live.mkdir()
    saving.recover(path)
    assert live.is_dir()


@pytest.mark.parametrize("name", ["c" * 250, "\u00e9" * 127 + "c"], ids=["ascii", "two-byte"])
@pytest.mark.parametrize("exchange", [True, False], ids=["exchange", "marker"])
def test_a_name_near_the_file_systems_limit_saves_and_recovers(tmp_path, monkeypatch, name, exchange):
    """A destination of 250 or 255 bytes is valid, and so must be its temporary siblings: their
    ``.NAME.twins-PID-...`` would pass the 255-byte limit, so a long NAME is cut and hashed there
    (a first save of such a checkpoint used to fail as an "interrupted save ... in no surviving
    copy"). Two names alike in their first 160 bytes keep apart: one's dead temporaries are
    removed, the other's untouched."""
    if not exchange:
        monkeypatch.setenv("TWINS_NO_EXCHANGE", "1")
    path, twin = tmp_path / name, tmp_path / (name[:-1] + "d")
    for seed in (1, 2):  # a first save, then one over it (the exchange or the marker's renames)
        save_checkpoint(path, CONFIG, init_weights(CONFIG, seed=seed))
        assert _which(load_checkpoint(path)[1]) == ("old" if seed == 1 else "new")
    saving.write_atomically(tmp_path / (name[:-1] + "f"), lambda tmp: Path(tmp).write_text("x"))
    assert (tmp_path / (name[:-1] + "f")).read_text() == "x"
    dead = [tmp_path / f"{saving._hidden(p)}999999999-x.new" for p in (path, twin)]  # no such PID
    for d in dead:
        d.mkdir()
    assert len({d.name for d in dead}) == 2 and all(len(os.fsencode(d.name)) <= 255 for d in dead)
    saving.recover(path)
    assert not dead[0].exists() and dead[1].is_dir()
    assert sorted(os.listdir(tmp_path)) == sorted([dead[1].name, path.name, name[:-1] + "f"])


# -- twins train: a killed save never restarts the run ------------------------------------------
# Each case kills one real `python -m twins train` process at a real step of its save, and that is
# the only fresh interpreter it starts: one costs 2 to 3 s of CPU, nearly all of it importing torch
# and torch._dynamo (which torch.optim loads for its first optimizer), against 0.1 s of training.
# The run it continues (2 steps, saved) is trained once for the module and copied into each case;
# the resume after the kill runs in this process through `twins.cli.main`, the code `python -m
# twins` runs (docs/design.md, "Tests": SIGKILLs in subprocesses, the rest in-process).
def _args(run: Path, steps: int) -> list[str]:
    """`twins train` on the copy task for ``steps`` steps, saving to (or resuming) ``run``."""
    return ["train", "--task", "copy", "--backend", "torch", "--steps", str(steps), "--checkpoint",
            str(run), "--batch", "8", "--heldout", "2", "--eval-every", "0", "--no-progress"]


def _train(run: Path, steps: int, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twins", *_args(run, steps)], env=_env(**env),
                          cwd=ROOT, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory) -> Path:
    """A `twins train` run directory saved at step 2, for each case to copy."""
    from twins.cli import main
    run = tmp_path_factory.mktemp("trained") / "run"
    assert main(_args(run, 2)) == 0
    assert json.loads((run / "train_log.json").read_text())["step"] == 2
    return run


@pytest.mark.torch
@pytest.mark.parametrize("step, protocol, resumed_at", [
    ("staged", "exchange", 2), ("swapped", "exchange", 4), ("moved-old", "marker", 4)])
def test_twins_train_killed_while_saving_resumes_from_the_right_step(tmp_path, trained_run, capsys,
                                                                     step, protocol, resumed_at):
    from twins.cli import main
    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    extra = {"TWINS_FAULT_AT": step, **({"TWINS_NO_EXCHANGE": "1"} if protocol == "marker" else {})}
    killed = _train(run, 2, **extra)
    assert killed.returncode == -9, killed.stderr
    assert "resuming at step 2, " in killed.stdout and "steps 3..4;" in killed.stdout  # it trained
    capsys.readouterr()
    assert main(_args(run, 1)) == 0  # the resume
    resumed = capsys.readouterr()
    assert f"resuming at step {resumed_at}," in resumed.out, resumed.err
    log = json.loads((run / "train_log.json").read_text())
    assert log["step"] == resumed_at + 1 and log["history"]["step"][-1] == resumed_at + 1
    assert _temporaries(run) == []
