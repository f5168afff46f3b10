#!/usr/bin/env python3
"""Set-up and everyday commands; needs only Python >= 3.11 on the machine.

    python3 dev.py demo [ARGS]   set up if needed, then run the main job (`twins compare ARGS`)
    python3 dev.py test [ARGS]   set up if needed, then run the parity suite (`pytest ARGS`)
    python3 dev.py test --quick  the contract parity tests of both backends only (under a minute:
                                 forward parity on the tiny variants, the mirror rule, attention,
                                 masks, reference decoding), for "I changed tf_impl"
    python3 dev.py bench NAME    set up if needed, then run benchmarks/NAME.py
    python3 dev.py setup         create .venv and install the project with pinned versions
    python3 dev.py floors [ARGS] the parity suite on the oldest versions pyproject.toml admits
                                 (.venv-floors, pinned by floors.txt; about 3 GB more, and
                                 downloads; for a change of a dependency's range, not for CI)

Set-up creates ``.venv`` beside this file and installs the project in editable mode with every
extra, pinned by ``constraints.txt`` (``.venv-floors`` and ``floors.txt`` for ``floors``). It is
redone only when pyproject.toml or the constraints file change.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Env:
    """A virtual environment dev.py creates and runs in, and the constraints file that pins it."""
    venv: Path
    constraints: Path

    @property
    def python(self) -> Path:
        if os.name == "nt":
            return self.venv / "Scripts" / "python.exe"
        return self.venv / "bin" / "python"


PINNED = Env(ROOT / ".venv", ROOT / "constraints.txt")  # development and CI
FLOORS = Env(ROOT / ".venv-floors", ROOT / "floors.txt")  # each range's lower bound (docs/compatibility.md)
EXTRAS = "torch,tf-cpu,test,demo,interop,onnx"
# `dev.py test --quick`: the contract parity tests of both backends, without the slow cases (the
# base-sized model, the compiled modes); measured in docs/performance.md.
QUICK = ["parity_tests/test_parity.py", "parity_tests/test_mirror.py", "parity_tests/test_attention.py",
         "parity_tests/test_masks.py", "parity_tests/test_decoding_reference.py",
         "-k", "not base and not compiled_modes"]
# Installed without their dependencies: keras-hub requires tensorflow-text, which would pull the full
# `tensorflow` distribution over tensorflow-cpu (keras_hub's layers import without it).
NO_DEPS = ("keras-hub",)
# The project on sys.path as a folder (a .pth line), not through setuptools' default import hook:
# that hook comes after the path, so a folder named `shared` (or `twins`, ...) in the current
# directory, with no __init__.py, took the import (`cannot import name 'TransformerConfig' from
# 'shared' (unknown location)`), as in the parent of this clone, which holds ../shared.
EDITABLE = ("--config-settings", "editable_mode=compat")
# Disk a new .venv needs: 3.0 GiB installed (`du -sh .venv` after `dev.py setup` in a fresh clone,
# Linux x86_64, Python 3.11), and room for the wheels pip downloads before it installs them.
NEW_VENV_BYTES = int(3.5 * 2**30)


def _stamp(env: Env) -> Path:
    digest = hashlib.sha256()
    for path in (ROOT / "pyproject.toml", env.constraints):
        digest.update(path.read_bytes())
    digest.update(EXTRAS.encode() + repr(NO_DEPS).encode() + repr(EDITABLE).encode())
    return env.venv / f".installed-{digest.hexdigest()[:16]}"


def _free() -> str:
    """The free disk space where .venv and the temporary files go, in words."""
    import tempfile
    places = {}  # one line per file system
    for place in (str(ROOT), tempfile.gettempdir()):
        places.setdefault(os.stat(place).st_dev, (place, shutil.disk_usage(place).free))
    return ", ".join(f"{free / 2**30:.1f} GiB free in {place}" for place, free in places.values())


def _check_disk(env: Env) -> None:
    """Refuse to start a new .venv that cannot fit: pip would fail part-way, after minutes."""
    free = shutil.disk_usage(ROOT).free
    if free < NEW_VENV_BYTES:
        sys.exit(f"dev.py: a new {env.venv} needs about {NEW_VENV_BYTES / 2**30:.1f} GiB of disk; {_free()}")


def _run(cmd: list[str], **kwargs) -> int:
    # On stderr: stdout is the command's own (`python3 dev.py demo --json - | python3 -m json.tool`).
    print("+", " ".join(str(c) for c in cmd), file=sys.stderr, flush=True)
    return subprocess.call([str(c) for c in cmd], cwd=ROOT, **kwargs)


def setup(env: Env = PINNED) -> None:
    if sys.version_info < (3, 11):  # constraints.txt's pins (numpy 2.4, hypothesis) need 3.11
        sys.exit(f"dev.py: Python >= 3.11 is required, this is {sys.version.split()[0]}")
    stamp = _stamp(env)
    if stamp.exists():
        return
    if not env.python.exists():
        _check_disk(env)
        print(f"creating {env.venv} and installing the project (about 2 minutes; pip is quiet)",
              file=sys.stderr, flush=True)
        venv.EnvBuilder(with_pip=True).create(env.venv)
    pip_env = {**os.environ, "PIP_CONSTRAINT": str(env.constraints), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    pip = [env.python, "-m", "pip", "install", "-q", "-c", env.constraints]
    if _run([*pip, *EDITABLE, "-e", f".[{EXTRAS}]"], env=pip_env) != 0:
        sys.exit(f"dev.py: installing the project failed (see pip's output above); {_free()}")
    if _run([*pip, "--no-deps", *NO_DEPS], env=pip_env) != 0:
        sys.exit(f"dev.py: installing {', '.join(NO_DEPS)} failed (see pip's output above)")
    for old in env.venv.glob(".installed-*"):
        old.unlink()
    stamp.touch()


def _workers(args: list[str]) -> list[str]:
    """``-n N --dist loadfile`` for pytest-xdist: one worker per core (at most 4: each holds both
    frameworks, about 1 GB), unless the caller chose (``-n``, ``--numprocesses``, ``--dist``,
    ``-p no:xdist``) or runs one core. ``loadfile``: each test module runs on one worker, so its
    module fixtures and caches (trained runs, traced TF functions, models) are built once, not once
    per worker; measured on the 2-core machine against ``load``: 456 s of CPU instead of 528, the
    suite 267 s instead of 305 (docs/design.md, "The suite")."""
    chosen = any(a.startswith(("-n", "--numprocesses", "--dist")) or a == "no:xdist" for a in args)
    cores = min(os.cpu_count() or 1, 4)
    return [] if chosen or cores < 2 else ["-n", str(cores), "--dist", "loadfile"]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    command, args = argv[0], argv[1:]
    if command not in ("setup", "demo", "test", "bench", "floors"):
        print(f"dev.py: unknown command {command!r}; expected setup, demo, test, bench or floors",
              file=sys.stderr)
        return 2
    where = FLOORS if command == "floors" else PINNED
    setup(where)
    python = where.python
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2")}
    if command == "setup":
        return 0
    if command == "demo":
        return _run([python, "-m", "twins", "compare", *args], env=env)
    if command == "bench":
        if not args:
            names = sorted(p.stem for p in (ROOT / "benchmarks").glob("*.py") if not p.stem.startswith("_"))
            print(f"dev.py bench: expected a benchmark name, one of {names}", file=sys.stderr)
            return 2
        return _run([python, ROOT / "benchmarks" / f"{args[0]}.py", *args[1:]], env=env)
    if "--quick" in args:
        args = QUICK + [a for a in args if a != "--quick"]
    code = _run([python, "-m", "pytest", *_workers(args), *args], env=env)
    if code == 5:  # pytest: no tests were collected; never a pass
        print(f"dev.py {command}: pytest collected no tests; failing", file=sys.stderr)
        return 1
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
