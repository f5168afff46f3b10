"""`twins figures` given hostile inputs and destinations, in-process through `twins.cli.main`: a
destination that is one of its inputs is refused, every input is read and checked before the --out
directory is made or any PNG is written, and a --log that is not a regular file is named for what
it is. Each refusal is one line, exit 2, and leaves every file as it was (docs/usage.md, "How every
command behaves")."""
import json
import os
import shutil
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from parity_tests.cli_runs import cli  # noqa: E402
from twins import demo_tasks as tasks  # noqa: E402
from twins.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch,
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    """A tiny copy run of 2 steps in torch (the tiny preset, no held-out evaluation)."""
    root = tmp_path_factory.mktemp("figrun")
    config = root / "tiny.json"
    config.write_text(tasks.task_config("copy", preset="tiny").replace(dropout=0.0).to_json())
    path = root / "run"
    assert main(["train", "--task", "copy", "--backend", "torch", "--steps", "2", "--checkpoint",
                 str(path), "--eval-every", "0", "--heldout", "2", "--config", str(config),
                 "--no-progress", "--threads", "1"]) == 0
    return path


def snapshot(*roots: Path) -> dict:
    """Every file under ``roots`` (links not followed) -> its bytes, or where a link leads."""
    files = {}
    for root in roots:
        for dirpath, dirs, names in os.walk(root):
            for name in (*dirs, *names):
                p = Path(dirpath) / name
                files[str(p)] = os.readlink(p) if p.is_symlink() else (
                    None if p.is_dir() else p.read_bytes())
    return files


def refused(capsys, argv, message: str) -> None:
    code, out, err = cli(capsys, "figures", *argv, "--dpi", "20")
    assert code == 2, err
    assert out == ""
    assert err.splitlines() == [f"twins figures: error: {message}"], err


# -- 1. a destination that is an input ------------------------------------------------------------
def test_a_figure_is_never_drawn_over_its_own_log(run, tmp_path, capsys):
    """A --log named like a figure in --out was replaced by that figure (exit 0), and the next run
    found its input gone; refused now before anything is drawn, the log and --out as they were."""
    out = tmp_path / "o"
    out.mkdir()
    log = out / "training_copy.png"
    shutil.copy(run / "train_log.json", log)
    before = snapshot(out, run)
    refused(capsys, ["--out", out, "--log", log],
            f"--out {str(log)!r}: would overwrite --log {str(log)!r}; write elsewhere")
    assert snapshot(out, run) == before
    run = shutil.copytree(run, tmp_path / "run")  # the module's run stays whole if this fails
    (tmp_path / "p").mkdir()  # a static figure's name too, through a link to the log
    os.symlink(run / "train_log.json", tmp_path / "p" / "noam.png")
    before = snapshot(tmp_path / "p", run)
    refused(capsys, ["--out", tmp_path / "p", "--log", run / "train_log.json"],
            f"--out {str(tmp_path / 'p' / 'noam.png')!r}: would overwrite --log "
            f"{str(run / 'train_log.json')!r}; write elsewhere")
    assert snapshot(tmp_path / "p", run) == before
    assert json.loads((run / "train_log.json").read_text())["task"] == "copy"


