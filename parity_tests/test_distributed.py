"""Data-parallel training on each framework's own engine equals one-process training on the whole
batch: torch DDP over gloo (2 processes started by torchrun) and TF MirroredStrategy (2 logical CPU
devices of one process), each against its own backend's one-process `train_step`, and against each
other; bad input fails on every worker; `twins train --workers 2` writes one run directory.

Spawning is the cost here: one module-scoped run per engine (`distributed_worker.py`: a 1+1-layer
model, 4 Adam + Noam steps, float64 then float32), both started at once. Attention key biases are
gradient-free (test_training_parity's docstring): Adam turns their rounding noise into moves of
about ``lr * noise / eps``, so they are compared apart, as there.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")

from parity_tests import importable  # noqa: E402
from parity_tests.distributed_worker import STEPS, WARMUP, FACTOR, config  # noqa: E402
from shared import noam_lr  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EPS = 1e-9  # Adam's (both backends)


def _env() -> dict:
    return importable.project_environ(ROOT, OMP_NUM_THREADS="1", TF_NUM_INTRAOP_THREADS="1",
                                      TF_NUM_INTEROP_THREADS="1", TF_CPP_MIN_LOG_LEVEL="2")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """Both engines' trajectories (and what their workers raised), run side by side."""
    out = tmp_path_factory.mktemp("distributed")
    worker = ["-m", "parity_tests.distributed_worker"]
    torch_cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                 "--log-dir", str(out / "torchrun"), *worker, "torch", str(out)]  # not /tmp/torchelastic_*
    tf_cmd = [sys.executable, *worker, "tf", str(out)]
    procs = [subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for cmd in (torch_cmd, tf_cmd)]
    logs = [p.communicate(timeout=600)[0] for p in procs]
    for p, log in zip(procs, logs):
        assert p.returncode == 0, log[-4000:]
    return out


def trajectory(runs: Path, backend: str, dtype: str):
    return np.load(runs / f"{backend}-{dtype}.npz")


def bound(dtype: str, pair: str):
    return FLOAT64 if dtype == "float64" else bound_for(dtype, pair)


def compare(got, expected, weight_bound, what: str) -> float:
    """Every weight after every step within the bound (key biases apart); returns their drift."""
    names = [k.split(".", 2)[2] for k in expected if k.startswith("step.1.")]
    drift = 0.0
    for step in range(1, STEPS + 1):
        for name in names:
            a, b = got[f"step.{step}.{name}"], expected[f"step.{step}.{name}"]
            if name.endswith(".key.bias"):
                drift = max(drift, float(np.abs(a - b).max()))
            else:
                assert_close(a, b, weight_bound, f"{what}: {name} after step {step}")
        assert_close(got[f"loss.{step}"], expected[f"loss.{step}"], weight_bound, f"{what}: loss {step}")
    return drift


def part(data, kind: str) -> dict:
    """One trajectory ("parallel" or "single") of a worker's file, keyed step.N.name / loss.N / lr.N."""
    out = {}
    for key in data.files:
        if key.startswith(f"{kind}."):
            out["step." + key[len(kind) + 1:]] = data[key]
        elif key.startswith(("loss.", "lr.")) and f".{kind}." in key:
            what, _, step = key.split(".")
            out[f"{what}.{step}"] = data[key]
    return out


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_two_workers_equal_one_process(runs, backend, dtype):
    data = trajectory(runs, backend, dtype)
    parallel, single = part(data, "parallel"), part(data, "single")
    d_model = config(dtype).d_model
    for step in range(1, STEPS + 1):
        assert parallel[f"lr.{step}"] == single[f"lr.{step}"] == noam_lr(step, d_model, WARMUP, FACTOR)
    assert float(parallel["loss.1"]) > 1.0  # a real loss, not a vanished one
    drift = compare(parallel, single, bound(dtype, "train:parallel:single"), f"{backend} 2 workers vs 1")
    if dtype == "float64":
        assert drift <= 2 * sum(noam_lr(np.arange(1, STEPS + 1), d_model, WARMUP, FACTOR)) * 1e-15 / EPS


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_torch_data_parallel_equals_tf_data_parallel(runs, dtype):
    torch_run = part(trajectory(runs, "torch", dtype), "parallel")
    tf_run = part(trajectory(runs, "tf", dtype), "parallel")
    compare(tf_run, torch_run, bound(dtype, "train:torch:tf"), "tf vs torch, 2 workers each")


