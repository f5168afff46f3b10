"""The demo commands (`twins train`, `twins decode`, `twins figures`) on tiny smoke runs, in-process
through `twins.cli.main`: a checkpoint trained in one backend decodes to the same outputs in the
other, a resumed run continues the step count (and, with Adam's moments stored, reproduces an
uninterrupted run bit for bit), the output formats, the figures, and the errors."""
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")
pytest.importorskip("tqdm")

from parity_tests.cli_runs import cli  # noqa: E402
from shared import tasks as data  # noqa: E402
from shared.schedule import noam_lr  # noqa: E402
from shared.weights import load_checkpoint, random_weights, save_checkpoint  # noqa: E402
from twins import demo_tasks as tasks  # noqa: E402
from twins.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tf,
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]

HELDOUT = 24
OPTS = ["--no-progress", "--threads", "1"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two tiny copy runs from seed 3 (the tiny preset without dropout): one trained in torch, one
    in TF, 40 steps each."""
    root = tmp_path_factory.mktemp("runs")
    config = root / "tiny.json"
    config.write_text(tasks.task_config("copy", preset="tiny").replace(dropout=0.0).to_json())
    made = {}
    for backend in ("torch", "tf"):
        path = root / backend
        assert main(["train", "--task", "copy", "--backend", backend, "--steps", "40", "--seed", "3",
                     "--checkpoint", str(path), "--eval-every", "20", "--heldout", str(HELDOUT),
                     "--factor", "3", "--config", str(config), *OPTS]) == 0
        made[backend] = path
    return made


# -- cross-framework: train in one backend, decode in the other -----------------------------------
@pytest.mark.parametrize("trained", ["torch", "tf"])
def test_decode_identical_across_backends(runs, capsys, trained):
    outs = {}
    for backend in ("torch", "tf"):
        code, out, err = cli(capsys, "decode", "--checkpoint", runs[trained], "--backend", backend,
                             "--heldout", HELDOUT)
        assert code == 0, err
        outs[backend] = out
    assert outs["torch"] == outs["tf"]
    lines = outs["torch"].splitlines()
    assert len(lines) == HELDOUT + 1
    assert re.fullmatch(r"exact match: \d+/24 = \d+\.\d%", lines[-1])
    # the score printed by decode is the training's last evaluation (same held-out set, same weights)
    log = json.loads((runs[trained] / "train_log.json").read_text())
    assert lines[-1] == (f"exact match: {log['final']['correct']}/{HELDOUT} = "
                         f"{log['final']['accuracy']:.1%}")


def test_same_seed_same_data_and_start(runs):
    logs = {b: json.loads((runs[b] / "train_log.json").read_text()) for b in runs}
    t, f = logs["torch"]["history"], logs["tf"]["history"]
    assert t["lr"] == f["lr"]  # one schedule
    # same initial weights and batches, no dropout: the same losses (float32, logged to 6 digits)
    np.testing.assert_allclose(t["loss"][:10], f["loss"][:10], rtol=1e-4)


# -- resume ---------------------------------------------------------------------------------------
def test_resume_continues_step_count_and_matches_an_uninterrupted_run(tmp_path, capsys):
    base = ["train", "--task", "copy", "--backend", "torch", "--no-progress", "--threads", "1",
            "--eval-every", "0", "--heldout", "8", "--warmup", "4", "--batch", "16"]  # no dropout
    code, out, err = cli(capsys, *base, "--steps", "6", "--checkpoint", tmp_path / "straight")
    assert code == 0, err
    assert cli(capsys, *base, "--steps", "4", "--checkpoint", tmp_path / "split")[0] == 0
    code, out, err = cli(capsys, *base, "--steps", "2", "--checkpoint", tmp_path / "split")
    assert code == 0, err
    assert "resuming at step 4, Adam's moments restored; steps 5..6" in out
    straight = json.loads((tmp_path / "straight" / "train_log.json").read_text())
    split = json.loads((tmp_path / "split" / "train_log.json").read_text())
    assert split["step"] == 6 and split["history"]["step"] == [1, 2, 3, 4, 5, 6]
    assert [(s["first_step"], s["last_step"]) for s in split["segments"]] == [(1, 4), (5, 6)]
    assert split["history"]["lr"] == [noam_lr(k, 64, 4, tasks.spec("copy").factor) for k in range(1, 7)]
    assert split["history"]["loss"] == straight["history"]["loss"]
    _, w_straight = load_checkpoint(tmp_path / "straight")
    _, w_split = load_checkpoint(tmp_path / "split")
    for name in w_straight:  # weights and moments restored exactly: the same float32 numbers
        np.testing.assert_array_equal(w_split[name], w_straight[name], err_msg=name)


def test_resume_in_the_other_backend(runs, tmp_path, capsys):
    path = tmp_path / "run"
    shutil.copytree(runs["torch"], path)
    code, out, err = cli(capsys, "train", "--task", "copy", "--backend", "tf", "--steps", "3",
                         "--checkpoint", path, "--eval-every", "0", "--heldout", "4", "--no-progress")
    assert code == 0, err
    assert "resuming at step 40, Adam's moments restored; steps 41..43" in out
    log = json.loads((path / "train_log.json").read_text())
    assert log["step"] == 43 and [s["backend"] for s in log["segments"]] == ["torch", "tf"]
    assert log["settings"]["factor"] == 3  # kept from the run
    assert log["history"]["lr"][-1] == noam_lr(43, 16, 400, 3.0)


# -- decode output ----------------------------------------------------------------------------------
def test_decode_inputs_one_line_each(runs, capsys):
    code, out, err = cli(capsys, "decode", "--checkpoint", runs["torch"], "--backend", "tf",
                         "4 5 6 7 8 9 10 11 12 13", "13 12 11", "7")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 3
    assert all(re.fullmatch(r"(\d+( \d+)*)?", line) for line in lines), lines
    assert all(4 <= int(t) <= 13 for line in lines for t in line.split())
    code, beam, err = cli(capsys, "decode", "--checkpoint", runs["torch"], "--backend", "torch",
                          "--beam-size", "3", "4 5 6 7 8 9 10 11 12 13")
    assert code == 0 and len(beam.splitlines()) == 1, err


def test_decode_dates_text_from_a_neutral_checkpoint(tmp_path, capsys):
    pytest.importorskip("babel")
    config = tasks.task_config("dates", preset="tiny")
    save_checkpoint(tmp_path / "ckpt", config, random_weights(config, 0))  # no train log: task from vocab
    code, out, err = cli(capsys, "decode", "--checkpoint", tmp_path / "ckpt", "--backend", "torch",
                         "Saturday, February 2, 2019", "2/2/19")
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and all(set(line) <= set(data.CHARS) for line in lines), lines


# -- figures --------------------------------------------------------------------------------------
def test_figures_written(runs, tmp_path, capsys):
    pytest.importorskip("matplotlib")
    out_dir = tmp_path / "fig"
    code, out, err = cli(capsys, "figures", "--out", out_dir, "--checkpoint", runs["torch"],
                         "--checkpoint", runs["tf"], "--dpi", "40")
    assert code == 0, err
    expected = {"positional_encoding.png", "masks.png", "noam.png", "training_copy.png",
                "attention_copy.png"}
    assert {p.name for p in out_dir.iterdir()} == expected
    for name in expected:
        blob = (out_dir / name).read_bytes()
        assert blob.startswith(b"\x89PNG\r\n\x1a\n") and len(blob) > 1000, name
    assert out.split() == [str(out_dir / n) for n in ("positional_encoding.png", "masks.png", "noam.png",
                                                      "training_copy.png", "attention_copy.png")]


def test_figures_of_a_model_in_another_format(runs, tmp_path, capsys):
    """A demo model that is no run directory (here a .pt): its attention, its task told by its
    vocabulary, and no training curve (it has no log)."""
    pytest.importorskip("matplotlib")
    from shared import formats
    config, weights = formats.read(runs["torch"])
    formats.write("torch", config, weights, tmp_path / "copy.pt")
    code, out, err = cli(capsys, "figures", "--out", tmp_path / "fig", "--checkpoint",
                         tmp_path / "copy.pt", "--dpi", "40")
    assert code == 0, err
    assert [Path(p).name for p in out.split()] == ["positional_encoding.png", "masks.png", "noam.png",
                                                   "attention_copy.png"]


def test_figures_refuse_bad_destinations_and_sizes_before_drawing(tmp_path, capsys, monkeypatch):
    """A --dpi out of range is a usage error; a FIFO at one of the files, or a file given as --out,
    is refused before any figure is drawn (nothing half-written); a figure whose pixels would
    outgrow `MAX_PIXELS` names --dpi instead of filling the memory."""
    pytest.importorskip("matplotlib")
    from twins import figures
    code, _, err = cli(capsys, "figures", "--out", tmp_path / "f", "--dpi", "5000")
    assert code == 2 and "argument --dpi: expected an int in [20, 600], got 5000" in err
    (tmp_path / "file").write_text("mine")
    code, _, err = cli(capsys, "figures", "--out", tmp_path / "file", "--dpi", "20")
    assert code == 2 and "--out" in err and "expected a directory, got a regular file" in err
    assert (tmp_path / "file").read_text() == "mine"
    out = tmp_path / "fifo"
    out.mkdir()
    os.mkfifo(out / "noam.png")  # the last of the three: the first two must not be drawn either
    code, _, err = cli(capsys, "figures", "--out", out, "--dpi", "20")
    assert code == 2 and "noam.png': is a FIFO; refusing to replace it with a file" in err
    assert sorted(p.name for p in out.iterdir()) == ["noam.png"]
    monkeypatch.setattr(figures, "MAX_PIXELS", 100_000)  # positional_encoding.png: 13 x 4.6 inches
    code, _, err = cli(capsys, "figures", "--out", tmp_path / "big", "--dpi", "60")
    assert code == 2 and "--dpi 60: positional_encoding.png would be 780 x 276 pixels" in err
    assert not list((tmp_path / "big").iterdir())


# -- one adapter module, each framework imported only when its adapter is built -------------------
def _fresh_python(code: str) -> None:
    import subprocess
    import sys
    import textwrap
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                            text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_the_reference_adapter_imports_no_framework():
    _fresh_python("""
        import sys
        from shared import TransformerConfig
        from shared.batches import src_tgt
        from shared.weights import random_weights
        from twins import backends, cli
        config = TransformerConfig.preset("tiny")
        adapter = backends.make_adapter("reference", config, random_weights(config, 0))
        src, tgt = src_tgt(config, 2, 5, 4, seed=0)
        assert adapter.logits(src, tgt).shape == (2, 4, config.tgt_vocab)
        assert adapter.greedy(src, 3).tokens.shape == (2, 3)
        assert adapter.beam(src, 3, 2).tokens.shape == (2, 3)
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in
                       {"torch", "tensorflow", "keras", "torch_impl", "tf_impl"})
        assert not heavy, heavy
    """)


# -- data -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("task", ["copy", "dates"])
def test_training_data_is_a_function_of_seed_and_step(task):
    if task == "dates":
        pytest.importorskip("babel")
    a, b = tasks.TrainingData(task, 5, 16), tasks.TrainingData(task, 5, 16)
    for x, y in zip(a.batch(7), b.batch(7)):
        np.testing.assert_array_equal(x, y)
    assert not np.array_equal(a.batch(7)[0], a.batch(8)[0])
    held = {tuple(s) for s in tasks.heldout(task, tasks.HELDOUT_EXCLUDED).sources}
    for step in range(1, 30):
        src = a.batch(step)[0]
        assert src.shape[0] == 16
        assert not any(tuple(int(t) for t in row if t != data.PAD_ID) in held for row in src)
    # `TaskSpec.shortest_source`, a floor of every source's length (`twins train`'s memory check),
    # is the shortest there is: the first 2000 held-out examples reach it (dates: "1/1/00" forms)
    assert min(len(s) for s in tasks.heldout(task, 2000).sources) == tasks.spec(task).shortest_source


def test_exact_match_needs_eos():
    targets = [[5, 6], [5, 6], [5, 6]]
    tokens = np.array([[5, 6, data.EOS_ID], [5, 6, 7], [5, 7, data.EOS_ID]])
    assert tasks.exact(tokens, targets).tolist() == [True, False, False]


# -- errors ---------------------------------------------------------------------------------------
def test_unknown_task_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["train", "--task", "poems", "--backend", "torch", "--steps", "1", "--checkpoint",
              str(tmp_path / "x")])
    assert exc.value.code == 2
    assert "invalid choice: 'poems'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--steps", "0"], "--steps: expected an int >= 1, got 0"),
    (["--steps", "2", "--batch", "0"], "--batch: expected a positive number, got 0"),
    (["--steps", "2", "--smoothing", "1.5"], "--smoothing: expected a value in [0, 1), got 1.5"),
    (["--steps", "2", "--seed", "-1"], "--seed: expected an int in [0, 2147483647], got -1"),
    (["--steps", "2", "--seed", str(2**32)], "--seed: expected an int in [0, 2147483647], got 4294967296"),
])
def test_bad_train_arguments(tmp_path, capsys, argv, message):
    code, _, err = cli(capsys, "train", "--task", "copy", "--backend", "torch", "--checkpoint",
                       tmp_path / "x", *argv)
    assert code == 2 and message in err, err
    assert not (tmp_path / "x").exists()


def test_train_refuses_foreign_directory_and_mismatched_resume(runs, tmp_path, capsys):
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    code, _, err = cli(capsys, "train", "--task", "copy", "--backend", "torch", "--steps", "1",
                       "--checkpoint", tmp_path / "other")
    assert code == 2 and "holds other files" in err
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    code, _, err = cli(capsys, "train", "--task", "dates", "--backend", "torch", "--steps", "1",
                       "--checkpoint", runs["torch"])
    assert code == 2 and "a run of the copy task, not dates" in err
    code, _, err = cli(capsys, "train", "--task", "copy", "--backend", "torch", "--steps", "1",
                       "--checkpoint", runs["torch"], "--seed", "4")
    assert code == 2 and "has seed 3" in err


def test_decode_errors(runs, tmp_path, capsys):
    code, _, err = cli(capsys, "decode", "--checkpoint", tmp_path / "missing", "4 5")
    assert code == 2 and "no such file or directory" in err
    code, _, err = cli(capsys, "decode", "--checkpoint", runs["torch"])
    assert code == 2 and "nothing to decode" in err
    code, _, err = cli(capsys, "decode", "--checkpoint", runs["torch"], "4 five")
    assert code == 2 and "space-separated symbol ids 4..13" in err
    code, _, err = cli(capsys, "decode", "--checkpoint", runs["torch"], "--task", "dates", "jan 1 2000")
    assert code == 2 and "train log says copy" in err
    code, _, err = cli(capsys, "figures", "--out", tmp_path / "f", "--checkpoint", tmp_path / "missing")
    assert code == 2 and "no such file or directory" in err
