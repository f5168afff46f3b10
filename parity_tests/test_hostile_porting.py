"""Issue 26, the porting surfaces under hostile or unusual input: half-precision sources widen
exactly to float32 (with a note) and other dtypes are refused naming file, tensor and dtype; every
layer of a Keras source is mapped, known not to change inference, or refused; messages name the
user's own input (the config.json key, the CLI flag)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from shared import TransformerConfig
from shared.importers.notes import ImportNote, collected

ROOT = Path(__file__).resolve().parents[1]


def twins(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "twins", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300, env=importable.project_environ(ROOT))


# -- half precision -------------------------------------------------------------------------------
def test_bfloat16_bits_widen_exactly():
    from shared.importers.safetensors_file import bfloat16_to_float32
    values = np.array([0.0, -0.0, 1.0, -2.5, 3.140625, np.inf, -np.inf, 2.0**127, 2.0**-126, 2.0**-133],
                      np.float32)  # every one a bfloat16 value (the last a subnormal)
    bits = (values.view(np.uint32) >> 16).astype(np.uint16)
    np.testing.assert_array_equal(bfloat16_to_float32(bits), values)
    assert np.isnan(bfloat16_to_float32(np.array([0x7FC0], np.uint16)))[0]
    torch = pytest.importorskip("torch")  # every bit pattern but NaNs, against torch's own widening
    every = np.arange(2**16, dtype=np.uint16)
    expected = torch.from_numpy(every.view(np.int16)).view(torch.bfloat16).float().numpy()
    got = bfloat16_to_float32(every)
    assert got.dtype == np.float32 and got.shape == every.shape
    np.testing.assert_array_equal(got.view(np.uint32)[~np.isnan(got)],
                                  expected.view(np.uint32)[~np.isnan(expected)])


def test_notes_are_collected_once_and_other_warnings_pass_through():
    import warnings
    from shared.importers.notes import note_widened
    with pytest.warns(RuntimeWarning, match="other"):
        with collected() as notes:
            for _ in range(2):
                note_widened("f", "float16", 3)
            warnings.warn("other", RuntimeWarning)
    assert notes == ["'f': 3 float16 tensors widened exactly to float32 (every float16 value is a "
                     "float32 value)"]
    with pytest.warns(ImportNote, match="1 bfloat16 tensor widened"):
        note_widened("f", "bfloat16", 1)


MARIAN = dict(d_model=16, encoder_layers=2, decoder_layers=1, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=24, decoder_ffn_dim=24,
              max_position_embeddings=32, vocab_size=29, pad_token_id=28, eos_token_id=0,
              decoder_start_token_id=28, activation_function="swish", scale_embedding=True)


@pytest.fixture(scope="module")
def half_marian(tmp_path_factory):
    """``{dtype: directory}``: one random Marian model saved by ``save_pretrained`` in bfloat16 and
    in float16 (a model loaded in half precision, as transformers users save them)."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from parity_tests import hf_models as H
    folders = {}
    for name, dtype in (("bfloat16", torch.bfloat16), ("float16", torch.float16)):
        folders[name] = tmp_path_factory.mktemp(name)
        H.make_marian(0, "float32", **MARIAN).to(dtype).save_pretrained(str(folders[name]))
    return folders


@pytest.mark.parametrize("half", ["bfloat16", "float16"])
def test_a_half_precision_marian_imports_and_agrees_with_transformers_in_float64(half_marian, half):
    """The file's half-precision values widened exactly: the float64 logits of the imported weights
    equal those of transformers' own model loaded in float32 from the same file (then float64, with
    the exact positional table, which transformers does not save), within the float64 bound."""
    import torch
    import transformers
    from parity_tests import hf_models as H
    from parity_tests import interop_cases as C
    from shared import reference as R
    from shared.importers import from_marian
    from shared.tolerances import FLOAT64, assert_close

    path = half_marian[half]
    header = (path / "model.safetensors").read_bytes()
    header = json.loads(header[8:8 + int.from_bytes(header[:8], "little")])
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16" if half == "bfloat16" else "F16"}
    with collected() as notes:
        config, weights = from_marian(path)
    assert config.dtype == "float32" and len(notes) == 1
    assert notes[0].startswith(f"{str(path / 'model.safetensors')!r}: ") and notes[0].endswith(
        f"{half} tensors widened exactly to float32 (every {half} value is a float32 value)")
    model = transformers.MarianMTModel.from_pretrained(str(path), dtype=torch.float32).double().eval()
    H.exact_tables_(model, "marian")
    config64 = config.replace(dtype="float64")
    weights64 = {k: v.astype(np.float64) for k, v in weights.items()}
    src, tgt = C.batch(config64, seed=1)
    expected = H.hf_logits(model, src, tgt, config.pad_id, True)
    assert_close(R.forward(weights64, config64, src, tgt), expected, FLOAT64, f"{half} Marian logits")


