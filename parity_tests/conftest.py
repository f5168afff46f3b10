import os

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

from hypothesis import HealthCheck, settings  # noqa: E402

# Deterministic, bounded property tests: CI runs the same examples every time.
settings.register_profile("default", deadline=None, max_examples=25, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
