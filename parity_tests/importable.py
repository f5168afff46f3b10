"""What the suite may import: the ``TWINS_BLOCK`` import blocker, and which frameworks are present.

``TWINS_BLOCK=tensorflow,keras`` (top-level package names, comma-separated) makes installed packages
look absent, as in an environment that never had them: ``import keras`` raises
``ModuleNotFoundError: No module named 'keras'`` and ``importlib.util.find_spec("keras")`` is None,
so every "is it installed?" check in the product and the suite takes its no-framework branch. It is
how one environment proves the suite in a torch-only and a TensorFlow-only one (``.ci/run``) and how
test_imports.py proves the dependency rule in fresh interpreters.

Where it applies: parity_tests/conftest.py calls `install_from_env` in the test process and in
every pytest-xdist worker, and puts `SITE` on ``PYTHONPATH`` (`environ`), whose ``sitecustomize.py``
installs it in every Python subprocess the tests start (``python -m twins``, ``python -c``) unless
the subprocess ignores the environment (``python -I``: test_saved_model's server, which blocks what
it must not see itself). Only imports are hidden; the distributions' metadata
(``importlib.metadata.version("torch")``) still answers.

Standard library only: it runs in ``sitecustomize``, before anything else is imported.
"""
from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Iterable, Mapping

ENV = "TWINS_BLOCK"
SITE = Path(__file__).resolve().parent / "blocked_site"  # holds the subprocesses' sitecustomize.py

# The first lines of a script run as ``python -I -c SCRIPT WORK NAMES ...``, which ignores
# ``PYTHONPATH`` (so neither `SITE` nor the project reaches it): from then on every import under the
# top-level packages NAMES (``sys.argv[2]``, comma-separated) raises ImportError, however the
# importer guards it. The servers of test_saved_model.py and test_onnx.py start so; it defines
# ``BLOCKED``, the set of those names, for their checks of ``sys.modules``.
ISOLATED_BLOCK = """\
import sys
BLOCKED = set(sys.argv[2].split(","))
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"blocked import of {name}")
sys.meta_path.insert(0, Block())
"""

# The suite's frameworks (the `torch` and `tf` markers of pyproject.toml) and the top-level packages
# each needs: tf_impl is TensorFlow and Keras 3.
FRAMEWORKS = {"torch": ("torch",), "tf": ("tensorflow", "keras")}


def blocked(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """The top-level package names ``environ`` blocks (empty when ``TWINS_BLOCK`` is unset)."""
    return frozenset(n.strip() for n in environ.get(ENV, "").split(",") if n.strip())


class _Hiding:
    """A `sys.meta_path` finder wrapped so that it finds nothing under the blocked top-level
    packages. Wrapping (instead of a finder in front that raises) is what makes a blocked package
    indistinguishable from a missing one: ``find_spec`` answers None, ``import`` raises the
    interpreter's own ``ModuleNotFoundError``."""

    def __init__(self, finder, names: frozenset[str]):
        self.finder, self.names = finder, names

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names or not hasattr(self.finder, "find_spec"):
            return None
        return self.finder.find_spec(name, path, target)

    def __getattr__(self, attr):  # invalidate_caches, find_distributions, ...
        return getattr(self.finder, attr)

    def __repr__(self) -> str:
        return f"<hiding {sorted(self.names)} from {self.finder!r}>"


def install(names: Iterable[str]) -> None:
    """Hide the top-level packages ``names`` from every import that follows in this process (in
    addition to those hidden already). Refuses (RuntimeError) a package that is already imported:
    hiding it then would be a lie."""
    names = frozenset(names)
    if not names:
        return
    loaded = sorted(m for m in sys.modules if m.partition(".")[0] in names)
    if loaded:
        raise RuntimeError(f"{ENV}: cannot block {sorted(names)}: already imported: {loaded[:5]}")
    finders = []
    for finder in sys.meta_path:
        if isinstance(finder, _Hiding):
            names |= finder.names
            finder = finder.finder
        finders.append(finder)
    sys.meta_path[:] = [_Hiding(finder, names) for finder in finders]
    importlib.invalidate_caches()


def install_from_env(environ: Mapping[str, str] = os.environ) -> frozenset[str]:
    """`install` what ``TWINS_BLOCK`` names; returns those names."""
    names = blocked(environ)
    install(names)
    return names


def environ(extra: Iterable[str] = (), base: Mapping[str, str] = os.environ) -> dict[str, str]:
    """A copy of ``base`` for a subprocess that blocks what ``base`` blocks and ``extra`` too:
    ``TWINS_BLOCK`` set to the union, `SITE` first on ``PYTHONPATH`` (unchanged if nothing is
    blocked)."""
    env = dict(base)
    names = blocked(base) | frozenset(extra)
    if names:
        if names != blocked(base):
            env[ENV] = ",".join(sorted(names))
        paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(SITE)]
        env["PYTHONPATH"] = os.pathsep.join([str(SITE), *paths])
    return env


def project_environ(root: Path | str, base: Mapping[str, str] = os.environ, **overrides: str) -> dict[str, str]:
    """The environment for a Python subprocess that imports the project from ``root``: ``base``
    with ``overrides``, ``root`` first on ``PYTHONPATH`` and what ``base`` had there after it (the
    blocker's `SITE`, a machine's own extra packages), so that what ``base`` blocks stays blocked
    (`environ`). Setting ``PYTHONPATH`` to ``root`` alone dropped `SITE`: the subprocess imported
    what the suite had blocked (CI's torch-only leg ran TensorFlow in ``python -m twins``)."""
    paths = [str(root)] + [p for p in base.get("PYTHONPATH", "").split(os.pathsep) if p and p != str(root)]
    return environ(base={**base, **overrides, "PYTHONPATH": os.pathsep.join(paths)})


def present(framework: str) -> bool:
    """Whether every package of ``framework`` (a key of `FRAMEWORKS`) can be imported here."""
    return all(importlib.util.find_spec(name) is not None for name in FRAMEWORKS[framework])


def absence(framework: str) -> str:
    """Why ``framework`` is missing, for a skip reason: blocked (and by what) or not installed."""
    gone = [name for name in FRAMEWORKS[framework] if importlib.util.find_spec(name) is None]
    why = f"blocked by {ENV}={os.environ[ENV]}" if set(gone) & blocked() else "not installed"
    return f"{', '.join(gone)} ({why})"