def test_convert_prints_the_widening_note(half_marian, tmp_path):
    result = twins("convert", "--from", "marian", str(half_marian["bfloat16"]), str(tmp_path / "out"))
    assert result.returncode == 0, result.stderr
    assert "bfloat16 tensors widened exactly to float32" in result.stdout.splitlines()[0]


def test_other_safetensors_dtypes_are_refused_naming_file_tensor_and_dtype(half_marian, tmp_path):
    pytest.importorskip("transformers")
    import shutil
    from safetensors.numpy import load_file, save_file
    from shared.importers import ImporterError, from_marian

    path = tmp_path / "int"
    shutil.copytree(half_marian["float16"], path)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["final_logits_bias"] = np.zeros((1, 29), np.int32)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(ImporterError) as err:
        from_marian(path)
    assert (f"{str(path / 'model.safetensors')!r}: tensor 'final_logits_bias': dtype I32 is not "
            "supported (supported: F32 and F64 (kept), F16 and BF16 (widened exactly to float32))") in str(err.value)


def test_a_torch_impl_checkpoint_read_as_another_models_state_dict_says_what_it_is(tmp_path, capsys):
    """Before: "4 problem(s) with the weights: 'format': expected a tensor, got str; ...", the
    file's own header read as tensors (docs/formats/keras.md wrote a torch_impl file where
    state_dicts.md reads a tutorial's)."""
    torch_impl = pytest.importorskip("torch_impl")
    from parity_tests.cli_runs import cli
    path = tmp_path / "m.pt"
    torch_impl.save_checkpoint(torch_impl.Transformer(TransformerConfig.preset("tiny")), path)
    code, out, err = cli(capsys, "convert", path, tmp_path / "out", "--from", "nn-transformer", "--n-heads", "4",
                         "--norm-first", "false", "--pad-id", "0", "--bos-id", "1", "--eos-id", "2")
    assert (code, err) == (2, f"twins convert: error: {str(path)!r}: expected a state dict of another model, "
                              "got a torch_impl checkpoint; read it as one (twins convert --from torch, "
                              "format='torch')\n")
    assert not (tmp_path / "out").exists()


def test_a_half_precision_torch_state_dict_widens_and_other_dtypes_are_refused(tmp_path):
    torch = pytest.importorskip("torch")
    from shared.weights import WeightsError
    from torch_impl.checkpoints import read_foreign_state_dict

    g = torch.Generator().manual_seed(0)
    sd = {"a": torch.randn(3, 4, generator=g).to(torch.bfloat16), "b": torch.randn(5, generator=g).half(),
          "c": torch.randn(2, generator=g, dtype=torch.float64)}
    torch.save(sd, tmp_path / "half.pt")
    with collected() as notes:
        got = read_foreign_state_dict(tmp_path / "half.pt")
    assert {k: v.dtype for k, v in got.items()} == {"a": np.float32, "b": np.float32, "c": np.float64}
    for k in sd:
        np.testing.assert_array_equal(got[k], sd[k].to(torch.float64).numpy())  # exact
    assert sorted(notes) == [f"{str(tmp_path / 'half.pt')!r}: 1 bfloat16 tensor widened exactly to "
                             "float32 (every bfloat16 value is a float32 value)",
                             f"{str(tmp_path / 'half.pt')!r}: 1 float16 tensor widened exactly to "
                             "float32 (every float16 value is a float32 value)"]
    # A sparse tensor: named as one (before: NotImplementedError, "Cannot access storage of
    # SparseTensorImpl", from the check for expanded views, found by fuzzing .pt sources).
    torch.save({"a": torch.zeros(2), "ids": torch.arange(3), "q": torch.zeros(2, dtype=torch.complex64),
                "s": torch.eye(3).to_sparse()}, tmp_path / "odd.pt")
    with pytest.raises(WeightsError) as err:
        read_foreign_state_dict(tmp_path / "odd.pt")
    text = str(err.value)
    assert str(tmp_path / "odd.pt") in text
    for name, dtype in (("ids", "int64"), ("q", "complex64")):
        assert (f"'{name}': dtype {dtype} is not supported (supported: float32 and float64 (kept), "
                "float16 and bfloat16 (widened exactly to float32))") in text
    assert "'s': expected a dense tensor, got torch.sparse_coo" in text


