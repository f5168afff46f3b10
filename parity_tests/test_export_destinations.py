"""What a save or an export may replace, and what it checks before it looks at the path (NumPy
only: every refusal here comes before an optional library is imported).

* **A directory is replaced only when it is recognisably the writer's own output**
  (`shared.saving.check_replaceable`: its config parses and says so), never because its file
  names happen to be a subset of the writer's. Before, `shared.exporters.to_ctranslate2` and the
  neutral checkpoint (`shared.weights.save_checkpoint`, ``formats.write("neutral", ...)``, a
  backend's ``save_checkpoint`` to a path without a suffix) replaced any folder whose names were
  among their own: a user's ``config.json`` of notes, a folder holding only
  ``shared_vocabulary.json`` or ``model.bin``, was deleted.
* **Arguments before anything else**: a path that is not a non-empty ``str`` / ``os.PathLike``
  (`shared.paths.check_path`), a config that is not a `TransformerConfig`
  (`shared.checks.check_config`), named, where Python's own errors ("expected str, bytes or
  os.PathLike object, not NoneType"; ``""`` silently read as ``.``) or an AttributeError came out.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from shared import TransformerConfig, formats
from shared.exporters import to_ctranslate2, to_marian
from shared.exporters.onnx import to_onnx
from shared.weights import load_checkpoint, random_weights, save_checkpoint

TINY = TransformerConfig.preset("tiny", n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
CT2 = TINY.replace(norm_style="standard")  # a config CTranslate2 computes
CT2_CONFIG = {"add_source_bos": False, "add_source_eos": False, "bos_token": "1",  # what it writes
              "decoder_start_token": "1", "eos_token": "2", "layer_norm_epsilon": 1e-6,
              "multi_query_attention": False, "unk_token": "0"}
NEUTRAL_CONFIG = {"format_version": 1, "config": TINY.to_dict()}


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    """Every entry under ``folder`` with its bytes (None for a folder)."""
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def _neutral(config, weights, path):
    return formats.write("neutral", config, weights, path)


def _ct2(config, weights, path):
    return to_ctranslate2(CT2, weights, path)


# (writer, what its refusal calls the destination)
WRITERS = {"save_checkpoint": (lambda c, w, p: save_checkpoint(p, c, w), "a checkpoint"),
           "formats.write neutral": (_neutral, "a checkpoint"),
           "to_ctranslate2": (_ct2, "a CTranslate2 model directory")}
# A user's folder whose names are all among a writer's own, not its output: (files, writers)
USERS_FOLDERS = {
    "config.json of notes": ({"config.json": b"my settings, not JSON"}, WRITERS),
    "config.json of another tool": ({"config.json": b'{"theme": "dark"}'}, WRITERS),
    "shared_vocabulary.json alone": ({"shared_vocabulary.json": b'["a", "b"]'}, ("to_ctranslate2",)),
    "model.bin alone": ({"model.bin": b"my binary"}, ("to_ctranslate2",)),
    "model.safetensors alone": ({"model.safetensors": b"my tensors"},
                                ("save_checkpoint", "formats.write neutral")),
    # the other's config.json: a checkpoint is no CTranslate2 model, nor the reverse
    "a CTranslate2 config": ({"config.json": json.dumps(CT2_CONFIG).encode()},
                             ("save_checkpoint", "formats.write neutral")),
    "a checkpoint's config": ({"config.json": json.dumps(NEUTRAL_CONFIG).encode()}, ("to_ctranslate2",)),
    "an ONNX export's config": ({"config.json": json.dumps({**NEUTRAL_CONFIG, "precision": "float32"}).encode()},
                                ("save_checkpoint", "formats.write neutral")),
    "config.json a folder": ({"config.json/": None}, WRITERS),
}
CASES = [(folder, writer) for folder, (_, writers) in USERS_FOLDERS.items() for writer in writers]


@pytest.mark.parametrize("folder, writer", CASES, ids=[f"{w}-{f}" for f, w in CASES])
def test_a_folder_of_the_writers_names_that_it_did_not_write_is_refused(tmp_path, folder, writer):
    dest = tmp_path / "d"
    dest.mkdir()
    for name, content in USERS_FOLDERS[folder][0].items():
        if name.endswith("/"):
            (dest / name).mkdir()
        else:
            (dest / name).write_bytes(content)
    before = _snapshot(tmp_path)
    write, what = WRITERS[writer]
    with pytest.raises(FileExistsError, match=re.escape(f"'{dest}' exists and is not {what}; refusing to overwrite")):
        write(TINY, random_weights(TINY, 0), dest)
    assert _snapshot(tmp_path) == before  # nothing changed, no temporary left


def test_an_earlier_checkpoint_an_empty_folder_and_an_interrupted_save_are_replaced(tmp_path):
    """What stays replaceable: the writer's own earlier output (its config.json says so), an empty
    directory, and a save that a crash interrupted between its renames (the marker protocol:
    `recover` finishes it first, then the finished checkpoint is replaced)."""
    old, new = random_weights(TINY, 1), random_weights(TINY, 2)
    path = tmp_path / "ckpt"
    save_checkpoint(path, TINY, old)
    _neutral(TINY, new, path)
    assert np.array_equal(load_checkpoint(path)[1]["generator.bias"], new["generator.bias"])
    (tmp_path / "empty").mkdir()
    save_checkpoint(tmp_path / "empty", TINY, new)
    assert sorted(os.listdir(tmp_path / "empty")) == ["config.json", "model.safetensors"]
    # a saver killed after moving the old checkpoint away, before the staged one took its place
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    staged, moved = f".ckpt.twins-{dead}-x.new", f".ckpt.twins-{dead}-x.old"
    save_checkpoint(tmp_path / staged, TINY, old)
    os.rename(path, tmp_path / moved)
    (tmp_path / ".ckpt.twins-swap").write_text(json.dumps({"new": staged, "old": moved, "pid": int(dead)}))
    save_checkpoint(path, TINY, new)
    assert np.array_equal(load_checkpoint(path)[1]["generator.bias"], new["generator.bias"])
    assert sorted(os.listdir(tmp_path)) == ["ckpt", "empty"]


@pytest.mark.torch
def test_a_backends_save_to_a_path_without_suffix_refuses_a_users_config_json(tmp_path):
    import torch_impl
    model = torch_impl.Transformer(TINY)
    model.import_weights(random_weights(TINY, 0))
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "config.json").write_text("my settings, not JSON")
    with pytest.raises(FileExistsError, match="is not a checkpoint; refusing"):
        torch_impl.save_checkpoint(model, tmp_path / "d")
    assert (tmp_path / "d" / "config.json").read_text() == "my settings, not JSON"
    assert os.listdir(tmp_path) == ["d"]


# -- arguments checked before the path is looked at -----------------------------------------------
EXPORTERS = {"to_onnx": lambda c, w, p: to_onnx(c, w, p),
             "to_marian": lambda c, w, p: to_marian(p, c, w),
             "to_ctranslate2": lambda c, w, p: to_ctranslate2(c, w, p)}
BAD_PATHS = [(None, TypeError, "path: expected a str or os.PathLike path, got NoneType"),
             (3, TypeError, "path: expected a str or os.PathLike path, got int"),
             (b"x", TypeError, r"path: expected a str or os.PathLike path, got bytes b'x' \(decode it"),
             ("", ValueError, "path: expected a path, got ''")]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("path, error, message", BAD_PATHS, ids=["None", "int", "bytes", "empty"])
def test_an_exporters_path_is_checked_and_named(tmp_path, monkeypatch, exporter, path, error, message):
    monkeypatch.chdir(tmp_path)  # "" was read as ".", the current directory
    with pytest.raises(error, match=message):
        EXPORTERS[exporter](CT2, random_weights(CT2, 0), path)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("fmt", ["onnx", "ctranslate2", "marian", "neutral"])
def test_a_writers_config_is_checked_before_any_field_is_read(tmp_path, fmt):
    with pytest.raises(TypeError, match="config: expected a TransformerConfig, got NoneType"):
        formats.write(fmt, None, random_weights(CT2, 0), tmp_path / "out")
    assert os.listdir(tmp_path) == []


# -- folders a failed save made are removed -------------------------------------------------------
def test_an_export_to_a_path_through_a_new_folder_leaves_no_folder_behind(tmp_path, monkeypatch):
    """``newparent/../X`` is ``X``: the folder ``newparent/`` made on the way (to reach
    ``newparent/..``) is not left behind, empty, beside the export."""
    pytest.importorskip("onnx")
    monkeypatch.chdir(tmp_path)
    to_onnx(TINY, random_weights(TINY, 0), "newparent/../X")
    assert sorted(os.listdir(tmp_path)) == ["X"]
