import atexit
import gc
import importlib.util
import os
import sys

from parity_tests import importable

# TWINS_BLOCK=tensorflow,keras (or torch): the suite as in an environment without those packages,
# here and, through the environment, in every subprocess a test starts (parity_tests/importable.py).
# First: nothing may import them before the blocker is in place.
importable.install_from_env()
os.environ.update(importable.environ())

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

# Under pytest-xdist every worker is a process of its own, and `python3 dev.py test` starts one per
# core. Each framework would otherwise start a thread per core in every worker: N workers x N
# threads on N cores, and PyTorch's OpenMP threads spin-wait, so an oversubscribed run is several
# times slower than a serial one. One thread per worker keeps every core busy with one test. Set
# before either framework is imported (both read these when they start their thread pools). A
# thread count can change float32 rounding (how a product is blocked), never the algorithm: the
# suite passes serially with the frameworks' defaults and under xdist with one thread.
if os.environ.get("PYTEST_XDIST_WORKER"):
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "TF_NUM_INTRAOP_THREADS",
                  "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(_name, "1")

# Test modules import TensorFlow themselves, some before either backend: triton (where torch's
# CUDA build installed it) is loaded first, or torch's first optimizer crashes the worker. Imported
# here, after the thread settings: `shared` imports NumPy, whose BLAS sizes its pool as it loads.
from shared.load_order import load_triton_first  # noqa: E402

load_triton_first()

# The cyclic garbage collector's first generation runs every 700 allocations by default; tracing
# TF functions and building Keras models allocate millions of objects, most of them alive until the
# test ends, so most of those collections find nothing. Fewer of them, and everything alive after
# collection (both frameworks' modules) frozen out of later full collections
# (`pytest_collection_finish`): the whole suite (`python3 dev.py test`, 2 workers, quiet machine)
# took 174 and 179 s instead of 198 and 189 s with the interpreter's defaults, 337 and 340 s of CPU
# instead of 378 and 362 (runs interleaved); a first generation of 100,000 gained nothing more. Only
# when cycles are collected changes, never what is freed. PARITY_DEFAULT_GC=1 keeps the defaults
# (to measure this again).
DEFAULT_GC = bool(os.environ.get("PARITY_DEFAULT_GC"))
if not DEFAULT_GC:
    gc.set_threshold(10_000, 20, 20)

import pytest  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

