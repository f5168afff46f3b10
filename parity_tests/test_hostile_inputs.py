"""Issue 26: nothing silently wrong, nothing that takes the machine down, under hostile input.

Resource bounds (`shared.threads`): ``--threads`` and ``--workers`` far past the machine are refused
by the parent, as a usage error naming the flag, the bound and why, before any framework starts or
any worker is launched; a dead data-parallel worker is one line naming its rank and signal.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shared.threads import check_threads, check_worker_count, machine_cpus, max_threads, max_workers

ROOT = Path(__file__).resolve().parents[1]
HUGE = "1000000"
TRAIN = ["train", "--task", "copy", "--backend", "torch", "--steps", "1"]


def _run_in_fresh_python(code: str, tmp_path: Path) -> tuple[list[dict], list[str]]:
    """Run ``code`` in a new interpreter (so "no framework imported" means something); it prints one
    JSON line per case. TMPDIR is ``tmp_path``: a launcher would leave its entries there."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TMPDIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr.splitlines()


def test_huge_threads_and_workers_are_refused_at_once_with_nothing_started(tmp_path):
    cases = [
        ["decode", "--checkpoint", "nowhere", "--threads", HUGE, "1 2"],
        ["compare", "--threads", HUGE],
        [*TRAIN, "--checkpoint", "run", "--threads", HUGE],
        [*TRAIN, "--checkpoint", "run", "--workers", HUGE],  # no --batch: the task's (128)
        [*TRAIN, "--checkpoint", "run", "--workers", HUGE, "--batch", HUGE],
        [*TRAIN[:4], "tf", *TRAIN[5:], "--checkpoint", "run", "--workers", HUGE],
    ]
    results, errors = _run_in_fresh_python(f"""
        import json, sys, time
        from twins.cli import main
        for argv in {cases!r}:
            start = time.perf_counter()
            rc = main(argv)
            print(json.dumps({{"rc": rc, "seconds": time.perf_counter() - start,
                              "frameworks": sorted({{"torch", "tensorflow"}} & set(sys.modules))}}))
    """, tmp_path)
    assert len(results) == len(errors) == len(cases), errors
    for argv, result, error in zip(cases, results, errors):
        flag = "--threads" if "--threads" in argv else "--workers"
        assert result["rc"] == 2 and result["seconds"] < 5 and result["frameworks"] == [], (argv, result)
        assert error.startswith(f"twins {argv[0]}: error: {flag} {HUGE}: expected at most "), error
        assert f"logical CPU" in error and error.endswith(f"got {HUGE}"), error
    assert "global batch (128;" in errors[3] and f"global batch ({HUGE};" in errors[4]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run directory, no torchelastic_* entries


def test_the_bounds_come_from_the_machine_and_the_batch():
    cpus = machine_cpus()
    assert cpus >= len(os.sched_getaffinity(0)) and cpus >= (os.cpu_count() or 1)
    assert max_threads() == cpus and check_threads(cpus) == cpus and check_threads(None) is None
    assert max_workers(10**6) == cpus and max_workers(1) == 1
    assert check_worker_count(1, 1) == 1
    with pytest.raises(ValueError, match=r"^--workers 2: expected at most 1: .*global batch \(1;"):
        check_worker_count(2, 1)
    with pytest.raises(ValueError, match=rf"^--nproc {cpus + 1}: expected at most {cpus}: one worker per "
                                         rf"logical CPU of this machine \({cpus};"):
        check_worker_count(cpus + 1, 10**6, "--nproc")
    for bad in (0, -3, True, 2.0, "2"):
        with pytest.raises(ValueError, match=r"^--threads: expected an int >= 1, got "):
            check_threads(bad)


def test_a_benchmark_refuses_huge_threads_as_a_usage_error():
    proc = subprocess.run([sys.executable, "benchmarks/step_layouts.py", "--threads", HUGE], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"argument --threads: expected at most {max_threads()}, the logical CPUs" in proc.stderr


def test_a_dead_worker_is_named_with_its_rank_and_signal():
    from twins.parallel import failure_message
    killed = {0: -signal.SIGTERM, 1: -signal.SIGKILL}
    assert failure_message(killed) == ("worker rank 1 killed by SIGKILL (the launcher then stopped "
                                       "rank 0 with SIGTERM)")
    assert failure_message({0: -signal.SIGTERM}) == "worker rank 0 killed by SIGTERM"
    assert failure_message({2: 1, 0: -15, 1: -15}) == ("worker rank 2 exited with status 1 (the "
                                                        "launcher then stopped ranks 0, 1 with SIGTERM)")
    assert failure_message({0: -200}) == "worker rank 0 killed by signal 200"


def test_a_killed_worker_is_one_line_and_exit_1(monkeypatch, capsys):
    """The launcher's report of a worker killed by SIGKILL (the other stopped by it): `twins train`
    says which rank died and how, on one line, with exit status 1 (not an unexpected error)."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    import torch.distributed.launcher.api as api
    from twins.cli import main

    def launcher(config, entrypoint):
        def run(*args):
            failures = {0: ProcessFailure(0, 101, -signal.SIGTERM, ""),
                        1: ProcessFailure(1, 102, -signal.SIGKILL, "")}
            raise ChildFailedError("twins", failures)
        return run

    monkeypatch.setattr(api, "elastic_launch", launcher)
    monkeypatch.setattr("shared.threads.machine_cpus", lambda: 2)  # two workers pass on any machine
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # launch sets it
    assert main([*TRAIN, "--checkpoint", "unused", "--workers", "2", "--batch", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["twins train: error: --workers 2: worker rank 1 killed by SIGKILL (the launcher then "
                   "stopped rank 0 with SIGTERM)"]
