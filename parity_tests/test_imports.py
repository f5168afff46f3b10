"""The dependency rule of docs/design.md: proved in fresh interpreters, and read off the source."""
import ast
import subprocess
import sys
import textwrap
from pathlib import Path

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


def test_exporters_import_no_target_library():
    """`shared.exporters` imports CTranslate2 only inside the export: importing it (and the command
    line that offers ``--to ctranslate2``) works with ctranslate2 and both frameworks blocked."""
    result = run("""
        import shared, shared.exporters, shared.exporters.ctranslate2, twins.convert
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in {'ctranslate2', 'torch', 'tensorflow', 'keras'})
        assert not loaded, loaded
    """, blocked={"ctranslate2", "torch", "tensorflow", "keras"})
    assert result.returncode == 0, result.stderr


def test_the_importers_import_no_framework_and_h5py_only_to_read():
    """The Keras importers read files with h5py, imported when a file is read; keras_hub never."""
    result = run("""
        import shared.importers, twins.convert
        loaded = sorted(m for m in sys.modules
                        if m.split('.')[0] in {'torch', 'tensorflow', 'keras', 'keras_hub', 'h5py'})
        assert not loaded, loaded
    """, blocked={"keras_hub"})
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


def test_optional_libraries_are_never_imported_by_the_product():
    """transformers, ctranslate2 and keras_hub are the 'interop' extra, onnx and onnxruntime the
    'onnx' one: imported only inside the functions that need them, so importing every product
    module loads none of them (and the
    Marian/FSMT importers and the Marian exporter run with them blocked)."""
    result = run("""
        import pkgutil, importlib
        import shared, torch_impl, tf_impl, twins
        for pkg in (shared, torch_impl, tf_impl, twins):
            for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
                if not info.name.endswith("__main__"):  # running the command line is not importing
                    importlib.import_module(info.name)
        loaded = sorted(m for m in sys.modules if m.split('.')[0] in {'transformers', 'ctranslate2', 'keras_hub', 'onnx', 'onnxruntime'})
        assert not loaded, loaded
    """, blocked=set())
    assert result.returncode == 0, result.stderr
    result = run("""
        import tempfile
        from shared import TransformerConfig
        from shared.exporters import to_marian
        from shared.importers import from_marian
        from shared.weights import random_weights
        config = TransformerConfig(src_vocab=9, tgt_vocab=9, d_model=8, n_heads=2, d_ff=8, n_encoder_layers=1,
                                   n_decoder_layers=1, max_len=8, norm_eps=1e-5, pe_layout="halves")
        path = tempfile.mkdtemp() + "/m"
        to_marian(path, config, random_weights(config))
        assert from_marian(path)[0] == config
    """, blocked={"transformers", "torch", "tensorflow", "ctranslate2"})
    assert result.returncode == 0, result.stderr


def test_the_command_line_imports_without_a_framework():
    """`twins` and its command modules (the SavedModel export's included) start with neither
    framework: each imports one only when a command needs it."""
    result = run("""
        import twins.cli, twins.convert, twins.saved_model
    """, blocked={"torch", "tensorflow", "keras", "tf_keras"})
    assert result.returncode == 0, result.stderr


def test_the_blocker_blocks():
    """Guards the tests above against passing vacuously."""
    result = run("import json; import torch", blocked={"torch"})
    assert result.returncode != 0 and "blocked import of torch" in result.stderr


# -- the import graph, read from the source (deferred imports inside functions count too) ----------
ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("shared", "torch_impl", "tf_impl", "twins")


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports, anywhere in the file (a function body included)."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against this module's package
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}  # `from pkg import module`
    return found


def import_graph(packages=PRODUCT + ("parity_tests",)) -> dict[str, set[str]]:
    """``{module: project modules it imports}`` over the given top-level packages."""
    files = [p for pkg in packages for p in sorted((ROOT / pkg).rglob("*.py"))]
    modules = {_module_name(p) for p in files}
    return {_module_name(p): {m for m in _imports(p) if m in modules and m != _module_name(p)}
            for p in files}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                out.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_deferred_imports_counted():
    """A package importing its own submodules in ``__init__`` is the one allowed loop (the package
    is not a module of its own: it re-exports); every other cycle is a design error."""
    graph = import_graph()
    for pkg in {m for m in graph if m in PRODUCT + ("parity_tests",)}:  # drop package -> submodule
        graph[pkg] = set()
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_deferred_cycle():
    """Guards the test above against passing vacuously: a cycle only through a function body."""
    graph = {"a.model": {"a.checkpoints"}, "a.checkpoints": {"a.model"}, "a.other": set()}
    assert _cycles(graph) == [["a.checkpoints", "a.model"]]
    assert "torch_impl.model" in import_graph()["torch_impl.checkpoints"]  # relative imports resolved


def test_the_product_never_imports_the_test_package():
    graph = import_graph()
    offenders = {m: sorted(d for d in deps if d.split(".")[0] == "parity_tests")
                 for m, deps in graph.items() if m.split(".")[0] in PRODUCT}
    assert {m: d for m, d in offenders.items() if d} == {}