# Deterministic, bounded property tests: CI runs the same examples every time.
settings.register_profile("default", deadline=None, max_examples=25, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """One torch intra-op thread per test process. The suite's models are small and the machine has
    2 cores shared with TF (and with pytest-xdist workers): measured 2-10x faster than torch's
    default of one thread per core spinning against each other (gradcheck 6.1 s -> 0.6 s, the base
    model's float32 trace 5.4 s -> 1.4 s). A thread count may change float32 rounding (how a
    product is split), never the algorithm: the bounds of `shared.tolerances` hold at either count."""
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def pytest_configure(config):
    """The modules go out to xdist's workers in collection order (`SLOWEST_FIRST`): its option
    ``loadscopereorder`` (pytest-xdist 3.6 and later; absent before, which kept the order) off."""
    if getattr(config.option, "loadscopereorder", None):
        config.option.loadscopereorder = False


def pytest_collection_finish(session):
    """Every test module is imported now, and with them both frameworks: move what exists into the
    permanent generation, so later full collections do not walk the frameworks' modules again."""
    if not DEFAULT_GC:
        gc.collect()
        gc.freeze()


# A pytest-xdist worker that has run its share of the suite holds both frameworks and every object
# the tests left alive (5 GB). The interpreter's finalization then frees them one by one, and xdist
# waits for every worker to exit before the run ends (a timeline of one run: 8.5 s from the last
# test to the end). So a worker whose session finished (passed or failed) runs every exit handler
# as usual (coverage's, tempfile's, the tests' own), then exits without finalizing: the operating
# system takes the memory back at once. Nothing a test wrote is lost (files are closed by then;
# results went to the controller with the session's end). The whole suite (`python -m pytest
# parity_tests -n 2 --dist loadfile`, this 2-core machine, runs interleaved): 231.7 and 217.5 s,
# against 241.8 and 238.7 s with the interpreter's own exit. PARITY_FULL_EXIT=1 keeps that exit.
FULL_EXIT = bool(os.environ.get("PARITY_FULL_EXIT"))


def _exit_without_finalizing() -> None:
    """Registered last, so called first of the exit handlers: call the others, in their order,
    flush, and end the process (an interpreter without ``atexit._run_exitfuncs``: its own exit)."""
    run_others = getattr(atexit, "_run_exitfuncs", None)
    if run_others is None:
        return
    atexit.unregister(_exit_without_finalizing)
    run_others()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # None, or closed
            pass
    os._exit(0)


def pytest_sessionfinish(session, exitstatus):
    """In a pytest-xdist worker whose tests ran (passed or failed): exit without finalizing."""
    if os.environ.get("PYTEST_XDIST_WORKER") and not FULL_EXIT and exitstatus in (0, 1):
        atexit.register(_exit_without_finalizing)


# Parameter values that name a backend of one framework: `backends.Backend` and the decoding
# backends carry ``.framework``; the string params name a framework or its package.
_PARAM_FRAMEWORKS = {"torch": "torch", "torch-cuda": "torch", "torch_impl": "torch",
                     "tf": "tf", "tf-eager": "tf", "tf-function": "tf", "tf-xla": "tf", "tf_impl": "tf"}


def _frameworks(item) -> set[str]:
    """The frameworks ``item`` needs: its ``torch`` / ``tf`` markers, and any parameter (fixture
    params included) whose value names a backend of one framework."""
    needed = {m.name for m in item.iter_markers() if m.name in importable.FRAMEWORKS}
    callspec = getattr(item, "callspec", None)
    for value in callspec.params.values() if callspec else ():
        name = getattr(value, "framework", value)
        if isinstance(name, str) and name in _PARAM_FRAMEWORKS:
            needed.add(_PARAM_FRAMEWORKS[name])
    return needed


# The slowest modules, slowest first (seconds of tests in one worker, summed from `python3 dev.py
# test --durations=0`, 2 workers, 2026-11-26): `--dist loadfile` hands whole modules to the workers
# in collection order, one as each worker frees up, so a heavy module collected last ran alone at
# the end while the other worker idled (test_variants_parity, 30 s, is near the end
# alphabetically). Started slowest first (every module over 5 s), the light ones fill in behind
# them. Only the order changes. `pytest_configure` turns off xdist's own reordering
# (``--loadscope-reorder``, its default from 3.6): it sends the modules out by their number of
# tests instead (the main checkout's suite: 232 s in this order, 238 s in xdist's, the same hour;
# the machine's noise is about as large).
SLOWEST_FIRST = ("test_decoding", "test_variants_parity", "test_parity", "test_saved_model",  # 40 30 29 28
                 "test_half_precision", "test_demos", "test_distributed", "test_imports",  # 24 24 24 23
                 "test_train_hostile", "test_tf_only", "test_adapted_layers", "test_cli_compare",  # 19 16 14 11
                 "test_training_parity", "test_onnx", "test_reliability_saving",  # 10 9 7
                 "test_decoding_stub", "test_checkpoints", "test_hypothesis", "test_training",  # 7 7 6 6
                 "test_reliability_cli", "test_hostile_tf", "test_interop_marian")  # 6 6 5


def pytest_collection_modifyitems(config, items):
    """A test that needs a framework that is not importable here (not installed, or blocked by
    TWINS_BLOCK) is skipped with the reason, never run to fail on the import. Modules in
    `SLOWEST_FIRST` order first (a stable sort: tests within a module, and the other modules, keep
    their order)."""
    missing = {name: importable.absence(name) for name in importable.FRAMEWORKS
               if not importable.present(name)}
    for item in items:
        reasons = [missing[name] for name in sorted(_frameworks(item)) if name in missing]
        if reasons:
            item.add_marker(pytest.mark.skip(reason="needs " + "; ".join(reasons)))
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))