# -- every layer of a Keras source is accounted for -----------------------------------------------
def _with_layer(archive: Path, out: Path, old: str, new: dict) -> Path:
    """A copy of the ``.keras`` ``archive`` in which every layer of class ``old`` (nested anywhere)
    is ``new`` (its class and config entries, the name kept)."""
    import zipfile

    def swap(node):
        if isinstance(node, dict):
            if node.get("class_name") == old:
                node.update({k: v for k, v in new.items() if k != "config"},
                            config={**node["config"], **new.get("config", {})})
            for value in node.values():
                swap(value)
        elif isinstance(node, list):
            for value in node:
                swap(value)

    with zipfile.ZipFile(archive) as a, zipfile.ZipFile(out, "w") as b:
        for item in a.namelist():
            data = a.read(item)
            if item == "config.json":
                config = json.loads(data)
                swap(config)
                data = json.dumps(config).encode()
            b.writestr(item, data)
    return out


@pytest.fixture(scope="module")
def keras_hub_archive(tmp_path_factory):
    pytest.importorskip("keras_hub")
    from parity_tests import keras_source_models as K
    path = tmp_path_factory.mktemp("keras") / "hub.keras"
    K.randomize(K.keras_hub_model(7, 9, 5, 4, 1, 6), seed=0).save(str(path))
    return path


def test_a_keras_layer_the_import_does_not_map_is_refused(keras_hub_archive, tmp_path):
    """The issue's case: the final Dropout replaced by Activation("tanh") converted with exit 0 and
    log-probs off by up to 1.17; now refused, naming the layer. The Dropout itself (identity at
    inference) and a linear Activation in its place are accepted."""
    from shared.importers import ImporterError, from_keras_hub, read_keras_file

    def imported(path):
        file = read_keras_file(path)
        return from_keras_hub(file.weights, bos_id=2, eos_id=3, keras_config=file.config)

    def activation(name: str) -> Path:
        return _with_layer(keras_hub_archive, tmp_path / f"{name}.keras", "Dropout",
                           {"class_name": "Activation", "config": {"activation": name}})

    config, weights = imported(keras_hub_archive)
    got_config, got = imported(activation("linear"))
    assert got_config == config and all(np.array_equal(got[k], weights[k]) for k in weights)
    tanh = activation("tanh")
    with pytest.raises(ImporterError) as err:
        imported(tanh)
    assert re.search(r"layer 'transformer/functional(_\d+)?/dropout(_\d+)?': Activation\('tanh'\) is not a layer "
                     r"this import maps \(TokenAndPositionEmbedding, TransformerEncoder, TransformerDecoder, "
                     r"Dense\) nor one known not to change inference \(ActivityRegularization, AlphaDropout, "
                     r"Dropout,", str(err.value)), err.value  # Keras numbers layer names per process
    result = twins("convert", str(tanh), str(tmp_path / "out.pt"), "--from", "keras-hub", "--bos-id", "2",
                   "--eos-id", "3")
    assert result.returncode == 2 and "Activation('tanh') is not a layer this import maps" in result.stderr
    assert not (tmp_path / "out.pt").exists()


def test_a_weights_file_variable_the_import_does_not_map_is_refused(keras_hub_archive):
    from shared.importers import ImporterError, from_keras_hub, read_keras_file
    weights = dict(read_keras_file(keras_hub_archive).weights)
    weights["layers/functional/layers/scale/vars/0"] = np.ones(4, np.float32)
    with pytest.raises(ImporterError, match=r"unexpected keys: \['layers/functional/layers/scale/vars/0'\]"):
        from_keras_hub(weights, bos_id=2, eos_id=3, mask_zero=False)