def test_a_figure_is_never_drawn_over_a_file_a_checkpoint_is_read_from(run, tmp_path, capsys):
    """A link in --out to the run's weights, and a link to the weights that a run's own link leads
    to: each refused, naming --out, the file and the checkpoint, the weights as they were."""
    run = shutil.copytree(run, tmp_path / "run")  # the module's run stays whole if this fails
    before = snapshot(run)
    out = tmp_path / "o"
    out.mkdir()
    os.symlink(run / "model.safetensors", out / "noam.png")
    refused(capsys, ["--out", out, "--checkpoint", run],
            f"--out {str(out / 'noam.png')!r}: would overwrite {str(run / 'model.safetensors')!r}, "
            f"which --checkpoint {str(run)!r} reads; write elsewhere")
    assert snapshot(run) == before and sorted(p.name for p in out.iterdir()) == ["noam.png"]
    linked = tmp_path / "linked"  # a run whose weights are a link to a file elsewhere
    linked.mkdir()
    shutil.copy(run / "model.safetensors", tmp_path / "weights.safetensors")
    for name in ("config.json", "train_log.json"):
        shutil.copy(run / name, linked / name)
    os.symlink(tmp_path / "weights.safetensors", linked / "model.safetensors")
    out = tmp_path / "o2"
    out.mkdir()
    os.symlink(tmp_path / "weights.safetensors", out / "attention_copy.png")
    weights = (tmp_path / "weights.safetensors").read_bytes()
    refused(capsys, ["--out", out, "--checkpoint", linked],
            f"--out {str(out / 'attention_copy.png')!r}: would overwrite "
            f"{str(linked / 'model.safetensors')!r}, which --checkpoint {str(linked)!r} reads; "
            "write elsewhere")
    assert (tmp_path / "weights.safetensors").read_bytes() == weights
    from shared import formats
    pt = tmp_path / "copy.pt"  # a checkpoint file, through a link
    formats.write("torch", *formats.read(run), pt)
    model = pt.read_bytes()
    os.symlink(pt, out / "noam.png")
    refused(capsys, ["--out", out, "--checkpoint", pt],
            f"--out {str(out / 'noam.png')!r}: would overwrite --checkpoint {str(pt)!r}; "
            "write elsewhere")
    assert pt.read_bytes() == model


def test_figures_may_be_written_into_a_run_directory_over_earlier_ones(run, tmp_path, capsys):
    """A run directory keeps a user's figures (a resumed run carries them): figures of the run
    written into it, where an earlier command's figures lie (they are no input: replaced), leave
    the run's own files as they were. (One command, not two: the attention figure runs torch and
    TF, seconds of the suite's budget.)"""
    pytest.importorskip("tensorflow")  # the attention figure: torch beside TF
    mine = tmp_path / "run"
    shutil.copytree(run, mine)
    before = snapshot(mine)
    (mine / "noam.png").write_bytes(b"an earlier command's figure")
    code, out, err = cli(capsys, "figures", "--out", mine, "--checkpoint", mine, "--dpi", "20")
    assert code == 0, err
    assert [Path(p).name for p in out.split()] == ["positional_encoding.png", "masks.png",
                                                   "noam.png", "training_copy.png",
                                                   "attention_copy.png"]
    assert (mine / "noam.png").read_bytes().startswith(b"\x89PNG")
    after = snapshot(mine)
    assert {k: v for k, v in after.items() if not k.endswith(".png")} == before


# -- 2. every input checked before the output directory is made -----------------------------------
def _bad_log(run: Path, where: Path, change) -> Path:
    log = json.loads((run / "train_log.json").read_text())
    change(log)
    where.mkdir()
    (where / "train_log.json").write_text(json.dumps(log))
    return where / "train_log.json"


