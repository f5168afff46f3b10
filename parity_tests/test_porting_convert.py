"""`twins convert`: every format to every other, the importers as sources, `--verify`'s parity
table, and its errors; run in-process through `twins.cli.main`."""
import json
import os
import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from parity_tests import source_models as S  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, Bound, assert_close  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import random_weights, save_checkpoint  # noqa: E402
from twins import verify  # noqa: E402
from twins.cli import main  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tf,
              pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")]

TINY = TransformerConfig.preset("tiny")
NN = ["--n-heads", "4", "--pad-id", "1", "--bos-id", "2", "--eos-id", "3"]  # the tutorial's ids
ANN = ["--n-heads", "4", "--pad-id", "0", "--bos-id", "1", "--eos-id", "2"]


def table_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("logits ")]


def assert_passing_table(out: str, rows: int):
    found = table_rows(out)
    assert len(found) == rows, out
    assert all(line.endswith(" pass") for line in found), out
    assert re.search(r"weights: \d+ tensors in DST bit-identical to the source", out), out
    assert out.rstrip().endswith("PASS"), out


def batch(config):
    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=6, seed=1)
    assert (src == config.pad_id).any() and (tgt == config.pad_id).any()
    return src, tgt


def torch_logits(model, src, tgt):
    with torch.no_grad():
        return model.eval()(torch.as_tensor(src), torch.as_tensor(tgt)).numpy()


# -- between the project's formats ----------------------------------------------------------------
def test_neutral_to_pt_to_h5_to_neutral_with_verify(tmp_path, capsys):
    weights = random_weights(TINY, 4)
    save_checkpoint(tmp_path / "n1", TINY, weights)
    steps = [("n1", "m.pt", "reference:SRC vs torch:DST"), ("m.pt", "m.weights.h5", "torch:SRC vs tf:DST"),
             ("m.weights.h5", "n2", "tf:SRC vs reference:DST")]
    for src, dst, compared in steps:
        assert main(["convert", str(tmp_path / src), str(tmp_path / dst), "--verify"]) == 0
        out = capsys.readouterr().out
        assert f"-> {tmp_path / dst} (" in out and "11,969 parameters in 92 tensors, float32" in out
        assert '"d_model": 16' in out  # the config is printed
        assert_passing_table(out, rows=1)
        assert compared in table_rows(out)[0]
    assert (tmp_path / "n1" / "model.safetensors").read_bytes() == \
        (tmp_path / "n2" / "model.safetensors").read_bytes()


def test_convert_without_verify_prints_what_it_converted(tmp_path, capsys):
    save_checkpoint(tmp_path / "n", TINY, random_weights(TINY, 0))
    assert main(["convert", str(tmp_path / "n"), str(tmp_path / "out.weights.h5")]) == 0
    out = capsys.readouterr().out
    assert "(neutral) -> " in out and "(tf): 11,969 parameters" in out and "logits" not in out
    assert tf_impl.load_checkpoint(tmp_path / "out.weights.h5").config == TINY


def test_same_implementation_must_match_exactly(tmp_path, capsys):
    save_checkpoint(tmp_path / "n", TINY, random_weights(TINY, 0))
    main(["convert", str(tmp_path / "n"), str(tmp_path / "a.pt")])
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "a.pt"), str(tmp_path / "b.pt"), "--verify"]) == 0
    row = table_rows(capsys.readouterr().out)[0]
    assert "0.00e+00   0.00e+00  0.0e+00  pass" in row


def test_verify_fails_with_exit_1_when_parity_fails(tmp_path, capsys, monkeypatch):
    save_checkpoint(tmp_path / "n", TINY, random_weights(TINY, 0))
    main(["convert", str(tmp_path / "n"), str(tmp_path / "a.pt")])
    capsys.readouterr()
    # A bound of zero between two frameworks: their float32 roundings differ, so this must fail.
    monkeypatch.setattr(verify, "_bound", lambda config, a, b: Bound(0.0, "test"))
    assert main(["convert", str(tmp_path / "a.pt"), str(tmp_path / "b.weights.h5"), "--verify"]) == 1
    out = capsys.readouterr().out
    assert table_rows(out)[0].endswith(" FAIL") and out.rstrip().endswith("FAIL")


def test_bare_state_dict_and_plain_keras_files_with_config(tmp_path, capsys):
    weights = random_weights(TINY, 6)
    model = torch_impl.Transformer(TINY)
    model.import_weights(weights)
    torch.save(model.state_dict(), tmp_path / "bare.pt")
    (tmp_path / "tiny.json").write_text(TINY.to_json())
    assert main(["convert", str(tmp_path / "bare.pt"), str(tmp_path / "x.weights.h5")]) == 2
    assert "holds a bare state dict and no config" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "bare.pt"), str(tmp_path / "x.weights.h5"),
                 "--config", str(tmp_path / "tiny.json"), "--verify"]) == 0
    assert_passing_table(capsys.readouterr().out, rows=1)