def test_the_workers_moved_the_weights(runs):
    """Guards the comparisons above against passing on weights that never changed."""
    data = part(trajectory(runs, "torch", "float32"), "parallel")
    start = {k: v for k, v in data.items() if k.startswith("step.1.")}
    moved = max(float(np.abs(data[k.replace("step.1.", f"step.{STEPS}.")] - v).max()) for k, v in start.items())
    assert moved > 1e-3


def test_bad_input_fails_on_every_worker(runs):
    seen = [json.loads((runs / f"torch-errors-{rank}.json").read_text()) for rank in (0, 1)]
    for rank, s in enumerate(seen):
        assert "divides the global batch of 3 examples, got 2" in s["indivisible"], rank
        assert s["rate"] == "optimizer: expected a learning rate that is finite and >= 0, got nan", rank
        assert s["mismatch"] == ("workers disagree: rank 1's settings differ from rank 0's (warmup: "
                                 "500 != 400); start every worker with the same options and run"), rank
        assert s["agreed"] == "yes"
    assert seen[0]["failed"] == "ValueError: worker rank 1 failed: OSError: disk on fire"
    assert seen[1]["failed"] == "OSError: disk on fire"
    tf_seen = json.loads((runs / "tf-errors-0.json").read_text())
    assert "divides the global batch of 3 examples, got 2" in tf_seen["indivisible"]


# -- the command line ------------------------------------------------------------------------------
TRAIN = ["train", "--task", "copy", "--backend", "torch", "--batch", "8", "--eval-every", "0",
         "--heldout", "4", "--no-progress"]


def test_a_resume_of_another_run_is_refused_by_the_launcher(tmp_path, monkeypatch, capsys):
    """A resume with another model or seed: refused by the launcher, from the run's log, before any
    worker starts (one message, not one a worker); the run is untouched. (What a real ``--workers 2``
    run trains and saves: test_train_hostile's one-worker signal test, whose run is compared with
    one process there.)"""
    from twins import parallel as twins_parallel
    from twins.cli import main

    run = tmp_path / "run"
    assert main([*TRAIN, "--steps", "1", "--threads", "1", "--checkpoint", str(run)]) == 0
    before = (run / "model.safetensors").read_bytes()
    launched = []
    monkeypatch.setattr(twins_parallel, "launch", lambda args: launched.append(args) or 0)
    capsys.readouterr()
    assert main([*TRAIN, "--steps", "1", "--workers", "2", "--preset", "tiny", "--checkpoint",
                 str(run)]) == 2
    err = capsys.readouterr().err
    assert launched == [] and err.count("twins train: error:") == 1, err
    assert f"--preset/--config: the run in {str(run)!r} has another model (" in err
    assert main([*TRAIN, "--steps", "1", "--workers", "2", "--seed", "9", "--checkpoint", str(run)]) == 2
    err = capsys.readouterr().err
    assert launched == [] and f"--seed 9: the run in {str(run)!r} has seed 0" in err, err
    assert (run / "model.safetensors").read_bytes() == before


def test_a_batch_the_workers_do_not_divide_is_refused_before_launching(capsys):
    from twins.cli import main
    assert main([*TRAIN, "--steps", "1", "--batch", "3", "--workers", "2", "--checkpoint", "unused"]) == 2
    assert ("--workers 2: expected a number of workers that divides the global batch of 3 examples, "
            "got 2") in capsys.readouterr().err
    assert not Path("unused").exists()