def test_a_corrupt_checkpoint_is_refused_before_anything_is_written(run, tmp_path, capsys):
    """A run whose model.safetensors is cut short: refused (as `twins decode` refuses it) with no
    --out directory made; four PNGs were written first."""
    bad = tmp_path / "bad"
    shutil.copytree(run, bad)
    os.truncate(bad / "model.safetensors", 1000)
    refused(capsys, ["--out", tmp_path / "o", "--checkpoint", bad],
            f"{str(bad / 'model.safetensors')!r}: not a readable safetensors file (Error while "
            "deserializing header: invalid header length)")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("inputs, message", [
    (["12 5 99"], "--input '12 5 99': the copy task expects space-separated symbol ids 4..13, got "
                  "[12, 5, 99]"),
    (["jan 1 2000"], "--input 'jan 1 2000': the copy task expects space-separated symbol ids 4..13 "
                     "(ASCII digits), e.g. '4 5 6 7'"),  # the only task drawn: not silently unused
    (["4 5", "6 7"], "--input '6 7': expected one input per task, got a second for copy (the "
                     "first: '4 5')"),
    ([" ".join(["4"] * 70)], f"--input {' '.join(['4'] * 70)!r}: expected at most the model's "
                             "max_len=64 tokens (--checkpoint {run!r}), got 70"),
], ids=["out-of-vocabulary", "text-for-copy", "two-for-one-task", "longer-than-max-len"])
def test_a_bad_input_is_refused_before_anything_is_written(run, tmp_path, capsys, inputs, message):
    argv = ["--out", tmp_path / "o", "--checkpoint", run]
    for text in inputs:
        argv += ["--input", text]
    refused(capsys, argv, message.replace("{run!r}", repr(str(run))))
    assert not (tmp_path / "o").exists()


def test_an_input_without_a_model_is_refused(tmp_path, capsys):
    refused(capsys, ["--out", tmp_path / "o", "--input", "4 5"],
            "--input '4 5': expected a --checkpoint to draw the attention of, got none")
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("change, problem", [
    (lambda d: d["segments"][0].update(seconds="abc"),
     "segments[0].seconds: expected a finite number >= 0, got 'abc'"),
    (lambda d: d["segments"][0].update(seconds=-1),
     "segments[0].seconds: expected a finite number >= 0, got -1"),
    (lambda d: d.update(evals=[{"step": 1, "backend": "torch", "accuracy": 0.5, "n": "many"}]),
     "evals[0].n: expected an int >= 0, got 'many'"),
    (lambda d: d.update(task="sort"), "task: expected one of ['copy', 'dates'], got 'sort'"),
], ids=["seconds-text", "seconds-negative", "evals-n-text", "unknown-task"])
def test_a_log_field_figures_draws_is_checked_before_anything_is_written(run, tmp_path, capsys,
                                                                          change, problem):
    """A train log whose segment's seconds was "abc" failed with Python's own words ("unsupported
    operand type(s) for +") after three PNGs; a task no figure draws was skipped in silence."""
    log = _bad_log(run, tmp_path / "log", change)
    refused(capsys, ["--out", tmp_path / "o", "--log", log],
            f"--log {str(log)!r}: not a usable train log: {problem}")
    assert not (tmp_path / "o").exists()
    run_dir = tmp_path / "run"  # the same log in a run directory, given as --checkpoint
    shutil.copytree(run, run_dir)
    shutil.copy(log, run_dir / "train_log.json")
    refused(capsys, ["--out", tmp_path / "o", "--checkpoint", run_dir],
            f"{str(run_dir / 'train_log.json')!r}: not a usable train log: {problem}")
    assert not (tmp_path / "o").exists()


def test_a_log_runs_py_refuses_is_named_as_the_option(run, tmp_path, capsys):
    log = _bad_log(run, tmp_path / "log", lambda d: d.pop("evals"))
    refused(capsys, ["--out", tmp_path / "o", "--log", log],
            f"--log {str(log)!r}: not a usable train log: evals: missing")
    assert not (tmp_path / "o").exists()


