"""`tf_impl.saved_model` and `twins convert --to saved-model`: a SavedModel that decodes, loaded in a
fresh process where neither this project nor torch can be imported, returns tf_impl's tokens,
lengths and scores bit for bit; bad input comes back as the documented sentinel.

Two small exports are made in one test (a module fixture would be rebuilt in every pytest-xdist
worker that runs one of its tests): the tiny preset under XLA (tf_impl's default),
and a variant config (``[sin | cos]`` positions, decoder start = pad, swish, post-norm, tied output,
float64) without XLA. One subprocess (``python -I``, cwd outside the repository, a ``sys.meta_path``
finder refusing ``torch``, ``shared``, ``tf_impl``, ``torch_impl``, ``twins``, ``parity_tests``)
loads both with ``tf.saved_model.load`` and calls their signatures on every case (and one case
through the TF1 session loader, as TF Serving loads a SavedModel); the test compares what it
returns with tf_impl's `greedy_decode` / `beam_search` run here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from parity_tests.importable import ISOLATED_BLOCK  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.batches import token_batch  # noqa: E402
from shared.weights import random_weights, save_checkpoint  # noqa: E402
from tf_impl import weights_io  # noqa: E402
from tf_impl.saved_model import INVALID, SIGNATURES, export_saved_model, signatures  # noqa: E402
from twins.cli import main  # noqa: E402

pytestmark = pytest.mark.tf

BLOCKED = ("torch", "shared", "tf_impl", "torch_impl", "twins", "parity_tests")
SCORE = {"serving_default": "log_probs", "beam_search": "scores"}


def _weights(config: TransformerConfig, seed: int) -> dict:
    """Random weights with EOS made likely enough that some rows finish early and some do not."""
    weights = random_weights(config, seed)
    weights["generator.bias"][config.eos_id] += 1.5
    return weights


# name -> (config, export settings). Small models, few shapes: under XLA every new source shape
# is a compile of its own (about 2 s each on the 2-core test machine, here and in the subprocess),
# so the XLA export gets two shapes and the graph export (no compile) the rest.
EXPORTS = {
    "tiny-xla": (TransformerConfig.preset("tiny", n_encoder_layers=1, dropout=0.0),
                 dict(max_len=9, beam_size=3, length_penalty=0.6, jit_compile=None)),
    # NumPy's numbers, which the checks take (and the decoders): the export casts them after
    # checking (an int64 max_len met int32 tensors in the traced loop; JSON stores no NumPy scalar)
    "variant-graph": (TransformerConfig.preset(
        "tiny", n_decoder_layers=1, dropout=0.0, pe_layout="halves", decoder_start_id=0,
        activation="swish", norm_first=False, tie_output=True, dtype="float64"),
        dict(max_len=np.int64(7), beam_size=np.int64(2), length_penalty=0.0, jit_compile=np.False_)),
}
REFUSED_CASES = ("empty-source", "too-long", "no-rows")  # whole batches tf_impl refuses
# export -> {case: signatures it is sent to}
PLAN = {
    "tiny-xla": {"mixed": SIGNATURES, "short": ("serving_default",)},
    "variant-graph": {"mixed": SIGNATURES, "short": SIGNATURES, "single": SIGNATURES,
                      "empty-source": SIGNATURES, "too-long": SIGNATURES,
                      "no-rows": ("serving_default",)},
}


def _cases(export: str, config: TransformerConfig) -> dict[str, tuple[np.ndarray, tuple[str, ...]]]:
    """case -> (src, the signatures it is sent to): batches of several sizes and lengths with
    padding; ``mixed`` holds a full row, a padded one, an all-padding one and three bad rows (an id
    past the vocabulary, a negative one, and 2**32 + 5, which an int32 signature took as 5); then
    whole batches the served model must refuse."""
    mixed = token_batch(config, config.src_vocab, 6, 7, seed=1, lengths=[7, 4, 0, 6, 3, 5])
    mixed[3, 2], mixed[4, 0], mixed[5, 1] = config.src_vocab, -3, 2**32 + 5
    sources = {
        "mixed": mixed,
        "short": token_batch(config, config.src_vocab, 2, 3, seed=2),
        "single": token_batch(config, config.src_vocab, 1, 12, seed=3),
        "empty-source": np.zeros((2, 0), np.int64),
        "too-long": np.full((2, config.max_len + 1), config.pad_id + 3, np.int64),
        "no-rows": np.zeros((0, 4), np.int64),
    }
    return {case: (sources[case], names) for case, names in PLAN[export].items()}


# What runs in the fresh process: plain TensorFlow, nothing of this project.
SERVER = ISOLATED_BLOCK + textwrap.dedent("""
    import importlib, json
    import numpy as np
    import tensorflow as tf
    work = sys.argv[1]
    info = {"importable": [], "loaded": sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)}
    for name in sorted(BLOCKED):
        try:
            importlib.import_module(name)
            info["importable"].append(name)
        except ImportError:
            pass
    plan = json.load(open(f"{work}/plan.json"))
    inputs = np.load(f"{work}/inputs.npz")
    results = {}
    for export, cases in plan.items():
        model = tf.saved_model.load(f"{work}/{export}")
        info[export] = {"config": json.loads(model.config_json.numpy()),
                        "decoding": json.loads(model.decoding_json.numpy()),
                        "signatures": sorted(model.signatures),
                        "inputs": {k: str(f.structured_input_signature) for k, f in model.signatures.items()}}
        for case, names in cases.items():
            src = inputs[f"{export}/{case}"]  # NumPy int64, converted as a client's would be
            for name in names:
                for key, value in model.signatures[name](src=src).items():
                    results[f"{export}/{case}/{name}/{key}"] = value.numpy()
                    results[f"{export}/{case}/{name}/{key}:dtype"] = np.array(value.dtype.name)
        # TF Serving's way: the TF1 session loader, the graph and signature as stored
        with tf.Graph().as_default(), tf.compat.v1.Session() as session:
            meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], f"{work}/{export}")
            signature = meta.signature_def["serving_default"]
            fetch = {k: v.name for k, v in signature.outputs.items()}
            src = inputs[f"{export}/mixed"]
            for key, value in session.run(fetch, {signature.inputs["src"].name: src}).items():
                results[f"{export}/mixed/session/{key}"] = value
    np.savez(f"{work}/results.npz", **results)
    json.dump(info, open(f"{work}/info.json", "w"))