# -- the importers as sources ---------------------------------------------------------------------
@pytest.mark.parametrize("norm_first, target", [(False, "tf"), (True, "torch"), (True, "neutral")],
                         ids=["post_norm-tf", "pre_norm-torch", "pre_norm-neutral"])
def test_nn_transformer_checkpoint_converts_and_verifies(tmp_path, capsys, norm_first, target):
    source = S.randomize_(S.Seq2SeqTransformer(
        num_encoder_layers=2, num_decoder_layers=3, emb_size=16, nhead=4, src_vocab_size=11,
        tgt_vocab_size=13, dim_feedforward=24, maxlen=32, norm_first=norm_first,
        dtype=torch.float64), seed=2)
    torch.save(source.state_dict(), tmp_path / "tutorial.pt")  # what the tutorial's users have
    dst = tmp_path / {"tf": "m.weights.h5", "torch": "m.pt", "neutral": "m"}[target]
    argv = ["convert", str(tmp_path / "tutorial.pt"), str(dst), "--from", "nn-transformer",
            "--norm-first", str(norm_first).lower(), *NN, "--verify"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "cannot be rebuilt into its source model here" in out
    assert_passing_table(out, rows=3)  # reference, torch, tf: every pair
    assert f"DST = {dst}" in out
    # The converted file, in its backend, computes what the source model computes.
    net = (tf_impl if target == "tf" else torch_impl).load_checkpoint(dst)
    assert net.config.final_norm and net.config.norm_first == norm_first and net.config.norm_eps == 1e-5
    src, tgt = batch(net.config)
    expected = S.nn_transformer_logits(source, src, tgt, pad_id=1)
    actual = torch_logits(net, src, tgt) if target != "tf" else np.asarray(net(src, tgt))
    assert_close(actual, expected, FLOAT64, "logits of the converted model vs the nn.Transformer source")


@pytest.mark.parametrize("target", ["torch", "tf"])
def test_annotated_checkpoint_converts_and_verifies(tmp_path, capsys, target):
    source = S.randomize_(S.make_annotated(src_vocab=11, tgt_vocab=13, n=2, d_model=16, d_ff=24, h=4,
                                           max_len=32, dtype=torch.float64), seed=3)
    torch.save(source.state_dict(), tmp_path / "annotated.pt")
    dst = tmp_path / ("m.pt" if target == "torch" else "m.weights.h5")
    assert main(["convert", str(tmp_path / "annotated.pt"), str(dst), "--from", "annotated", *ANN,
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "annotated source cannot be rebuilt" in out
    assert_passing_table(out, rows=3)
    net = (torch_impl if target == "torch" else tf_impl).load_checkpoint(dst)
    assert (net.config.norm_style, net.config.norm_eps, net.config.dtype) == ("annotated", 1e-6, "float64")
    src, tgt = batch(net.config)
    expected = S.annotated_logits(source, src, tgt, pad_id=0)[0]
    actual = torch_logits(net, src, tgt) if target == "torch" else np.asarray(net(src, tgt))
    assert_close(actual, expected, FLOAT64, "logits of the converted model vs the Annotated source")


def test_importer_dtype_cast(tmp_path, capsys):
    source = S.randomize_(S.make_annotated(src_vocab=11, tgt_vocab=13, n=1, d_model=8, d_ff=12, h=2,
                                           max_len=16), seed=0)  # float32
    torch.save(source.state_dict(), tmp_path / "a.pt")
    argv = ["convert", str(tmp_path / "a.pt"), str(tmp_path / "n"), "--from", "annotated",
            "--n-heads", "2", "--pad-id", "0", "--bos-id", "1", "--eos-id", "2", "--dtype", "float64"]
    assert main(argv) == 0
    assert "float64" in capsys.readouterr().out


# -- errors: exit 2, the file and the problem named -----------------------------------------------
def run_error(capsys, argv) -> str:
    assert main(["convert", *argv]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    return captured.err


def test_errors(tmp_path, capsys):
    save_checkpoint(tmp_path / "n", TINY, random_weights(TINY, 0))
    n, pt = str(tmp_path / "n"), str(tmp_path / "m.pt")
    assert "nowhere.pt': no such file" in run_error(capsys, [str(tmp_path / "nowhere.pt"), pt])
    assert "cannot tell the destination format" in run_error(capsys, [n, str(tmp_path / "m.bin")])
    assert "pass --to" in run_error(capsys, [n, str(tmp_path / "m.bin")])
    assert "same path" in run_error(capsys, [n, n])
    assert "only for --from nn-transformer / annotated" in run_error(capsys, [n, pt, "--n-heads", "4"])
    (tmp_path / "text.pt").write_text("not a checkpoint")
    err = run_error(capsys, [str(tmp_path / "text.pt"), n + "2"])
    assert "text.pt" in err and "not a PyTorch file" in err
    assert not (tmp_path / "n2").exists()


def test_a_destination_that_is_no_earlier_export_or_holds_the_source_is_left_alone(tmp_path, capsys):
    """A neutral checkpoint holds only names a Marian export has (config.json, model.safetensors),
    and `--to marian` replaced it; a directory export into the folder holding SRC replaced the
    folder, SRC with it. Both are refused, and both stay as they were; an earlier Marian export
    is still replaced."""
    config = TransformerConfig.preset("tiny", norm_first=False, norm_style="standard", norm_eps=1e-5,
                                      pe_layout="halves")
    save_checkpoint(tmp_path / "n", config, random_weights(config, 0))
    save_checkpoint(tmp_path / "victim", config, random_weights(config, 1))
    n, victim = str(tmp_path / "n"), tmp_path / "victim"
    err = run_error(capsys, [n, str(victim), "--to", "marian"])
    assert "victim' exists and is not a Marian export; refusing to overwrite it" in err
    assert sorted(os.listdir(victim)) == ["config.json", "model.safetensors"]
    assert json.loads((victim / "config.json").read_text())["format_version"]  # still neutral
    (tmp_path / "q").mkdir()
    save_checkpoint(tmp_path / "q" / "model.safetensors", config, random_weights(config, 0))
    err = run_error(capsys, [str(tmp_path / "q" / "model.safetensors"), str(tmp_path / "q"), "--to", "marian"])
    assert "contains SRC" in err and "replacing it would delete the source" in err
    assert os.listdir(tmp_path / "q") == ["model.safetensors"]
    assert main(["convert", n, str(tmp_path / "m"), "--to", "marian"]) == 0
    assert main(["convert", str(victim), str(tmp_path / "m"), "--to", "marian"]) == 0  # its own: replaced


def test_verify_draws_ids_every_vocabulary_holds(tmp_path, capsys):
    """A source vocabulary of one id (pad) and a target of the three specials: --verify drew the
    BOS id as the one "ordinary" source id, out of range, and failed after writing DST."""
    config = TINY.replace(src_vocab=1, tgt_vocab=3)
    save_checkpoint(tmp_path / "n", config, random_weights(config, 0))
    assert main(["convert", str(tmp_path / "n"), str(tmp_path / "m.pt"), "--verify"]) == 0
    assert capsys.readouterr().out.rstrip().endswith("PASS")


def test_importer_errors(tmp_path, capsys):
    source = S.Seq2SeqTransformer(num_encoder_layers=1, num_decoder_layers=1, emb_size=8, nhead=2,
                                  src_vocab_size=7, tgt_vocab_size=7, dim_feedforward=12, maxlen=16)
    sd = str(tmp_path / "tutorial.pt")
    torch.save(source.state_dict(), sd)
    out = str(tmp_path / "m.pt")
    err = run_error(capsys, [sd, out, "--from", "nn-transformer", "--n-heads", "2", "--pad-id", "1"])
    assert "--bos-id, --eos-id, --norm-first required" in err
    # Without --from, the .pt is read as a torch_impl file and the error points at the importers.
    assert "--from nn-transformer" in run_error(capsys, [sd, out])
    # The importer's own refusals come through (here: the other layout's importer).
    err = run_error(capsys, [sd, out, "--from", "annotated", *ANN])
    assert "tutorial.pt' (from_annotated): " in err and "use from_nn_transformer" in err
    err = run_error(capsys, [sd, out, "--from", "annotated", *ANN, "--norm-first", "true"])
    assert "always pre-norm" in err
    assert not (tmp_path / "m.pt").exists()


def test_importer_source_that_would_run_code_is_refused(tmp_path, capsys):
    marker = tmp_path / "marker"

    class Payload:
        def __reduce__(self):
            return (open, (str(marker), "w"))
    torch.save({"transformer.encoder.norm.weight": Payload()}, tmp_path / "evil.pt")
    err = run_error(capsys, [str(tmp_path / "evil.pt"), str(tmp_path / "n"), "--from", "nn-transformer",
                             "--norm-first", "false", *NN])
    assert "evil.pt" in err and "refused" in err and not marker.exists()


def test_forced_formats_ignore_the_path(tmp_path, capsys):
    save_checkpoint(tmp_path / "n", TINY, random_weights(TINY, 0))
    assert main(["convert", str(tmp_path / "n"), str(tmp_path / "weights.bin"), "--to", "torch"]) == 0
    assert main(["convert", str(tmp_path / "weights.bin"), str(tmp_path / "m.weights.h5"),
                 "--from", "torch"]) == 0
    capsys.readouterr()
    assert tf_impl.load_checkpoint(tmp_path / "m.weights.h5").config == TINY
    # A neutral destination is a directory: an existing file there is refused, and kept.
    before = (tmp_path / "weights.bin").read_bytes()
    err = run_error(capsys, [str(tmp_path / "m.weights.h5"), str(tmp_path / "weights.bin"), "--to", "neutral"])
    assert "weights.bin" in err and "not a checkpoint" in err
    assert (tmp_path / "weights.bin").read_bytes() == before