# -- messages name the user's own input -----------------------------------------------------------
@pytest.mark.parametrize("key, value, expected", [
    ("encoder_attention_heads", float("nan"), "config.json: encoder_attention_heads: expected a positive "
                                              "int, got nan"),
    ("decoder_ffn_dim", "24", "config.json: decoder_ffn_dim: expected a positive int, got '24'"),
    ("decoder_vocab_size", "29", "config.json: decoder_vocab_size: expected a positive int, got '29'"),
    ("encoder_layers", 10**6, "model.encoder.layers.*: config.json encoder_layers is 1000000, but the "
                              "weights hold 2 layer(s) (0, 1); not planned (an import plans at most twice "
                              "the layers it holds)"),  # no plan of 10**6 layers (a minute, 7 GB)
    ("max_position_embeddings", 10**12, "config.json: max_position_embeddings: expected max_len * d_model "
                                        "<= POSITIONAL_TABLE_LIMIT = 268435456 (the float64 positional "
                                        "table, 2 GiB), got 1000000000000 * 16 = 16000000000000 (as "
                                        "TransformerConfig.max_len)"),
])
def test_a_bad_marian_setting_is_reported_under_its_config_json_key(half_marian, tmp_path, key, value,
                                                                     expected):
    import shutil
    from shared.importers import ImporterError, from_marian
    path = tmp_path / "bad"
    shutil.copytree(half_marian["float16"], path)
    config = json.loads((path / "config.json").read_text())
    config[key] = value
    (path / "config.json").write_text(json.dumps(config))  # NaN as JSON's NaN, as Python writes it
    with pytest.raises(ImporterError) as err, collected():  # the float16 file's note, not shown
        from_marian(path)
    assert err.value.problems == [expected]


# -- sources that claim far more than they hold -----------------------------------------------------
def test_a_layer_index_far_past_the_layers_held_is_refused_unplanned():
    """One key renamed to layer 999999 made the import plan a million layers (a minute, 7 GB): an
    import plans at most twice the layers it holds, whatever the highest index or a config says."""
    torch = pytest.importorskip("torch")
    from shared.importers import ImporterError, from_nn_transformer
    from parity_tests.source_models import Seq2SeqTransformer, numpy_state_dict
    model = Seq2SeqTransformer(1, 1, 8, 2, 11, 13, 16, dropout=0.0)
    state = {k.replace("encoder.layers.0.", "encoder.layers.999999.", 1): v
             for k, v in numpy_state_dict(model).items()}
    with pytest.raises(ImporterError) as err:
        from_nn_transformer(state, n_heads=2, norm_first=False, pad_id=0, bos_id=1, eos_id=2)
    assert err.value.problems == [
        "transformer.encoder.layers.*: layer indices up to 999999, but the weights hold 1 layer(s) (999999); "
        "not planned (an import plans at most twice the layers it holds)"]


def test_a_keras_file_declaring_more_than_it_stores_is_refused_before_reading(tmp_path, keras_hub_archive,
                                                                            monkeypatch):
    """A .weights.h5 whose dataset declares 36 MB that were never written (HDF5 reads them as
    zeros: a 127 KB file read as 3.6 GB in the probe), and a .keras member that declares a hundred
    times what it stores (a decompression bomb; Keras' own rule, its floor lowered here so that the
    test writes kilobytes): both refused from declared sizes, nothing decompressed or read."""
    h5py = pytest.importorskip("h5py")
    import zipfile

    from shared.importers import ImporterError, keras_file, read_keras_file
    with h5py.File(tmp_path / "bomb.weights.h5", "w") as f:
        f.create_dataset("layers/dense/vars/0", shape=(3000, 3000), dtype="float32", chunks=(100, 100))
    with pytest.raises(ImporterError, match=r"its datasets declare 36,000,000 bytes of values, more than a "
                                            r"file of [\d,]+ bytes holds; refused before reading"):
        read_keras_file(tmp_path / "bomb.weights.h5")
    monkeypatch.setattr(keras_file, "_BOMB_FLOOR", 1 << 16)
    with zipfile.ZipFile(keras_hub_archive) as a, zipfile.ZipFile(tmp_path / "bomb.keras", "w") as b:
        for item in a.namelist():
            b.writestr(item, a.read(item) if item != "config.json" else b" " * (1 << 20),
                       compress_type=zipfile.ZIP_DEFLATED)
    with pytest.raises(ImporterError, match=r"config.json: declares 1,048,576 bytes stored in [\d,]+: a "
                                            r"decompression bomb, not read"):
        read_keras_file(tmp_path / "bomb.keras")


