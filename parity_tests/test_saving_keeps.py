"""What a directory save keeps of the directory it replaces (`shared.saving.replace_directory`).

A resumed training run used to come back holding its four files alone: a user's notes and a
folder of figures written into the run directory were deleted without a word, a private run
(``chmod 700``) came back readable by everyone, and a directory made read-only was replaced all
the same, its old copy then left behind as a hidden sibling no clean-up could remove. NumPy only.
"""
from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from shared import TransformerConfig
from shared.moments import moment_names
from shared.saving import replace_directory, write_all_atomically
from shared.weights import CONFIG_FILE, WEIGHTS_FILE, init_weights

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX permissions and hard links")
ROOT = Path(__file__).resolve().parents[1]


def _fill(names):
    def fill(staging):
        for name in names:
            (staging / name).write_text("new " + name)
    return fill


def _siblings(path):
    return sorted(p for p in os.listdir(path.parent) if p != path.name)


def _mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_owned_names_are_replaced_and_everything_else_is_carried(tmp_path):
    run = tmp_path / "run"
    (run / "figs" / "deep").mkdir(parents=True)
    (run / "a.txt").write_text("old a")
    (run / "NOTES.txt").write_text("mine")
    (run / "figs" / "deep" / "plot.png").write_bytes(b"\x89PNG")
    os.symlink("NOTES.txt", run / "link")
    replace_directory(run, _fill(["a.txt", "b.txt"]), owned=("a.txt", "b.txt", "c.txt"))
    assert sorted(os.listdir(run)) == ["NOTES.txt", "a.txt", "b.txt", "figs", "link"]
    assert (run / "a.txt").read_text() == "new a.txt"
    assert (run / "NOTES.txt").read_text() == "mine"
    assert (run / "figs" / "deep" / "plot.png").read_bytes() == b"\x89PNG"
    assert os.readlink(run / "link") == "NOTES.txt"
    assert _siblings(run) == []  # no staging or old copy left


def test_without_owned_the_new_directory_holds_what_fill_wrote(tmp_path):
    export = tmp_path / "export"
    export.mkdir()
    (export / "stale.data").write_text("of an older export")
    replace_directory(export, _fill(["graph.onnx"]))
    assert os.listdir(export) == ["graph.onnx"]


def test_the_owner_s_permissions_are_kept(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.txt").write_text("old")
    os.chmod(run / "a.txt", 0o600)
    os.chmod(run, 0o700)
    replace_directory(run, _fill(["a.txt", "b.txt"]))
    assert (_mode(run), _mode(run / "a.txt")) == (0o700, 0o600)
    assert _mode(run / "b.txt") == 0o666 & ~_umask()  # a new file: the umask's


def _umask():
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_read_only_directory_is_refused_and_left_as_it_was(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "a.txt").write_text("old")
    os.chmod(run, 0o555)
    try:
        with pytest.raises(PermissionError, match="the directory is read-only"):
            replace_directory(run, _fill(["a.txt"]))
        assert (run / "a.txt").read_text() == "old" and _siblings(run) == []
    finally:
        os.chmod(run, 0o755)


def test_a_failed_save_removes_the_folders_it_made_and_only_those(tmp_path, monkeypatch):
    """The parents of a new path are made before the files are written; a save that then fails
    (its ``fill``, a writer's error) left them behind, empty. They are removed, deepest first,
    where empty; a folder that existed before, or that now holds something, stays. A save to
    ``new/../X`` (``X``) leaves no ``new/`` either."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "kept").mkdir()

    def fail(staging):
        raise RuntimeError("the writer failed")
    for target in ("new1/new2/out", "kept/new/out"):
        with pytest.raises(RuntimeError, match="the writer failed"):
            replace_directory(target, fail)
    with pytest.raises(RuntimeError, match="the writer failed"):
        write_all_atomically([("new3/a.txt", lambda tmp: Path(tmp).write_text("a")),
                              ("new4/deep/b.txt", fail)])
    assert sorted(os.listdir(tmp_path)) == ["kept"] and os.listdir(tmp_path / "kept") == []
    replace_directory("newparent/../X", _fill(["a.txt"]))
    write_all_atomically([("newer/../y.txt", lambda tmp: Path(tmp).write_text("y"))])
    assert sorted(os.listdir(tmp_path)) == ["X", "kept", "y.txt"]
    replace_directory("new5/new6/out", _fill(["a.txt"]))  # made and kept: they hold the result
    assert os.listdir(tmp_path / "new5" / "new6" / "out") == ["a.txt"]


_READ_ONLY_FOLDER = """
import os, sys
from pathlib import Path
from shared.saving import replace_directory
run = Path(sys.argv[1]) / "run"
(run / "frozen").mkdir(parents=True)
(run / "frozen" / "f.txt").write_text("x")
os.chmod(run / "frozen", 0o555)
replace_directory(run, lambda staging: (staging / "a.txt").write_text("new"))
print(sorted(os.listdir(run)), sorted(p for p in os.listdir(run.parent) if p != "run"))
"""


def test_read_only_folders_inside_the_old_copy_are_removed_with_it():
    """The old directory is removed after the swap; a read-only folder in it (not carried: the
    save owns every name) stopped the removal, and the old copy stayed as a hidden sibling that
    no later clean-up could remove either. Root removes entries of read-only folders anyway, so
    under root the save runs as the unprivileged user ``nobody``, in a folder it may write."""
    root = Path(tempfile.mkdtemp(prefix="twins-saving-"))
    try:
        os.chmod(root, 0o777)
        demote = None
        if os.geteuid() == 0:
            def demote():
                os.setgid(65534)
                os.setuid(65534)
        try:
            done = subprocess.run([sys.executable, "-c", _READ_ONLY_FOLDER, str(root)], cwd=root,
                                  env=importable.project_environ(ROOT), preexec_fn=demote,
                                  capture_output=True, text=True, timeout=120)
        except PermissionError as err:  # an interpreter under /root (a pyenv build's)
            if demote is None:
                raise
            pytest.skip(f"the user nobody cannot run this interpreter ({err})")
        unloadable = done.returncode == 127 and "error while loading shared libraries" in done.stderr
        if demote is not None and unloadable:
            # a venv outside /root whose interpreter links a libpython under it (a pyenv build's):
            # the loader, not the test, fails
            pytest.skip(f"the user nobody cannot load this interpreter's libraries ({done.stderr.strip()})")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "['a.txt'] []"
    finally:
        for folder, _, _ in os.walk(root):
            os.chmod(folder, 0o755)
        shutil.rmtree(root)


def test_a_resumed_run_keeps_the_user_s_files(tmp_path):
    """`twins.runs.save_run` owns the run's four files and nothing else."""
    from twins.runs import LOG_FILE, OPTIMIZER_FILE, save_run
    config = TransformerConfig.preset("tiny")
    weights = init_weights(config)
    moments = {name: np.zeros_like(weights[name.split(".", 1)[1]]) for name in moment_names(config)}
    run = tmp_path / "run"
    save_run(run, config, weights, moments, {"step": 1})
    (run / "NOTES.txt").write_text("mine")
    (run / "figs").mkdir()
    (run / "figs" / "training.png").write_bytes(b"png")
    save_run(run, config, weights, moments, {"step": 2})
    assert sorted(os.listdir(run)) == sorted([CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE, LOG_FILE,
                                              "NOTES.txt", "figs"])
    assert (run / "NOTES.txt").read_text() == "mine"
    assert '"step": 2' in (run / LOG_FILE).read_text()
