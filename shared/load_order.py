"""The one rule for the order in which native libraries load into a process that holds both
frameworks: triton before TensorFlow. Imports nothing but the standard library (and triton, where
it is installed).

Why: TensorFlow 2.20 and later load their library with ``RTLD_GLOBAL``, which puts the LLVM that
TensorFlow links statically into the process's global symbols. triton, which torch's CUDA builds
install and which torch imports lazily (its first optimizer, ``torch.compile``), links an LLVM of
its own; loaded after TensorFlow, its initialisers bind to TensorFlow's copy and the process dies
of SIGSEGV inside ``dlopen`` (triton 3.9: aborts, "LLVM ERROR: inconsistency in registered
CommandLine options"), with no Python error (tensorflow/tensorflow#124205). Loaded before
TensorFlow, each keeps its own. Measured here (docs/compatibility.md): torch 2.14.1+cu130 with
triton 3.8.0 and TensorFlow 2.21.0, ``import tensorflow; import triton`` exits with signal 11, and
the parity suite died of it nine times (constructing ``torch.optim.Adam``: 8 tests failed and
pytest's xdist stopped); with triton loaded first, it passes, as it does on torch 2.15.0+cu132.
A CPU build of torch installs no triton, and nothing here changes for it.

`load_triton_first` runs as torch_impl and tf_impl are imported, before their framework, and in
the parity suite's conftest, so that any order of importing the two backends is safe. A process
that imported TensorFlow itself before either backend gets a warning naming the cause: by then no
import order can help, and the crash comes later, at torch's first use of triton.
"""
from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

ISSUE = "https://github.com/tensorflow/tensorflow/issues/124205"


def load_triton_first() -> None:
    """Import triton now if it is installed and TensorFlow is not loaded yet (triton's own import:
    about 0.1 s); a `RuntimeWarning` if TensorFlow is loaded and triton is not. Nothing when
    triton is loaded already or not installed."""
    if "triton" in sys.modules or importlib.util.find_spec("triton") is None:
        return
    if "tensorflow" not in sys.modules:
        try:
            importlib.import_module("triton")
        except Exception:  # noqa: BLE001  (a broken triton is torch's to report, where torch uses it)
            pass
        return
    warnings.warn(
        "TensorFlow was imported before triton, which is installed (torch's CUDA builds bring it): "
        "the first torch optimizer or torch.compile imports triton, and triton loaded after "
        f"TensorFlow kills the process (SIGSEGV or an LLVM abort, {ISSUE}). Import torch_impl, "
        "tf_impl or triton before tensorflow or keras.", RuntimeWarning, stacklevel=2)