def test_a_keras_file_damaged_inside_is_refused_naming_it(tmp_path, keras_hub_archive, capsys):
    """A Keras file that h5py opens but cannot walk (here a group's B-tree signature overwritten;
    the fuzzer's Keras kinds changed bytes at random) made h5py raise RuntimeError, which `twins`
    printed as an unexpected error with a hint at the traceback. It is an ImporterError naming the
    file now, worded as tf_impl's own reader words it, in a .weights.h5 and inside a .keras."""
    import zipfile

    from parity_tests.cli_runs import cli
    from shared.importers import ImporterError, read_keras_file
    with zipfile.ZipFile(keras_hub_archive) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    weights = bytearray(members["model.weights.h5"])
    tree = weights.index(b"TREE")  # the signature of the first group's B-tree node
    weights[tree:tree + 4] = b"XXXX"
    damaged_h5 = tmp_path / "hub.weights.h5"
    damaged_h5.write_bytes(bytes(weights))
    damaged_keras = tmp_path / "hub.keras"
    with zipfile.ZipFile(damaged_keras, "w") as archive:
        for name, data in {**members, "model.weights.h5": bytes(weights)}.items():
            archive.writestr(name, data)
    for path, label in ((damaged_h5, str(damaged_h5)), (damaged_keras, f"{damaged_keras}:model.weights.h5")):
        with pytest.raises(ImporterError) as err:
            read_keras_file(path)
        assert err.value.problems == ["a damaged HDF5 file (RuntimeError: Object visitation failed (wrong "
                                      "B-tree signature))"], err.value
        assert repr(label) in str(err.value)
        code, out, err_text = cli(capsys, "convert", path, tmp_path / "out", "--from", "keras-hub",
                                  "--bos-id", "2", "--eos-id", "3", "--mask-zero", "false")
        assert code == 2 and len(err_text.strip().splitlines()) == 1, err_text
        assert "a damaged HDF5 file (RuntimeError" in err_text and "--verbose" not in err_text, err_text
        assert not (tmp_path / "out").exists()


def test_a_keras_hub_setting_of_the_wrong_json_type_is_named(keras_hub_archive, tmp_path):
    """A list where layer_norm_epsilon's number goes raised "unhashable type: 'list'"."""
    from shared.importers import ImporterError, from_keras_hub, read_keras_file
    path = _with_layer(keras_hub_archive, tmp_path / "eps.keras", "TransformerEncoder",
                       {"config": {"layer_norm_epsilon": [1e-5]}})
    file = read_keras_file(path)
    with pytest.raises(ImporterError, match=r"'transformer_encoder(_\d+)?': layer_norm_epsilon: expected a "
                                            r"number, got \[1e-05\]"):
        from_keras_hub(file.weights, bos_id=2, eos_id=3, keras_config=file.config)


@pytest.mark.skipif(not hasattr(__import__("os"), "mkfifo"), reason="no FIFOs on this OS")
def test_a_fifo_inside_a_marian_directory_is_named_not_missing(tmp_path):
    import os

    from shared.importers import ImporterError, from_marian
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"model_type": "marian"}))
    os.mkfifo(tmp_path / "m" / "model.safetensors")
    with pytest.raises(ImporterError, match=r"model.safetensors': expected a regular file, got a FIFO"):
        from_marian(tmp_path / "m")


def test_an_expanded_tensor_in_a_foreign_state_dict_is_refused_uncopied(tmp_path):
    """One stored float expanded to 10**8 elements (2 * 10**9 in the probe: 7.45 GiB on copying)."""
    torch = pytest.importorskip("torch")
    from torch_impl.checkpoints import read_foreign_state_dict
    torch.save({"generator.bias": torch.zeros(1).expand(10**8)}, tmp_path / "x.pt")
    with pytest.raises(ValueError, match=r"'generator.bias': expected a tensor that stores each of its "
                                         r"values, got 100,000,000 values over 1 stored \(an expanded view\)"):
        read_foreign_state_dict(tmp_path / "x.pt")
