"""Issue 15, class 6: the command line never shows a traceback, and says what the user typed.

Run as the user runs it (``python -m twins`` in a subprocess) for usage errors and OS errors that a
test can cause without privileges; in-process (`twins.cli.main`, monkeypatched) for a full disk and
for memory errors, which cannot be caused portably.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from shared.weights import init_weights, save_checkpoint
from twins import cli
from twins.demo_tasks import task_config

ROOT = Path(__file__).resolve().parents[1]


def twins(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    full = importable.project_environ(ROOT, **(env or {}))
    full.pop("TF_CPP_MIN_LOG_LEVEL", None)  # the command line must hide TF's logs by itself
    return subprocess.run([sys.executable, "-m", "twins", *args], env=full, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)


def one_line_error(proc: subprocess.CompletedProcess, command: str, *expected: str) -> None:
    assert proc.returncode == 2, (proc.returncode, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"twins {command}: error: "), proc.stderr
    for text in expected:
        assert text in lines[0], lines[0]


@pytest.fixture(scope="module")
def copy_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "copy"
    config = task_config("copy")
    save_checkpoint(path, config, init_weights(config, seed=0))
    return path


# -- usage errors: exit 2, "twins <command>: error:", the option as typed --------------------------
@pytest.mark.parametrize("args, expected", [
    # Before: exit 1 (the status of a failed parity check) with no "twins compare: error:" prefix.
    (("--src-len", "0"), "--src-len: expected a positive int, got 0"),
    (("--backends", "foo"), "--backends: expected names from"),
    # Before: the length reached the model and failed as "src: expected at most max_len=64 ...".
    (("--preset", "tiny", "--src-len", "100"), "--src-len: expected at most the model's max_len=64"),
    # Before: "max_len: expected an int >= 1, got 0", the decoder's internal name, after the table.
    (("--preset", "tiny", "--max-new", "0"), "--max-new: expected a positive int, got 0"),
])
def test_compare_usage_errors(args, expected):
    one_line_error(twins("compare", *args), "compare", expected)


@pytest.mark.parametrize("argv, expected", [
    (["train"], "twins train: error: the following arguments are required: --task, --backend, --steps, "
                "--checkpoint (see twins train --help)"),
    (["compare", "--preset", "huge"], "twins compare: error: argument --preset: invalid choice: 'huge' "
                                      "(choose from 'base', 'big', 'small', 'tiny') (see twins compare --help)"),
    (["decode", "--checkpoint", "x", "--beam-size", "1_0"], "twins decode: error: argument --beam-size: "
                                                          "expected an int (ASCII digits), got '1_0' (see twins decode --help)"),
    (["convert", "a", "b", "--bogus", "1"], "twins convert: error: unrecognized arguments: --bogus 1 (see "
                                            "twins convert --help)"),
    # Before: "the following arguments are required: command", the option unmentioned.
    (["--bogus"], "twins: error: unrecognized arguments: --bogus; expected a command (compare, "
                  "convert, train, decode, figures) (see twins --help)"),
    ([], "twins: error: expected a command (compare, convert, train, decode, figures) (see twins --help)"),
    (["nosuch"], "twins: error: argument command: invalid choice: 'nosuch' (choose from 'compare', "
                 "'convert', 'train', 'decode', 'figures') (see twins --help)"),
])
def test_argparses_own_errors_are_one_line_naming_the_command(argv, expected, capsys):
    """Before: argparse printed its whole usage block (8 to 14 lines) before the error, and an
    unknown option was an error of ``twins``, not of its command; the README promises one line."""
    from parity_tests.cli_runs import cli
    code, out, err = cli(capsys, *argv)
    assert (code, out, err) == (2, "", expected + "\n")


def test_train_names_the_option_as_typed(tmp_path):
    # Before: "noam_lr: factor expected a positive float, got nan" (an internal name).
    proc = twins("train", "--task", "copy", "--backend", "torch", "--steps", "1", "--checkpoint",
                 str(tmp_path / "run"), "--factor", "nan")
    one_line_error(proc, "train", "--factor: expected a positive number, got nan")


def test_decode_max_new_over_the_model_is_an_error_not_clamped(copy_checkpoint):
    # Before: --max-len 1000 was silently clamped to the model's 64.
    proc = twins("decode", "--checkpoint", str(copy_checkpoint), "--max-new", "1000", "4 5 6")
    one_line_error(proc, "decode", "--max-new: expected an int in [1, the model's max_len=64], got 1000")


# -- OS errors: one line naming the user's path ----------------------------------------------------
def test_a_destination_under_a_file(tmp_path, copy_checkpoint):
    """Not writable whoever runs the tests (chmod does not stop root): a path under a file.
    Before: a traceback, or a message naming the hidden temporary folder."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = twins("convert", str(copy_checkpoint), str(blocker / "sub" / "out"))
    one_line_error(proc, "convert", str(blocker), "Not a directory")
    assert ".twins-" not in proc.stderr


