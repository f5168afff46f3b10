"""The format registry (`shared.formats`): every record well formed and documented, recognition
without a framework, the options' checks, `twins convert --list-formats`, and every native format
loading in both backends through the one function."""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from shared import TransformerConfig, formats  # noqa: E402
from shared.formats import native  # noqa: E402
from shared.weights import random_weights, save_checkpoint  # noqa: E402
from twins.cli import main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = TransformerConfig.preset("tiny")


def test_every_record_is_complete_and_documented():
    assert len(formats.REGISTRY) == len(set(formats.names())) == 12
    for fmt in formats.REGISTRY:
        assert fmt.read or fmt.write, fmt.name
        assert set(fmt.required) <= {o.name for o in fmt.read_options}, fmt.name
        assert (ROOT / "docs" / "formats" / f"{fmt.family}.md").is_file(), fmt.family
    formats.options()  # one declaration per option name (raises otherwise)


def test_native_suffixes_are_the_backends_own():
    from tf_impl import checkpoints as tf_ckpt
    from torch_impl import checkpoints as torch_ckpt
    assert native.PT_SUFFIXES == torch_ckpt.PT_SUFFIXES and native.H5_SUFFIXES == (tf_ckpt.H5_SUFFIX,)


def test_recognition_imports_no_framework():
    code = ("import sys; from shared import formats; "
            "print(formats.detect('m.pt').name, formats.detect('m.weights.h5', 'destination').name, "
            "formats.detect('out', 'destination').name, formats.detect('m.keras').name); "
            "print(sorted(m for m in ('torch', 'tensorflow', 'keras', 'h5py') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["torch tf neutral keras-hub", "[]"], out


def test_options_are_checked_and_named_as_typed():
    nn = formats.get("nn-transformer")
    with pytest.raises(ValueError, match=r"--from nn-transformer: n_heads, norm_first required"):
        formats.check_options(nn, "read", {"pad_id": 0, "bos_id": 1, "eos_id": 2})
    with pytest.raises(ValueError, match=r"^--beam-size: only for --to saved-model, not --from marian"):
        formats.check_options(formats.get("marian"), "read", {"beam_size": 2},
                              spell=lambda n: "--" + n.replace("_", "-"))
    with pytest.raises(ValueError, match="always pre-norm"):
        formats.check_options(formats.get("annotated"), "read", {"norm_first": True})
    with pytest.raises(ValueError, match="readable formats .* got 'ctranslate2' .*write only"):
        formats.read("x", "ctranslate2")


def test_a_misspelt_option_is_refused_whatever_its_value(tmp_path):
    """None stands for "not given", as the command line passes every format's options; before, it
    hid a misspelt keyword too: ``load_checkpoint(path, n_headz=None)`` loaded the file. A name
    that some format takes stays "not given" at None, whatever the format."""
    config = TransformerConfig.preset("tiny")
    models = {"torch": torch_impl.Transformer(config), "tf": tf_impl.Transformer(config)}
    path = torch_impl.save_checkpoint(models["torch"], tmp_path / "m.pt")
    for read in (formats.read, torch_impl.load_checkpoint, tf_impl.load_checkpoint):
        with pytest.raises(ValueError, match="^n_headz: not an option of --from torch"):
            read(path, n_headz=None)
        assert read(path, n_heads=None) is not None  # nn-transformer's option, not given
    for backend, save in (("torch", torch_impl.save_checkpoint), ("tf", tf_impl.save_checkpoint)):
        with pytest.raises(ValueError, match="^beam_sise: not an option of --to torch"):
            save(models[backend], tmp_path / "out.pt", beam_sise=None)
        assert not (tmp_path / "out.pt").exists()


def test_the_registrys_own_arguments_are_checked_by_name():
    """Before: NumPy option values crashed the filter of given options in NumPy's words ("truth
    value of an empty array is ambiguous"), a misspelt direction or role was read as another
    ("sideways" as "write"), a list as a format or precision name failed as "unhashable type",
    options=None as an AttributeError, and detect("") took '' for the current directory."""
    import numpy as np
    from shared.precision import check_precision
    nn = {"n_heads": np.int64(4), "norm_first": np.False_, "pad_id": np.int64(0), "bos_id": 1, "eos_id": 2}
    assert formats.check_options("nn-transformer", "read", nn) == nn  # a name or a record
    for call, error, message in [
        (lambda: formats.get("onnx", "sideways"), ValueError, "direction: expected one of 'read', 'write', None, got 'sideways'"),
        (lambda: formats.get(["onnx"]), TypeError, r"format: expected a format name \(one of neutral, .*\), got list"),
        (lambda: formats.detect("m.pt", "bogus"), ValueError, "role: expected one of 'source', 'destination', got 'bogus'"),
        (lambda: formats.detect(""), ValueError, "path: expected a path, got ''"),
        (lambda: formats.check_options("onnx", "sideways", {}), ValueError, "direction: expected one of 'read', 'write', got"),
        (lambda: formats.check_options("nn-transformer", "read", None), TypeError,
         "options: expected a mapping of option name -> value, got NoneType"),
        (lambda: check_precision(["fp16"], "float32"), ValueError, r"precision: expected one of .*, got \['fp16'\]"),
    ]:
        with pytest.raises(error, match=f"^{message}"):
            call()


def test_the_library_writers_and_builders_name_their_arguments(tmp_path):
    """A probe of the library's writers (not the command line) found them naming nothing or the
    wrong argument: `formats.write` to torch or tf took any path as far as Python's own words
    ("expected str, bytes or os.PathLike object, not NoneType"; '' as "'.': is a directory"); the
    two native writers named the weights "to_state_dict: weights" and "write_native: weights";
    `formats.read` named a config that is no TransformerConfig "given"; the ONNX and CTranslate2
    builders raised an AttributeError for one; `export_saved_model` named an empty checkpoint
    path "path"; a saved-model's length penalty named "max_len", an option it does not have."""
    from shared.exporters import ctranslate2, onnx
    from tf_impl.saved_model import export_saved_model
    weights = random_weights(TINY, 0)
    pt = tmp_path / "m.pt"
    formats.write("torch", TINY, weights, pt)
    for call, error, message in [
        *[(lambda f=f, p=p: formats.write(f, TINY, weights, p), error, message)
          for f in ("torch", "tf") for p, error, message in (
              ("", ValueError, "path: expected a path, got ''"),
              (None, TypeError, "path: expected a str or os.PathLike path, got NoneType"))],
        *[(lambda m=m, p=p: m.write_native(p, TINY, None), TypeError, "write_native: weights: expected a dict")
          for m, p in ((torch_impl.checkpoints, tmp_path / "w.pt"), (tf_impl.checkpoints, tmp_path / "w.weights.h5"))],
        (lambda: formats.read(pt, "torch", config=TINY.to_dict()), TypeError,
         "config: expected a TransformerConfig, got dict"),
        (lambda: onnx.build_models(None, weights), TypeError, "config: expected a TransformerConfig, got NoneType"),
        (lambda: ctranslate2.build_spec(TINY.to_dict(), weights), TypeError,
         "config: expected a TransformerConfig, got dict"),
        (lambda: export_saved_model("", tmp_path / "served"), ValueError, "model: expected a path, got ''"),
        (lambda: formats.write("saved-model", TINY, weights, tmp_path / "served", max_new=16, length_penalty=75.0),
         ValueError, r"length_penalty: expected at most [0-9.]+ at max_new=16 "),
    ]:
        with pytest.raises(error, match=f"^{message}"):
            call()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.pt"]  # nothing written by a refusal


def test_formats_read_takes_the_format_as_the_backends_spell_it(tmp_path):
    """`formats.read(path, format=...)`, as `torch_impl.load_checkpoint` and
    `tf_impl.load_checkpoint` take it: the parameter was ``fmt``, so ``format=`` was taken for an
    option of the format the path looked like ("format: not an option of --from torch")."""
    weights = random_weights(TINY, 0)
    pt = tmp_path / "m.pt"
    formats.write(format="torch", config=TINY, weights=weights, path=pt)
    config, read = formats.read(pt, format="torch")
    assert config == TINY and all(np.array_equal(read[name], weights[name]) for name in weights)
    with pytest.raises(ValueError, match=r"^format: expected one of the readable formats .*, got 'pt'$"):
        formats.read(pt, format="pt")


def test_list_formats_prints_the_registry(capsys):
    assert main(["convert", "--list-formats"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[:2] for line in lines] == [[f.name, f.directions] for f in formats.REGISTRY]


@pytest.fixture(scope="module")
def native_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("native")
    weights = random_weights(TINY, 0)
    save_checkpoint(folder / "n", TINY, weights)
    for name in ("m.pt", "m.weights.h5"):
        formats.write(formats.detect(folder / name, "destination"), TINY, weights, folder / name)
    return folder, weights


@pytest.mark.parametrize("name", ["n", "m.pt", "m.weights.h5"])
def test_each_native_format_loads_in_both_backends(native_files, name):
    folder, weights = native_files
    for backend in (torch_impl, tf_impl):
        model = backend.load_checkpoint(folder / name)
        assert model.config == TINY
        exported = model.export_weights()
        assert all(exported[k].tobytes() == weights[k].tobytes() for k in weights), (backend, name)
        backend.checkpoints.load_into(backend.Transformer(TINY), folder / name)  # into a model, too


@pytest.mark.parametrize("doc", ["README.md", "docs/formats/README.md"])
def test_the_documented_format_tables_are_the_registry(doc):
    """The README's and docs/formats/'s tables: one row per record, in order, with its directions
    and description (`twins convert --list-formats` prints the same)."""
    rows = [line.split("|")[1:4] for line in (ROOT / doc).read_text(encoding="utf-8").splitlines()
            if line.startswith("| `")]
    documented = [tuple(cell.strip().strip("`") for cell in row) for row in rows]
    assert documented == [(f.name, f.directions, f.describe) for f in formats.REGISTRY]


def test_a_native_file_without_its_framework_is_an_error_naming_the_extra(tmp_path):
    """The registry imports a backend only to read its file; without the framework, one ImportError
    says which extra installs it (docs/design.md, the dependency rule's plugin seam)."""
    (tmp_path / "m.pt").write_bytes(b"not read")
    code = ("import sys\n"
            "class Block:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name.split('.')[0] == 'torch': raise ImportError('blocked import of ' + name)\n"
            "sys.meta_path.insert(0, Block())\n"
            "from shared import formats\n"
            "try:\n"
            f"    formats.read({str(tmp_path / 'm.pt')!r})\n"
            "except ImportError as err:\n"
            "    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "read and written by torch_impl, which is not installed" in out and "'torch' extra" in out, out


def test_decode_reads_ids_from_a_file_and_names_a_bad_line(native_files, tmp_path, capsys):
    folder, _ = native_files
    rows = tmp_path / "rows.txt"
    rows.write_text("5 6 7 8\n\n3 4\n", encoding="utf-8")
    out = tmp_path / "out.json"
    assert main(["decode", "--checkpoint", str(folder / "m.pt"), "--src-file", str(rows),
                 "--max-new", "5", "--json", str(out)]) == 0
    printed = capsys.readouterr().out.splitlines()
    import json
    report = json.loads(out.read_text(encoding="utf-8"))
    assert [r["src"] for r in report["results"]] == [[5, 6, 7, 8], [3, 4]]  # the blank line skipped
    assert printed == [" ".join(map(str, r["tokens"])) for r in report["results"]]
    assert all(len(r["tokens"]) + r["eos"] <= 5 for r in report["results"])
    rows.write_text("5 6\n3 x\n", encoding="utf-8")
    assert main(["decode", "--checkpoint", str(folder / "m.pt"), "--src-file", str(rows)]) == 2
    assert f"--src-file {str(rows)!r} line 2: expected token ids" in capsys.readouterr().err
    assert main(["decode", "--checkpoint", str(folder / "m.pt"), "--src", "5 99"]) == 2
    assert "--src '5 99': expected ids in [0, 13)" in capsys.readouterr().err


def test_decode_reads_ids_from_standard_input(native_files, tmp_path, capsys, monkeypatch):
    """``--src-file -`` is standard input (as ``--json -`` is standard output): the same rows as
    the file gives; its bad bytes and lines are named as standard input's; closed, it holds none."""
    import io
    folder, _ = native_files
    rows = tmp_path / "rows.txt"
    rows.write_text("5 6 7 8\n\n3 4\n", encoding="utf-8")
    decode = ["decode", "--checkpoint", str(folder / "m.pt"), "--max-new", "5"]
    assert main([*decode, "--src-file", str(rows)]) == 0
    from_file = capsys.readouterr().out

    def stdin(data: bytes):
        monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))

    stdin(rows.read_bytes())
    assert main([*decode, "--src-file", "-", "--json", "-"]) == 0
    import json
    report = json.loads(capsys.readouterr().out)
    assert [r["src"] for r in report["results"]] == [[5, 6, 7, 8], [3, 4]]
    stdin(rows.read_bytes())
    assert main([*decode, "--src-file", "-"]) == 0
    assert capsys.readouterr().out == from_file
    for data, error in ((b"3 4 \xe9", "--src-file '-' (standard input): expected UTF-8 text, got byte 0xe9 at offset 4"),
                        (b"5 6\n3 x\n", "--src-file '-' line 2: expected token ids"),
                        (b"", "--src-file '-': expected lines of token ids, got none")):
        stdin(data)
        assert main([*decode, "--src-file", "-"]) == 2
        assert error in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", None)  # no standard input at all (a daemon's)
    assert main([*decode, "--src-file", "-"]) == 2
    assert "--src-file '-': expected lines of token ids, got none" in capsys.readouterr().err


def test_rename_takes_one_mapping_with_one_equals_sign():
    """``--rename ==`` mapped the empty prefix to "=", and the hint printed after it suggested a
    --rename that cannot be typed; an OLD=NEW has exactly one "=" (OLD may be empty)."""
    import argparse
    from shared.formats.record import rename
    assert rename("a.=b.") == ("a.", "b.") and rename("=m.") == ("", "m.") and rename("m.=") == ("m.", "")
    for text in ("ab", "a=a", "==", "a=b=c"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected OLD=NEW with OLD != NEW and one '='"):
            rename(text)


def test_a_model_of_the_other_backend_is_named_with_its_module(tmp_path):
    """Before: "model: expected a torch_impl.Transformer, got Transformer", the other backend's
    class by its bare name, which is the expected one's."""
    from tf_impl.precision import set_precision as tf_set_precision
    from torch_impl.precision import set_precision as torch_set_precision
    config = TransformerConfig.preset("tiny")
    models = {"torch_impl": torch_impl.Transformer(config), "tf_impl": tf_impl.Transformer(config)}
    for owner, impl, other in (("torch_impl", torch_impl, "tf_impl"), ("tf_impl", tf_impl, "torch_impl")):
        set_precision = torch_set_precision if impl is torch_impl else tf_set_precision
        for call in (lambda m: impl.save_checkpoint(m, tmp_path / "m.pt"),
                     lambda m: impl.greedy_decode(m, [[5, 6]], 4), lambda m: set_precision(m, "bfloat16")):
            with pytest.raises(TypeError, match=f"^model: expected a {owner}.Transformer, got "
                                                f"{other}.model.Transformer$"):
                call(models[other])
    assert getattr(models["torch_impl"], "precision", "float32") == "float32" and not list(tmp_path.iterdir())