""")


def _export_and_serve(work: Path):
    """Build and export every model, then serve every case in one fresh process:
    ``(models, cases, results, info)``."""
    models, cases, plan, inputs = {}, {}, {}, {}
    for seed, (name, (config, settings)) in enumerate(EXPORTS.items()):
        model = tf_impl.Transformer(config)
        model.import_weights(_weights(config, seed=seed + 5))
        export_saved_model(model, work / name, **settings)
        models[name], cases[name] = model, _cases(name, config)
        plan[name] = {case: list(names) for case, (_, names) in cases[name].items()}
        inputs.update({f"{name}/{case}": src for case, (src, _) in cases[name].items()})
    (work / "plan.json").write_text(json.dumps(plan))
    np.savez(work / "inputs.npz", **inputs)
    done = subprocess.run([sys.executable, "-I", "-c", SERVER, str(work), ",".join(BLOCKED)],
                          cwd=work, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})
    assert done.returncode == 0, done.stderr[-3000:]
    return models, cases, dict(np.load(work / "results.npz")), json.loads((work / "info.json").read_text())


def _expected(model, src: np.ndarray, name: str, settings: dict):
    """tf_impl's own decoding, the eager checked API, with the export's settings."""
    kwargs = dict(max_len=settings["max_len"], jit_compile=settings["jit_compile"])
    if name == "serving_default":
        return tf_impl.greedy_decode(model, src, **kwargs)
    return tf_impl.beam_search(model, src, beam_size=settings["beam_size"],
                               length_penalty=settings["length_penalty"], **kwargs)


def _differences(got: dict, want, name: str, rows: np.ndarray) -> list[str]:
    """The outputs of ``rows`` that differ from tf_impl's (bit for bit: the same program)."""
    pairs = [("tokens", want.tokens), ("lengths", want.lengths), (SCORE[name], getattr(want, SCORE[name]))]
    return [key for key, value in pairs if not np.array_equal(got[key][rows], value[rows])]


