import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

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
    model's float32 trace 5.4 s -> 1.4 s). Numbers are unaffected: CPU kernels reduce in the same
    order whatever the thread count."""
    if importlib.util.find_spec("torch") is None:
        yield
        return
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