# -- 3. a --log that is not a regular file --------------------------------------------------------
@pytest.mark.parametrize("what", ["directory", "device", "missing"])
def test_a_log_that_is_not_a_regular_file_is_named_for_what_it_is(run, tmp_path, capsys, what):
    """A directory and /dev/zero were both "no such file"."""
    given, message = {
        "directory": (str(run), f"--log {str(run)!r}: expected a regular file, got a directory"),
        "device": ("/dev/zero", "--log '/dev/zero': expected a regular file, got a character device"),
        "missing": (str(tmp_path / "none.json"), f"--log {str(tmp_path / 'none.json')!r}: no such file"),
    }[what]
    if what == "device" and not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    refused(capsys, ["--out", tmp_path / "o", "--log", given], message)
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("option", ["--out", "--log", "--checkpoint"])
def test_an_empty_path_is_not_the_current_directory(tmp_path, capsys, monkeypatch, option):
    """``Path("")`` is the current directory: ``--out ""`` wrote the figures there, ``--log ""``
    said "no such file". Refused while the command line is parsed, as every command's paths are."""
    monkeypatch.chdir(tmp_path)
    argv = ["--out", ""] if option == "--out" else ["--out", tmp_path / "o", option, ""]
    code, out, err = cli(capsys, "figures", *argv, "--dpi", "20")
    assert code == 2 and out == ""
    assert err.splitlines() == [f"twins figures: error: argument {option}: expected a path, got '' (see twins "
                                "figures --help)"]
    assert not list(tmp_path.iterdir())


# -- 3. the set written at once -------------------------------------------------------------------
def test_a_failure_part_way_through_the_writes_leaves_every_figure_as_it_was(tmp_path, capsys,
                                                                           monkeypatch):
    """Before: each PNG was replaced as it was drawn, so a full disk at the third left two new
    figures beside older ones. Now every PNG is drawn into a temporary file first: the third
    failing (ENOSPC) leaves every earlier figure's bytes, and no temporary file, behind."""
    import errno
    from matplotlib.figure import Figure
    out, names = tmp_path / "figs", ["masks.png", "noam.png", "positional_encoding.png"]
    out.mkdir()
    for name in names:
        (out / name).write_bytes(b"an earlier figure: " + name.encode())
    before = snapshot(out)
    drawn = []
    savefig = Figure.savefig

    def full_at_the_third(self, fname, *args, **kwargs):
        drawn.append(fname)
        if len(drawn) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        return savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", full_at_the_third)
    code, out_text, err = cli(capsys, "figures", "--out", out, "--dpi", "20")
    assert code == 2 and out_text == "" and len(drawn) == 3, err
    assert "noam.png': No space left on device" in err, err
    assert snapshot(out) == before
    monkeypatch.setattr(Figure, "savefig", savefig)
    code, out_text, err = cli(capsys, "figures", "--out", out, "--dpi", "20")
    assert code == 0 and len(out_text.split()) == 3, err
    assert sorted(p.name for p in out.iterdir()) == names  # and no temporary file
    assert all((out / name).read_bytes().startswith(b"\x89PNG") for name in names)


# -- 4. which task an --input is for --------------------------------------------------------------
@pytest.mark.parametrize("text, task", [
    ("4 5 6", "copy"),         # symbol ids
    ("2019", "dates"),         # digits that are no copy symbol: it went to copy, which refused it
    ("jan 1 2000", "dates"),
    ("\u0664 \u0665", "copy"),  # parses for neither: copy's error, which names ASCII digits
    ("", "dates"),             # dates' error: "expected a date, got an empty string"
])
def test_an_input_goes_to_the_task_it_parses_for(text, task):
    from twins.figures import input_task
    assert input_task(text, {"copy": "a", "dates": "b"}) == task
    assert input_task(text, {"dates": "b"}) == "dates"  # one task drawn: its input, whatever it is


def test_a_model_of_no_demo_task_is_refused_with_a_remedy_figures_has(tmp_path, capsys):
    """Before: "... : pass --task", an option figures does not have (its parser refused it)."""
    import torch_impl
    from shared import TransformerConfig
    model = tmp_path / "tiny.pt"
    torch_impl.save_checkpoint(torch_impl.Transformer(TransformerConfig.preset("tiny")), model)
    refused(capsys, ["--out", str(tmp_path / "f"), "--checkpoint", str(model)],
            f"--checkpoint {str(model)!r}: cannot tell the task from the checkpoint (vocabularies "
            "13/17; copy has 14, dates 44): figures draws the attention of copy and dates models only "
            "(twins train makes them)")
    assert not (tmp_path / "f").exists()