def _check_case(model, export: str, case: str, name: str, src: np.ndarray, got: dict) -> list[str]:
    """What is wrong with one served result, one line each (empty: right)."""
    config, settings = EXPORTS[export]
    where, score = f"{export}/{case}/{name}", got[SCORE[name]]
    problems = []
    if (got["tokens:dtype"], got["lengths:dtype"], got[f"{SCORE[name]}:dtype"]) != (
            "int32", "int32", config.dtype):
        problems.append(f"{where}: dtypes {got['tokens:dtype']}, {got['lengths:dtype']}, "
                        f"{got[SCORE[name] + ':dtype']}")
    if got["tokens"].shape != (src.shape[0], settings["max_len"]) or got["lengths"].shape != src.shape[:1]:
        return problems + [f"{where}: shapes {got['tokens'].shape}, {got['lengths'].shape}"]
    if case in REFUSED_CASES:  # tf_impl refuses the batch; the signature flags every row
        with pytest.raises(ValueError, match="src"):
            _expected(model, src, name, settings)
        if not ((got["lengths"] == INVALID).all() and (got["tokens"] == INVALID).all()
                and np.isnan(score).all()):
            problems.append(f"{where}: not every row is the sentinel")
        return problems
    bad = ((src < 0) | (src >= config.src_vocab)).any(axis=1)  # (B,)
    if bad.any():  # tf_impl refuses the batch; the signature decodes the bad rows as padding
        with pytest.raises(ValueError, match="src"):
            _expected(model, src, name, settings)
    want = _expected(model, np.where(bad[:, None], config.pad_id, src), name, settings)
    problems += [f"{where}: {key} differ from tf_impl" for key in _differences(got, want, name, ~bad)]
    if not ((got["lengths"][bad] == INVALID).all() and (got["tokens"][bad] == INVALID).all()
            and np.isnan(score[bad]).all()):
        problems.append(f"{where}: a bad row is not the sentinel")
    return problems


def test_a_saved_model_decodes_as_tf_impl_in_a_process_without_the_project(tmp_path):
    """One test, one subprocess, every check (a module fixture would be rebuilt in each
    pytest-xdist worker): the serving process could import neither this project nor torch; each
    export kept its signatures and settings; valid rows of every case give tf_impl's tokens,
    lengths and scores bit for bit; bad rows and impossible batches give the sentinel."""
    models, cases, results, info = _export_and_serve(tmp_path)
    assert info["importable"] == [] and info["loaded"] == []
    problems = []
    for export, (config, settings) in EXPORTS.items():
        got = info[export]
        assert got["signatures"] == sorted(SIGNATURES)
        for spec in got["inputs"].values():
            assert "TensorSpec(shape=(None, None), dtype=tf.int64, name='src')" in spec
        assert TransformerConfig.from_dict(got["config"]) == config
        assert got["decoding"] == {**settings, "length_penalty": float(settings["length_penalty"]),
                                   "invalid": INVALID}
        served = []
        for case, (src, names) in cases[export].items():
            for name in names:
                prefix = f"{export}/{case}/{name}/"
                out = {k[len(prefix):]: v for k, v in results.items() if k.startswith(prefix)}
                problems += _check_case(models[export], export, case, name, src, out)
                if case not in REFUSED_CASES:
                    served.append(out)
        session = {k: v for k, v in results.items() if k.startswith(f"{export}/mixed/session/")}
        assert len(session) == 3, sorted(session)
        for key, value in session.items():
            if not np.array_equal(value, results[key.replace("/session/", "/serving_default/")],
                                  equal_nan=True):
                problems.append(f"{key}: the TF1 session loader differs from tf.saved_model.load")
        # Not vacuous: rows that stop at EOS (pad after it) and rows that run to the limit occur.
        lengths = np.concatenate([out["lengths"] for out in served])
        tokens = np.concatenate([out["tokens"] for out in served])
        eos = tokens == config.eos_id
        after = (np.cumsum(eos, axis=1) - eos) > 0  # positions after a row's first EOS
        assert (lengths > 0).any() and (lengths < settings["max_len"]).any(), export
        assert (lengths == settings["max_len"]).any() and (lengths == INVALID).any(), export
        assert after.any() and (tokens[after] == config.pad_id).all(), export
    assert problems == []


