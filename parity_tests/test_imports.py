"""The dependency rule of docs/design.md: proved in fresh interpreters, and read off the source."""
import ast
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parity_tests import importable


def run(code: str, blocked: set[str]) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter where the packages ``blocked`` (and any the suite's
    ``TWINS_BLOCK`` blocks) look absent (`parity_tests.importable`)."""
    return subprocess.run([sys.executable, "-c", "import sys\n" + textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300, env=importable.environ(blocked))


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


def test_a_keras_file_without_h5py_names_the_file_and_the_install(tmp_path):
    """h5py arrives with Keras, but the Keras importers need only h5py (a torch-only install can
    port a Keras model): where it is missing, reading a ``.keras`` or ``.weights.h5`` (directly, or
    through the format registry that ``load_checkpoint`` and ``twins convert`` use) is an
    ImportError naming the file, the format and the install. Before: "No module named 'h5py'"."""
    for name in ("model.weights.h5", "model.keras"):
        (tmp_path / name).write_bytes(b"not read: h5py is checked first")
    result = run(f"""
        from shared import formats
        from shared.importers import read_keras_file
        for path in ({str(tmp_path / "model.weights.h5")!r}, {str(tmp_path / "model.keras")!r}):
            for read in (read_keras_file, lambda p: formats.read(p, format="keras-hub", bos_id=1, eos_id=2)):
                try:
                    read(path)
                except ImportError as err:
                    print(err)
                else:
                    raise AssertionError("read without h5py")
        from twins.cli import main
        assert main(["convert", {str(tmp_path / "model.keras")!r}, {str(tmp_path / "out")!r}, "--from",
                     "keras-hub", "--to", "torch", "--bos-id", "1", "--eos-id", "2"]) == 2
        assert "h5py" not in sys.modules
    """, blocked={"h5py"})
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 4, result.stdout
    # twins convert says it once, naming the conversion, not wrapped in "a library is not installed"
    assert result.stderr.strip() == (f"twins convert: error: {str(tmp_path / 'model.keras')} -> torch: "
                                     f"{lines[-1]}"), result.stderr
    for line, name in zip(lines, ["model.weights.h5"] * 2 + ["model.keras"] * 2):
        assert line == (f"{str(tmp_path / name)!r}: a Keras file (.keras, .weights.h5; --from keras-hub, "
                        "tf-tutorial) is read with h5py, which is not installed (No module named 'h5py'); "
                        "install the 'interop' extra, or h5py alone: pip install 'h5py>=3.11'"), line


@pytest.mark.parametrize("package", [pytest.param("torch_impl", marks=pytest.mark.torch),
                                     pytest.param("tf_impl", marks=pytest.mark.tf)])
def test_a_backend_imports_and_runs_without_the_other_framework(tmp_path, package):
    """In a fresh interpreter: every module of one backend imports, and `twins train` and `twins
    decode` run in it, leaving the other framework unimported; with the other backend's package
    unimportable, its adapter raises `Unavailable`. Where the other framework is installed this
    reads sys.modules instead of blocking the import, the stricter check (an import guarded by
    ``try`` would pass a block; torch's optimizer only probes for TensorFlow with find_spec); CI's
    one-framework legs run it with the other framework truly absent (``TWINS_BLOCK``)."""
    backend, other = ("torch", "tf") if package == "torch_impl" else ("tf", "torch")
    heavy = {"tensorflow", "keras", "tf_keras", "tf_impl"} if backend == "torch" else {"torch", "torch_impl"}
    run_dir = str(tmp_path / "run")
    fake = _fake_triton(tmp_path)
    result = run(f"""
        import importlib, pkgutil
        import pytest
        sys.path.insert(0, {str(fake)!r})  # a triton installed: the backend loads it before its framework
        import {package}
        import triton
        assert triton.LOADED_BEFORE == [], triton.LOADED_BEFORE  # shared/load_order.py
        del sys.modules["triton"]  # gone again: torch must not meet a fake
        sys.path.remove({str(fake)!r})
        for info in pkgutil.walk_packages({package}.__path__, "{package}."):
            importlib.import_module(info.name)
        from shared import TransformerConfig
        from twins import backends
        from twins.cli import main
        assert main(["train", "--task", "copy", "--backend", "{backend}", "--steps", "2", "--preset",
                     "tiny", "--eval-every", "0", "--heldout", "2", "--checkpoint", {run_dir!r},
                     "--no-progress", "--threads", "1"]) == 0
        assert main(["decode", "--checkpoint", {run_dir!r}, "--backend", "{backend}", "4 5 6"]) == 0
        loaded = sorted({{m.split(".")[0] for m in sys.modules}} & {heavy!r})
        assert not loaded, f"imported: {{loaded}}"
        sys.modules["{other}_impl"] = None  # as if its framework were not installed
        with pytest.raises(backends.Unavailable, match="the {other} backend is not installed"):
            backends.make_adapter("{other}", TransformerConfig.preset("tiny"), {{}})
    """, blocked=set())
    assert result.returncode == 0, result.stderr[-3000:]


def _fake_triton(tmp_path: Path) -> Path:
    """A directory holding a package ``triton`` that records which frameworks were loaded before it."""
    package = tmp_path / "fake" / "triton"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "import sys\nLOADED_BEFORE = sorted({'torch', 'tensorflow'} & set(sys.modules))\n")
    return package.parent


def test_triton_is_loaded_before_tensorflow_or_its_absence_explained(tmp_path, monkeypatch):
    """`shared.load_order.load_triton_first` (torch_impl and tf_impl call it as they are imported,
    and the suite's conftest): with triton installed and TensorFlow not loaded, triton is imported
    now; with TensorFlow loaded first, a warning names the crash to come and the fix; with triton
    loaded already or not installed, nothing. (A fresh interpreter proves each backend calls it
    before its framework: `test_a_backend_imports_and_runs_without_the_other_framework`.)"""
    import importlib.util
    import warnings

    from shared.load_order import ISSUE, load_triton_first
    # absent now, and absent again afterwards whatever this test imported (undone in reverse: the
    # stand-in must not outlive the test, torch would take it for triton)
    monkeypatch.setitem(sys.modules, "triton", None)
    monkeypatch.delitem(sys.modules, "triton")
    monkeypatch.setitem(sys.modules, "tensorflow", object())  # TensorFlow loaded first
    if importlib.util.find_spec("triton") is None:  # a CPU build of torch, as CI's
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            load_triton_first()  # not installed: nothing to load, nothing to warn of
    monkeypatch.syspath_prepend(str(_fake_triton(tmp_path)))
    with pytest.warns(RuntimeWarning) as caught:
        load_triton_first()
    assert len(caught) == 1 and ISSUE in str(caught[0].message), [str(w.message) for w in caught]
    assert "Import torch_impl, tf_impl or triton before tensorflow" in str(caught[0].message)
    assert "triton" not in sys.modules  # loading it after TensorFlow is the crash
    monkeypatch.delitem(sys.modules, "tensorflow")  # TensorFlow not loaded yet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_triton_first()
        assert "tensorflow" not in sys.modules["triton"].LOADED_BEFORE  # loaded now, first
        monkeypatch.setitem(sys.modules, "tensorflow", object())
        load_triton_first()  # loaded already: nothing


def test_optional_libraries_are_never_imported_by_the_product():
    """transformers, ctranslate2 and keras_hub are the 'interop' extra, onnx and onnxruntime the
    'onnx' one: imported only inside the functions that need them, so importing every product
    module loads none of them (and the
    Marian/FSMT importers and the Marian exporter run with them blocked)."""
    result = run("""
        import pkgutil, importlib
        from parity_tests.importable import present
        names = ["shared", "twins"] + [f"{f}_impl" for f in ("torch", "tf") if present(f)]  # the backends here
        for pkg in map(importlib.import_module, names):
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
        with tempfile.TemporaryDirectory() as folder:
            to_marian(folder + "/m", config, random_weights(config))
            assert from_marian(folder + "/m")[0] == config
    """, blocked={"transformers", "torch", "tensorflow", "ctranslate2"})
    assert result.returncode == 0, result.stderr


def test_the_command_line_imports_without_a_framework():
    """`twins` and its command modules (the SavedModel export's included) start with neither
    framework: each imports one only when a command needs it."""
    result = run("""
        import twins.cli, twins.convert, twins.saved_model
    """, blocked={"torch", "tensorflow", "keras", "tf_keras"})
    assert result.returncode == 0, result.stderr


def test_folders_named_like_the_packages_in_the_current_directory_do_not_take_the_import(tmp_path):
    """Where the project is installed (dev.py: editable, its folder a line of a ``.pth`` file), a
    folder named ``shared``, ``twins``, ``torch_impl`` or ``tf_impl`` without an ``__init__.py`` in
    the current directory (the parent of a clone holds ``../shared``) is passed over for the
    package. Before: setuptools' default editable install found the project through an import hook
    that Python asks after every folder on ``sys.path``, so such a folder won, and ``python -m twins``
    or ``import torch_impl`` there failed: "cannot import name 'TransformerConfig' from 'shared'
    (unknown location)"."""
    from importlib.metadata import PackageNotFoundError, distribution
    try:
        distribution("twin-transformer")
    except PackageNotFoundError:
        pytest.skip("the project is not installed here (imported from PYTHONPATH or the working tree)")
    for name in ("shared", "twins", "torch_impl", "tf_impl"):
        (tmp_path / name).mkdir()
    result = subprocess.run([sys.executable, "-c", "from shared import TransformerConfig; import twins.cli"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            env=importable.environ(set()))
    assert result.returncode == 0, ("a folder of the current directory took the import of the installed "
                                    f"project (reinstall it as dev.py does):\n{result.stderr}")


def test_the_blocker_blocks():
    """Guards the tests above (and the suite's TWINS_BLOCK legs) against passing vacuously: a
    blocked package that is installed everywhere (the standard library's ``csv``) looks absent, to
    ``find_spec`` and to ``import``, here and in a subprocess started from here."""
    result = run("""
        import importlib.util, subprocess
        assert importlib.util.find_spec("csv") is None
        child = "import importlib.util; assert importlib.util.find_spec('csv') is None; import csv"
        child = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True)
        assert child.returncode == 1 and "No module named 'csv'" in child.stderr, child.stderr
        import csv
    """, blocked={"csv"})
    assert result.returncode == 1 and "ModuleNotFoundError: No module named 'csv'" in result.stderr, result.stderr


def test_a_subprocess_that_imports_the_project_stays_blocked():
    """`importable.project_environ` puts the project first on ``PYTHONPATH`` and keeps what was
    there (the blocker's site, a machine's extra packages). Before it, seven test modules set
    ``PYTHONPATH`` to the project alone: their ``python -m twins`` imported what TWINS_BLOCK hid,
    and a test that needed TensorFlow passed in CI's torch-only leg and failed on a machine
    without TensorFlow. No test module builds that environment by hand any more."""
    base = {**os.environ, importable.ENV: "csv", "PYTHONPATH": "/elsewhere"}
    env = importable.project_environ(ROOT, base=base, EXTRA="1")
    assert env["PYTHONPATH"].split(os.pathsep) == [str(importable.SITE), str(ROOT), "/elsewhere"]
    assert env["EXTRA"] == "1" and env[importable.ENV] == "csv"
    child = "import shared, importlib.util; assert importlib.util.find_spec('csv') is None; import csv"
    child = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, env=env,
                           cwd="/", timeout=120)
    assert child.returncode == 1 and "No module named 'csv'" in child.stderr, child.stderr
    by_hand = [f"{path.name}:{n}" for path in sorted(Path(__file__).parent.glob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if re.search(r'PYTHONPATH"?\s*[:=]\s*str\(ROOT\)', line)]
    assert by_hand == [], by_hand


def test_the_blocker_refuses_a_package_already_imported():
    """Blocking what is already loaded would be a lie: the suite would test what it claims not to."""
    result = run("""
        import csv
        from parity_tests.importable import install
        install({"csv"})
    """, blocked=set())
    assert result.returncode == 1 and "cannot block ['csv']: already imported: ['csv']" in result.stderr, result.stderr


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


def _imports_of(path: Path) -> set[str]:
    """Every module a file imports, at the top or inside a function ("." prefixes resolved for twins)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = ("twins." if node.level else "") + (node.module or "")
            found |= {base.rstrip(".")} | {f"{base}.{a.name}".replace("..", ".") for a in node.names}
    return found


def test_commands_import_no_command_and_reach_backends_through_the_adapter():
    """twins/cli.py lists the commands; no command module imports another (shared code has its own
    modules: loading, runs, verify), and only twins/backends.py imports torch_impl or tf_impl."""
    from twins.cli import COMMANDS
    root = Path(__file__).resolve().parents[1] / "twins"
    commands = {f"twins.{name}" for name in COMMANDS}
    for path in sorted(root.glob("*.py")):
        imported = _imports_of(path)
        if f"twins.{path.stem}" in commands:
            assert not imported & (commands - {f"twins.{path.stem}"}), (path.name, imported & commands)
        if path.name != "backends.py":
            backends = {m for m in imported if m.split(".")[0] in ("torch_impl", "tf_impl")}
            assert not backends, (path.name, backends)


def test_a_worker_that_exits_without_finalizing_still_runs_every_exit_handler(tmp_path, monkeypatch):
    """conftest's fast exit: registered in an xdist worker whose tests ran (passed or failed),
    never elsewhere nor under PARITY_FULL_EXIT=1; at exit it runs every other exit handler
    (tempfile's, coverage's, interop_cases' clean-up are such) and ends the process without the
    interpreter's finalization (an object's finalizer that only finalization calls does not run;
    without the fast exit it does, so the check can tell)."""
    from parity_tests import conftest
    registered = []
    monkeypatch.setattr(conftest.atexit, "register", registered.append)
    for worker, full_exit, status, expected in [("gw0", False, 0, 1), ("gw0", False, 1, 1), ("gw0", False, 2, 0),
                                                (None, False, 0, 0), ("gw0", True, 0, 0)]:
        registered.clear()
        if worker:
            monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        else:
            monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
        monkeypatch.setattr(conftest, "FULL_EXIT", full_exit)
        conftest.pytest_sessionfinish(None, status)
        assert registered == [conftest._exit_without_finalizing] * expected, (worker, full_exit, status)
    monkeypatch.undo()

    marks = tmp_path / "marks"
    program = textwrap.dedent(f"""
        import atexit, os, sys
        FD = os.open({str(marks)!r}, os.O_WRONLY | os.O_CREAT | os.O_APPEND)

        class Finalized:
            def __del__(self, write=os.write, fd=FD):  # bound now: finalization clears modules
                write(fd, b"finalized\\n")

        KEPT = Finalized()  # alive until the interpreter's finalization
        atexit.register(lambda: os.write(FD, b"handler\\n"))
        if sys.argv[1] == "fast":
            from parity_tests.conftest import _exit_without_finalizing
            atexit.register(_exit_without_finalizing)  # last, as pytest_sessionfinish registers it
        """)
    for how, expected in (("fast", ["handler"]), ("full", ["handler", "finalized"])):
        marks.unlink(missing_ok=True)
        done = subprocess.run([sys.executable, "-c", program, how], cwd=ROOT, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 0, done.stderr
        assert marks.read_text().split() == expected, how
