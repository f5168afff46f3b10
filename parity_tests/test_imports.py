"""The dependency rule of docs/design.md, proved in fresh interpreters."""
import subprocess
import sys
import textwrap

import pytest

BLOCKER = textwrap.dedent("""
    import sys
    class _Block:
        def __init__(self, names): self.names = names
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.names:
                raise ImportError(f"blocked import of {name}")
    sys.meta_path.insert(0, _Block(BLOCKED))
""")


def run(code: str, blocked: set[str]) -> subprocess.CompletedProcess:
    script = BLOCKER.replace("BLOCKED", repr(blocked)) + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)


def test_shared_imports_neither_framework():
    result = run("""
        import shared, shared.reference, shared.weights, shared.checks
        heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'torch', 'tensorflow', 'keras'})
        assert not heavy, heavy
    """, blocked=set())
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("package, blocked", [
    ("torch_impl", {"tensorflow", "keras", "tf_keras"}),
    ("tf_impl", {"torch"}),
])
def test_backend_imports_without_the_other_framework(package, blocked):
    result = run(f"""
        import {package}
        import pkgutil, importlib
        for info in pkgutil.walk_packages({package}.__path__, "{package}."):
            importlib.import_module(info.name)
    """, blocked=blocked)
    assert result.returncode == 0, result.stderr


def test_the_blocker_blocks():
    """Guards the tests above against passing vacuously."""
    result = run("import json; import torch", blocked={"torch"})
    assert result.returncode != 0 and "blocked import of torch" in result.stderr