def test_nan_logits_flag_every_row_where_tf_impl_raises():
    """Weights that make the logits NaN for a valid source: nothing raises inside the loop, so every
    row of the batch comes back as the sentinel (tf_impl's eager API raises). The signature is
    called in this process, without XLA (one compile less; the check is outside the XLA program)."""
    config = TransformerConfig.preset("tiny", n_encoder_layers=1, n_decoder_layers=1, dropout=0.0)
    weights = random_weights(config, 0)
    weights["generator.bias"][5] = np.nan
    model = tf_impl.Transformer(config)
    weights_io.import_weights(model, weights, allow_nonfinite=True)
    src = token_batch(config, config.src_vocab, 2, 4, seed=0)
    with pytest.raises(ValueError, match="NaN"):
        tf_impl.greedy_decode(model, src, 4, jit_compile=False)
    serve = signatures(model, 4, 2, 0.0, jit_compile=False)["serving_default"]
    got = serve(src=tf.constant(src, tf.int64))
    assert (got["lengths"].numpy() == INVALID).all() and (got["tokens"].numpy() == INVALID).all()


# -- export errors: refused before anything is written --------------------------------------------
@pytest.mark.parametrize("settings, error, message", [
    (dict(max_len=65), ValueError, "max_len: expected at most config.max_len=64"),
    (dict(max_len=0), ValueError, "max_len: expected an int >= 1"),
    (dict(beam_size=17), ValueError, "beam_size: expected at most tgt_vocab - 1 = 16"),
    (dict(beam_size=None), TypeError, "beam_size: expected an int >= 1, got None"),
    (dict(length_penalty=-0.5), ValueError, "length_penalty: expected a finite float >= 0"),
])
def test_bad_settings_are_refused_before_writing(tmp_path, settings, error, message):
    model = tf_impl.Transformer(TransformerConfig.preset("tiny"))
    with pytest.raises(error, match=message):
        export_saved_model(model, tmp_path / "out", **settings)
    assert list(tmp_path.iterdir()) == []


def test_the_tensor_functions_name_a_model_that_is_not_one(tmp_path):
    """`signatures`, `compare_export` and the decoders' tensor functions the signatures call
    (which check nothing of their tensors) raised ``AttributeError: 'NoneType' object has no
    attribute 'config'``, or TensorFlow's error for a path, for ``model=None``."""
    from tf_impl.decoding import beam_search_tensors, greedy_decode_tensors
    from tf_impl.saved_model import compare_export
    src = tf.constant([[3, 4]], tf.int64)
    for call in (lambda: signatures(None, 3, 2, 0.0), lambda: compare_export(None, tmp_path, src),
                 lambda: greedy_decode_tensors(None, src, 3), lambda: beam_search_tensors(None, src, 3)):
        with pytest.raises(TypeError, match=r"^model: expected a tf_impl.Transformer, got NoneType$"):
            call()


def test_nan_weights_are_refused_before_writing(tmp_path):
    """As `save_checkpoint` and `twins convert` refuse them: the export took them, and answered
    every request with the sentinel."""
    config = TransformerConfig.preset("tiny")
    weights = random_weights(config, 0)
    weights["generator.bias"][5] = np.nan
    model = tf_impl.Transformer(config)
    weights_io.import_weights(model, weights, allow_nonfinite=True)
    with pytest.raises(ValueError, match=r"(?s)^export_saved_model: weights: .*generator.bias: contains NaN or Inf"):
        export_saved_model(model, tmp_path / "out", max_len=3, jit_compile=False)
    assert list(tmp_path.iterdir()) == []


def test_the_conversion_s_defaults_fit_the_model():
    """``twins convert --to saved-model`` without --beam-size or --max-new: 4 beams and 256 tokens,
    or what the model can take where that is less (a beam has tgt_vocab - 1 children; 4 beams
    refused a vocabulary of 4 for a flag the user had not given); given values are checked, and
    named as the export names them, whatever the error's class."""
    from shared.formats.saved_model import settings as export_settings
    tiny = TransformerConfig.preset("tiny")
    assert export_settings(tiny) == {"max_len": min(256, tiny.max_len), "beam_size": 4, "length_penalty": 0.0}
    small = tiny.replace(src_vocab=4, tgt_vocab=4, max_len=9)
    assert export_settings(small) == {"max_len": 9, "beam_size": 3, "length_penalty": 0.0}
    with pytest.raises(ValueError, match=r"^beam_size: expected at most tgt_vocab - 1 = 3"):
        export_settings(small, beam_size=4)
    with pytest.raises(ValueError, match=r"^max_new: expected at most config.max_len=9"):
        export_settings(small, max_new=10)
    with pytest.raises(TypeError, match=r"^max_new: expected an int >= 1, got 9.0$"):  # named alike
        export_settings(small, max_new=9.0)