def test_train_refuses_an_unwritable_run_directory_before_training(tmp_path):
    """Before: the steps ran, then the save failed with a traceback and the run was lost."""
    blocker = tmp_path / "file"
    blocker.write_text("")
    proc = twins("train", "--task", "copy", "--backend", "torch", "--steps", "1", "--checkpoint",
                 str(blocker / "run"), "--batch", "4")
    one_line_error(proc, "train", str(blocker))
    assert proc.stdout == ""  # nothing trained


def test_json_to_an_unwritable_path():
    """The JSON is written after the comparison whatever ran in it: the reference alone (`--backends
    ""`) reaches the same write without importing a framework (torch: ~1.2 s of CPU)."""
    proc = twins("compare", "--preset", "tiny", "--backends", "", "--src-len", "3",
                 "--tgt-len", "2", "--json", "/proc/twins-cannot-write-here.json")
    one_line_error(proc, "compare", "/proc/twins-cannot-write-here.json")


def test_a_full_disk_names_the_users_path(tmp_path, copy_checkpoint, monkeypatch, capsys):
    """ENOSPC while the new directory is flushed (injected: no tmpfs without root mounts)."""
    from shared import saving

    def full(path):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(saving, "fsync_tree", full)
    out = tmp_path / "out"
    assert cli.main(["convert", str(copy_checkpoint), str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"twins convert: error: {str(out)!r}: No space left on device"
    assert not out.exists() and not [p for p in os.listdir(tmp_path) if ".twins-" in p]


def test_a_memory_error_is_one_line(monkeypatch, capsys):
    from twins import compare

    def oom(*args, **kwargs):
        raise MemoryError()
    monkeypatch.setattr(compare, "src_tgt", oom)
    assert cli.main(["compare", "--preset", "tiny", "--backends", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("twins compare: error: out of memory") and "Traceback" not in err


def test_an_unexpected_error_is_one_line_and_verbose_shows_the_traceback(monkeypatch, capsys):
    from twins import compare

    def boom(*args, **kwargs):
        raise RuntimeError("something unforeseen\nsecond line")
    monkeypatch.setattr(compare, "src_tgt", boom)
    assert cli.main(["compare", "--preset", "tiny", "--backends", ""]) == 2
    err = capsys.readouterr().err
    assert err == ("twins compare: error: RuntimeError: something unforeseen (--verbose shows the "
                   "traceback)\n")
    # the traceback, then the same line and status: --verbose used to re-raise, exiting 1, the
    # status of a failed parity check
    assert cli.main(["compare", "--verbose", "--preset", "tiny", "--backends", ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith("Traceback") and 'raise RuntimeError("something unforeseen' in err
    assert err.endswith("twins compare: error: RuntimeError: something unforeseen\n")


# -- output: --json - pipes, TF's logs hidden, TF's errors as torch's --------------------------------
@pytest.mark.tf
def test_json_to_stdout_is_json_alone_and_tf_logs_are_hidden():
    """Before: the table and the JSON shared stdout (not parseable), and TensorFlow's start-up
    lines ("oneDNN custom operations are on", "All log messages before absl::InitializeLog()")
    reached stderr whatever TF_CPP_MIN_LOG_LEVEL said."""
    proc = twins("compare", "--preset", "tiny", "--backends", "tf", "--src-len", "3", "--tgt-len",
                 "2", "--json", "-")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["pass"] is True
    assert "intermediate" in proc.stderr  # the table, on stderr
    for line in proc.stderr.splitlines():
        assert "oneDNN" not in line and "absl" not in line and not line.startswith("I0000"), line


def test_the_progress_bar_asks_what_stderr_was_before_tf_logs_are_hidden():
    """`twins.quiet.tf_logs_hidden` makes file descriptor 2 a pipe for every command; tqdm asked
    that pipe whether it was a terminal, so `twins train` never drew its bar, on a terminal either.
    Here fd 2 is a pseudo-terminal (then a pipe): inside the block the answer is the one before."""
    from twins import quiet
    leader, follower = os.openpty()
    saved = os.dup(2)
    try:
        for target, terminal in [(follower, True), (leader, True)]:
            os.dup2(target, 2)
            with quiet.tf_logs_hidden():
                assert not os.isatty(2)  # the pipe
                assert quiet.stderr_is_terminal() is terminal
            assert quiet.stderr_is_terminal() is terminal
        read, write = os.pipe()
        os.dup2(write, 2)
        with quiet.tf_logs_hidden():
            assert quiet.stderr_is_terminal() is False
        os.close(read)
        os.close(write)
    finally:
        os.dup2(saved, 2)
        for fd in (saved, leader, follower):
            os.close(fd)


@pytest.mark.torch
@pytest.mark.tf
def test_tf_errors_from_call_read_as_torchs():
    """Before: Keras re-raised the error as "Exception encountered when calling Transformer.call()"
    with the text in terminal bold (ESC[1m ... ESC[0m) and the arguments listed."""
    from twins.backends import make_adapter
    config = task_config("copy")
    weights = init_weights(config, seed=0)
    src, tgt = np.array([[4, 5, 99]]), np.array([[1, 4]])
    messages = []
    for name in ("torch", "tf", "reference"):
        with pytest.raises(ValueError) as err:
            make_adapter(name, config, weights).logits(src, tgt)
        messages.append(str(err.value))
    assert messages[0] == messages[1] == messages[2], messages
    assert "\x1b[" not in messages[1] and "Exception encountered" not in messages[1]


# -- stdout closed early: `twins decode ... | head -1` (twins.pipes) ------------------------------
@pytest.mark.torch
def test_a_reader_that_closes_stdout_early_ends_the_command_silently(copy_checkpoint):
    """Before: ``twins decode: error: [Errno 32] Broken pipe`` and exit 2, as if the decode had
    failed. Now: no message and 141 (128 + SIGPIPE, what a shell reports for a C tool there). The
    output (2500 held-out lines of at least 40 bytes) is larger than a pipe's buffer (64 KiB) plus
    Python's (8 KiB), so the command is still writing when the reader goes."""
    full = importable.project_environ(ROOT)
    proc = subprocess.Popen([sys.executable, "-m", "twins", "decode", "--checkpoint", str(copy_checkpoint),
                             "--task", "copy", "--heldout", "2500"], env=full, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()  # what `head -1` does after its line
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 141, err
    assert first.count(b"\t") == 2, first  # it had started writing its output
    assert err == "", err  # no "Traceback", no "Broken pipe", no "Exception ignored"


def test_a_broken_pipe_that_is_not_stdouts_stays_an_error(monkeypatch, capsys):
    """Only a closed stdout is silent: a BrokenPipeError from elsewhere (a socket, a child's pipe)
    while stdout is fine is reported like any OS error."""
    from twins import compare

    def broken(*args, **kwargs):
        raise BrokenPipeError(errno.EPIPE, os.strerror(errno.EPIPE))
    monkeypatch.setattr(compare, "src_tgt", broken)
    assert cli.main(["compare", "--preset", "tiny", "--backends", ""]) == 2
    assert capsys.readouterr().err == "twins compare: error: [Errno 32] Broken pipe\n"


def test_stdout_reader_gone_reads_the_pipe_itself(monkeypatch):
    from twins.pipes import stdout_reader_gone
    read, write = os.pipe()
    with os.fdopen(write, "w") as out:
        monkeypatch.setattr(sys, "stdout", out)
        assert not stdout_reader_gone()  # a reader is there
        os.close(read)
        assert stdout_reader_gone()


@contextlib.contextmanager
def closed_stdout(monkeypatch):
    """``sys.stdout`` on a pipe whose reader has gone (what `twins.pipes` looks for); in the test
    body, as pytest's capture sets ``sys.stdout`` again between a fixture and the test."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w") as out, monkeypatch.context() as patch:
        patch.setattr(sys, "stdout", out)
        yield out


def test_a_later_worker_fails_silently_after_rank_0_met_a_closed_stdout(monkeypatch):
    """`twins train --workers N`: rank 0 alone prints; after it exits 141 the other ranks fail in
    their next collective (gloo: "Connection closed by peer"), a consequence, silent while stdout's
    reader is gone; rank 0's own errors, and any rank's with stdout open, are still errors."""
    from twins.pipes import caused_by_closed_stdout
    gloo = RuntimeError("[gloo/transport/tcp/pair.cc:553] Connection closed by peer")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    assert not caused_by_closed_stdout(gloo)  # stdout open (the capture)
    with closed_stdout(monkeypatch):
        assert caused_by_closed_stdout(gloo)
        monkeypatch.setenv("RANK", "0")
        assert not caused_by_closed_stdout(gloo)
        assert caused_by_closed_stdout(BrokenPipeError(errno.EPIPE, "Broken pipe"))


@pytest.mark.torch
def test_the_launcher_exits_141_silently_when_rank_0_met_a_closed_stdout(monkeypatch, capsys):
    """Before (checked by hand, ``twins train ... --workers 2 | head -1``): "twins train: error:
    --workers 2: worker rank 0 exited with status 141 (the launcher then stopped rank 1 with
    SIGTERM)" and exit 1. The launch itself is replaced here: rank 0 exited 141, rank 1 was stopped."""
    import argparse

    import torch.distributed.launcher.api as api
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure

    from twins import parallel

    def launched(config, entrypoint):
        def run(*args):
            raise ChildFailedError("twins", {0: ProcessFailure(0, 1, 141, "/nonexistent"),
                                             1: ProcessFailure(1, 2, -15, "/nonexistent")})
        return run
    monkeypatch.setattr(api, "elastic_launch", launched)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    args = argparse.Namespace(workers=2, threads=1, verbose=False, argv=["train"])
    assert parallel.launch(args) == 1  # stdout open (the capture): a worker died, said so
    assert "worker rank 0 exited with status 141" in capsys.readouterr().err
    with closed_stdout(monkeypatch):
        assert parallel.launch(args) == 141
    assert capsys.readouterr().err == ""


def _dev():
    """dev.py as a module (it is a script beside the project, not a package of it)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location("dev_under_test", ROOT / "dev.py")
    dev = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = dev  # where @dataclass looks its module up, while it runs
    try:
        spec.loader.exec_module(dev)
    finally:
        del sys.modules[spec.name]
    return dev


@pytest.mark.parametrize("which", ["PINNED", "FLOORS"])
def test_setup_refuses_a_new_venv_that_cannot_fit(monkeypatch, tmp_path, which):
    """`dev.py` checks the disk before it creates .venv: pip on a full disk fails after minutes,
    leaving a half-installed environment (CI's record: "[Errno 28] No space left on device")."""
    dev = _dev()
    where = dev.Env(tmp_path / ".venv", getattr(dev, which).constraints)
    created = []
    monkeypatch.setattr(dev.venv.EnvBuilder, "create", lambda self, path: created.append(path))
    monkeypatch.setattr(dev, "NEW_VENV_BYTES", dev.shutil.disk_usage(dev.ROOT).free + 2**40)
    with pytest.raises(SystemExit) as caught:
        dev.setup(where)
    message = str(caught.value)
    assert message.startswith(f"dev.py: a new {tmp_path / '.venv'} needs about "), message
    assert " GiB free in " in message and not created


# The floors that `dev.py floors` pins but are not their ranges' lower bounds (floors.txt says why).
ABOVE_FLOOR = {"safetensors": "0.8.0", "torch": "2.13.0"}


def test_floors_pin_each_declared_lower_bound():
    """floors.txt pins every dependency of pyproject.toml (its extras too) at its range's lower bound
    (``>=1.26``: a 1.26 release), but those of `ABOVE_FLOOR`; ``tensorflow`` is the full
    distribution of ``tensorflow-cpu``, which the floors install. So a range that moves without its
    floor, or a floor written for nothing, fails here, not unseen in `dev.py floors`."""
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name
    from packaging.version import Version
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = {}
    for line in project["dependencies"] + sum(project["optional-dependencies"].values(), []):
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        bounds = [Version(s.version) for s in requirement.specifier if s.operator == ">="]
        assert len(bounds) == 1 and len(requirement.specifier) == 1, f"{line}: expected one >= bound"
        assert declared.setdefault(name, bounds[0]) == bounds[0], f"{name}: two floors"
    assert declared.pop("tensorflow") == declared["tensorflow-cpu"]
    pinned = {}
    for line in (ROOT / "floors.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            requirement = Requirement(line)
            (spec,) = requirement.specifier
            assert spec.operator == "==", line
            pinned[canonicalize_name(requirement.name)] = Version(spec.version)
    assert sorted(pinned) == sorted(declared)
    for name, floor in declared.items():
        if name in ABOVE_FLOOR:
            assert pinned[name] == Version(ABOVE_FLOOR[name]) and pinned[name] > floor, name
        else:
            assert pinned[name].release[:len(floor.release)] == floor.release, (name, pinned[name], floor)
