import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from hypothesis import HealthCheck, settings  # noqa: E402

# Deterministic, bounded property tests: CI runs the same examples every time.
settings.register_profile("default", deadline=None, max_examples=25, derandomize=True,
                          suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))