def _snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (None if p.is_dir() else p.read_bytes())
            for p in sorted(folder.rglob("*"))}


def test_a_path_that_is_not_a_saved_model_is_not_replaced(tmp_path):
    """Refused, nothing changed: a file, a folder of notes, and folders whose names are all a
    SavedModel's without being one (the check was only "every name is a SavedModel's", so a
    user's ``assets/logo.png`` was deleted): a SavedModel is a ``saved_model.pb`` TensorFlow
    wrote."""
    model = tf_impl.Transformer(TransformerConfig.preset("tiny"))
    folders = {"mine": {"notes.txt": b"keep"}, "logo": {"assets/logo.png": b"\x89PNG"},
               "vars": {"variables/mine.txt": b"keep"}, "empty-vars": {"variables/": None},
               "fingerprint": {"fingerprint.pb": b"keep"},
               "not-a-pb": {"saved_model.pb": b"my notes", "assets/a.txt": b"keep"},
               "empty-pb": {"saved_model.pb": b"", "variables/": None},  # parses, as an empty message
               "pb-folder": {"saved_model.pb/": None}}
    # SavedModels with what an export does not write: a vocabulary, TF Serving's warm-up requests
    tf.saved_model.save(tf.Module(), str(tmp_path / "with-assets"))
    (tmp_path / "with-assets" / "assets" / "vocab.txt").write_bytes(b"keep")
    tf.saved_model.save(tf.Module(), str(tmp_path / "with-extra"))
    (tmp_path / "with-extra" / "assets.extra").mkdir()
    (tmp_path / "with-extra" / "assets.extra" / "tf_serving_warmup_requests").write_bytes(b"keep")
    for name, files in folders.items():
        for entry, content in files.items():
            target = tmp_path / name / entry
            target.parent.mkdir(parents=True, exist_ok=True)
            target.mkdir() if content is None else target.write_bytes(content)
    (tmp_path / "file").write_text("keep")
    before = _snapshot(tmp_path)
    for target in (*folders, "file", "with-assets", "with-extra"):
        with pytest.raises(FileExistsError, match="(not a SavedModel directory|files in assets/)"):
            export_saved_model(model, tmp_path / target, max_len=3, jit_compile=False)
    assert _snapshot(tmp_path) == before


def test_a_saved_model_tensorflow_wrote_and_an_empty_folder_are_replaced(tmp_path, monkeypatch):
    import tf_impl.saved_model as module
    monkeypatch.setattr(module, "signatures", lambda *args: {})  # no tracing: the directory is the point
    model = tf_impl.Transformer(TransformerConfig.preset("tiny"))
    tf.saved_model.save(tf.Module(), str(tmp_path / "older"))
    older = (tmp_path / "older" / "saved_model.pb").read_bytes()
    (tmp_path / "empty").mkdir()
    for name in ("older", "empty"):
        export_saved_model(model, tmp_path / name, max_len=3, beam_size=2)
    assert b"decoding_json" in (tmp_path / "older" / "saved_model.pb").read_bytes() != older
    assert b"decoding_json" in (tmp_path / "empty" / "saved_model.pb").read_bytes()
    assert sorted(os.listdir(tmp_path)) == ["empty", "older"]


@pytest.mark.parametrize("path, error, message", [
    (None, TypeError, "path: expected a str or os.PathLike path, got NoneType"),
    (3, TypeError, "path: expected a str or os.PathLike path, got int"),
    (b"x", TypeError, r"path: expected a str or os.PathLike path, got bytes b'x' \(decode it"),
    ("", ValueError, "path: expected a path, got ''"),  # was read as ".", the current directory
], ids=["None", "int", "bytes", "empty"])
def test_the_path_is_checked_and_named(tmp_path, monkeypatch, path, error, message):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(error, match=message):
        export_saved_model(tf_impl.Transformer(TransformerConfig.preset("tiny")), path, max_len=3)
    assert os.listdir(tmp_path) == []


def test_jit_compile_is_a_flag_refused_before_anything_is_written(tmp_path):
    """``jit_compile="false"`` was read for its truth (an XLA export storing "false"); through the
    registry it raised KeyError after the export had already replaced the destination."""
    model = tf_impl.Transformer(TransformerConfig.preset("tiny"))
    message = r"jit_compile: expected True, False or None \(the measured default\), got 'false' \(str\)"
    with pytest.raises(TypeError, match=message):
        export_saved_model(model, tmp_path / "new", max_len=3, jit_compile="false")
    tf.saved_model.save(tf.Module(), str(tmp_path / "prev"))
    before = _snapshot(tmp_path)
    for value in ("false", 0, "true"):
        with pytest.raises(TypeError, match="jit_compile: expected True, False or None"):
            tf_impl.save_checkpoint(model, tmp_path / "prev", format="saved-model", max_new=3,
                                    jit_compile=value)
    assert _snapshot(tmp_path) == before


def test_a_failed_save_leaves_the_old_export_whole(tmp_path, monkeypatch):
    """A save that dies half-way (here: TF raises after writing part of it) leaves the previous
    SavedModel as it was and no temporary directory behind (`shared.saving.replace_directory`)."""
    old = tmp_path / "served"
    tf.saved_model.save(tf.Module(), str(old))  # an earlier export
    before = _snapshot(old)

    def half_save(obj, folder, signatures=None):
        Path(folder, "saved_model.pb").write_bytes(b"half")
        raise OSError(28, "No space left on device")

    import tf_impl.saved_model as module
    monkeypatch.setattr(module, "signatures", lambda *args: {})  # no tracing: the save is the point
    monkeypatch.setattr(module.tf.saved_model, "save", half_save)
    with pytest.raises(OSError, match="No space left"):
        export_saved_model(tf_impl.Transformer(TransformerConfig.preset("tiny")), old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["served"]
    assert _snapshot(old) == before


# -- the command line -----------------------------------------------------------------------------
def test_convert_to_saved_model_with_verify_replaces_an_export(tmp_path, capsys):
    """From a neutral checkpoint over an existing SavedModel: the new export replaces it, and
    --verify's table passes (tokens, lengths, scores, the flagged bad row). Without XLA, to save
    the compiles (the XLA export is checked above)."""
    config = EXPORTS["tiny-xla"][0]
    save_checkpoint(tmp_path / "ckpt", config, _weights(config, seed=9))
    dst = tmp_path / "served"
    tf.saved_model.save(tf.Module(), str(dst))  # an older export, to be replaced
    assert main(["convert", str(tmp_path / "ckpt"), str(dst), "--to", "saved-model", "--max-new", "6",
                 "--beam-size", "2", "--length-penalty", "1.0", "--jit-compile", "false",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "-> " + str(dst) + " (saved-model)" in out
    rows = [line for line in out.splitlines() if line.startswith(SIGNATURES)]
    assert len(rows) == 2 and all(r.split()[1:] == ["identical"] * 3 + ["flagged", "pass"]
                                  for r in rows), out
    assert out.rstrip().endswith("PASS")
    settings = json.loads(tf.saved_model.load(str(dst)).decoding_json.numpy())
    assert settings["max_len"] == 6 and settings["beam_size"] == 2 and settings["jit_compile"] is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "served"]


@pytest.mark.parametrize("argv, message", [
    (["--to", "saved-model", "--max-new", "65"], "--max-new: expected at most config.max_len=64"),
    (["--to", "saved-model", "--beam-size", "0"], "--beam-size: expected an int >= 1"),
    (["--to", "saved-model", "--length-penalty", "nan"], "--length-penalty: expected a finite float"),
    (["--beam-size", "2"], "--beam-size: only for --to saved-model, not --to neutral"),
    (["--to", "onnx", "--beam-size", "2"], "--beam-size: only for --to saved-model, not --to onnx"),
    (["--to", "tf", "--jit-compile", "false"], "--jit-compile: only for --to saved-model"),
])
def test_convert_option_errors_name_the_flag(tmp_path, capsys, argv, message):
    config = TransformerConfig.preset("tiny")
    save_checkpoint(tmp_path / "ckpt", config, random_weights(config, 0))
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out")] + argv) == 2
    assert message in capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]
