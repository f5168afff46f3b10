"""``--device``: `twins decode`, `compare` and `train` on the CPU or a GPU, in both backends
(`shared.devices`, `twins.backends`).

Every case runs on the CPU, and on each GPU the backend's framework sees on this machine (the
CUDA cases run on the GPU machines, where torch sees one). A device the framework does not see is
refused with the same sentence in both backends, the GPUs it does see named: the cases ask for one
past the last (``cuda:0`` on a machine without a GPU). In-process through `twins.cli.main`, tiny
models.
"""
from __future__ import annotations

import json
import re

import numpy as np
import pytest

from parity_tests import importable
from parity_tests.cli_runs import cli
from shared import TransformerConfig, reference
from shared.devices import parse_device, unavailable
from shared.weights import load_checkpoint, random_weights, save_checkpoint

TINY = TransformerConfig.preset("tiny")
SRC = [[5, 6, 7, 8], [9, 4, 3, 0]]  # the second row padded (pad_id 0)
SEED = 5  # weights whose greedy tokens vary, one row ending at EOS (most tiny random models repeat one)


def gpus(backend: str) -> int:
    """How many GPUs ``backend``'s framework sees here (0 where it is not importable)."""
    if backend == "torch" and importable.present("torch"):
        import torch
        return torch.cuda.device_count()
    if backend == "tf" and importable.present("tf"):
        import tensorflow as tf
        return len(tf.config.list_physical_devices("GPU"))
    return 0


# TensorFlow's cases run where it sees a GPU (its CPU's scope included): where it sees none,
# `--device cpu` takes no scope (`twins.backends.TF._scope_of`), the path of every other TF test
# of the commands (test_cli_compare, test_formats, test_train, test_demos), at 4 to 13 s a case here;
# the scopes' wiring is checked on any machine by the last test below.
CASES = [(backend, device) for backend in ("torch", "tf") if backend == "torch" or gpus("tf")
         for device in ["cpu"] + [f"cuda:{i}" for i in range(gpus(backend))]]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("devices") / "tiny"
    save_checkpoint(path, TINY, random_weights(TINY, seed=SEED))
    return path


# -- the spelling: shared/devices.py and argparse ---------------------------------------------------
# (ids without the word: gpu_session.py counts the cases whose name says "cuda" as the GPU's)
REFUSED = ["gpu", "GPU:0", "CUDA", "cuda:", "cuda:-1", "cuda:+1", "cuda:0 ", "/GPU:0", "cuda:\u0663", "",
           "cpu:0", "cuda:1234567"]


@pytest.mark.parametrize("device, parsed", [("cpu", ("cpu", None)), ("cuda", ("cuda", 0)),
                                            ("cuda:0", ("cuda", 0)), ("cuda:12", ("cuda", 12))],
                         ids=["cpu", "first-gpu", "gpu-0", "gpu-12"])
def test_a_device_is_the_cpu_or_a_gpu(device, parsed):
    assert parse_device(device) == parsed


@pytest.mark.parametrize("device", REFUSED, ids=[f"spelling-{i}" for i in range(len(REFUSED))])
def test_any_other_spelling_is_refused_by_name(device):
    with pytest.raises(ValueError, match=f"^{re.escape(f'where: expected cpu, cuda or cuda:N, got {device!r}')}$"):
        parse_device(device, "where")


def test_a_device_that_is_not_a_name_is_a_type_error():
    with pytest.raises(TypeError, match=r"^device: expected a device name \(cpu, cuda or cuda:N\), got int$"):
        parse_device(0)


@pytest.mark.parametrize("command", ["decode", "compare", "train"])
def test_the_commands_refuse_a_misspelt_device_while_parsing(capsys, tmp_path, command):
    argv = {"decode": ["--checkpoint", tmp_path / "none", "--src", "5 6"],
            "compare": ["--preset", "tiny"],
            "train": ["--task", "copy", "--backend", "torch", "--steps", "1", "--checkpoint", tmp_path / "run"]}
    code, out, err = cli(capsys, command, *argv[command], "--device", "gpu")
    assert code == 2 and out == ""
    assert err.strip().splitlines()[-1].startswith(
        f"twins {command}: error: argument --device: expected cpu, cuda or cuda:N, got 'gpu'")
    assert list(tmp_path.iterdir()) == []


# -- a device the framework does not see: the same sentence in both backends ------------------------
@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_gpu_the_framework_does_not_see_is_refused_naming_those_it_sees(capsys, checkpoint, tmp_path, backend):
    seen = gpus(backend)
    device = f"cuda:{seen}"
    if backend == "torch":
        import torch
        framework = f"torch {torch.__version__}"
    else:
        import tensorflow as tf
        framework = f"TensorFlow {tf.__version__}"
    for command, argv in [("decode", ["--checkpoint", checkpoint, "--src", "5 6", "--backend", backend]),
                          ("compare", ["--preset", "tiny", "--backends", backend]),
                          ("train", ["--task", "copy", "--backend", backend, "--steps", "1",
                                     "--preset", "tiny", "--checkpoint", tmp_path / "run"])]:
        code, out, err = cli(capsys, command, *argv, "--device", device)
        assert code == 2, err
        assert err.strip().splitlines()[-1] == (f"twins {command}: error: "
                                                + unavailable("--device", device, framework, seen))
    assert not (tmp_path / "run").exists()  # nothing half-made


def test_the_message_names_the_gpus_seen():
    assert unavailable("device", "cuda:1", "torch 2.11", 1) == (
        "device: expected a device that torch 2.11 sees, got 'cuda:1' (it sees 1 GPU: cuda:0)")
    assert unavailable("device", "cuda:3", "TensorFlow 2.21", 3).endswith("(it sees 3 GPUs: cuda:0 to cuda:2)")


def test_what_runs_only_on_the_cpu_refuses_a_gpu(capsys, checkpoint, tmp_path):
    """ONNX Runtime (its CPU provider) and data-parallel training (CPU processes): refused before
    any work, whatever this machine has."""
    code, _, err = cli(capsys, "decode", "--checkpoint", checkpoint, "--src", "5 6", "--backend", "onnx",
                       "--device", "cuda")
    assert code == 2 and err.strip().endswith(
        "twins decode: error: --device: the onnx backend runs on ONNX Runtime's CPU provider, got 'cuda'")
    code, _, err = cli(capsys, "compare", "--preset", "tiny", "--backends", "torch,onnx", "--device", "cuda")
    assert code == 2 and err.strip().endswith(
        "twins compare: error: --backends onnx with --device cuda: ONNX Runtime runs here on its CPU "
        "provider; drop onnx from --backends or use --device cpu")
    code, _, err = cli(capsys, "train", "--task", "copy", "--backend", "torch", "--steps", "1",
                       "--checkpoint", tmp_path / "run", "--workers", "2", "--device", "cuda")
    assert code == 2 and err.strip().endswith(
        "twins train: error: --device cuda with --workers 2: data-parallel training runs on CPU "
        "processes (torch: gloo; tf: logical CPU devices); drop one")
    assert not (tmp_path / "run").exists()


# -- on each device the framework sees ---------------------------------------------------------------
@pytest.mark.parametrize("backend, device", CASES)
def test_decode_on_a_device_gives_the_oracle_s_tokens(capsys, checkpoint, backend, device):
    code, out, err = cli(capsys, "decode", "--checkpoint", checkpoint, "--backend", backend, "--device", device,
                         "--src", " ".join(map(str, SRC[0])), "--src", " ".join(map(str, SRC[1])),
                         "--max-new", "6", "--json", "-")
    assert code == 0, err
    model = reference.Model(random_weights(TINY, seed=SEED), TINY)
    expected = reference.greedy_decode(model, np.array(SRC), 6)
    report = json.loads(out)
    assert report["device"] == device
    oracle = [t[:n].tolist() for t, n in zip(expected.tokens, expected.lengths)]
    oracle = [(t[:-1], True) if t[-1] == TINY.eos_id else (t, False) for t in oracle]  # EOS as a flag
    assert [(r["tokens"], r["eos"]) for r in report["results"]] == oracle
    assert oracle[1][1]  # (the second row ends at EOS)


@pytest.mark.parametrize("backend, device", CASES)
def test_compare_on_a_device_passes_against_the_same_bounds(capsys, backend, device):
    code, out, err = cli(capsys, "compare", "--preset", "tiny", "--backends", backend, "--device", device,
                         "--src-len", "4", "--tgt-len", "3", "--decode", "--max-new", "4", "--json", "-")
    assert code == 0, err
    result = json.loads(out)
    assert result["pass"] is True and result["skipped"] == {}
    assert len(result["rows"]) > 40 and all(r["pairs"][f"{backend}:reference"]["pass"] for r in result["rows"])


@pytest.mark.parametrize("backend, device", CASES)
def test_train_on_a_device_saves_a_run_that_records_it_and_resumes_on_the_cpu(capsys, tmp_path, backend, device):
    run = tmp_path / "run"
    code, out, err = cli(capsys, "train", "--task", "copy", "--backend", backend, "--device", device,
                         "--preset", "tiny", "--steps", "2", "--batch", "8", "--eval-every", "0",
                         "--heldout", "2", "--checkpoint", run, "--no-progress")
    assert code == 0, err
    assert out.startswith(f"twins train: copy on {backend}{f' ({device})' if device != 'cpu' else ''}, ")
    log = json.loads((run / "train_log.json").read_text())
    assert log["step"] == 2 and log["segments"][-1]["device"] == device
    _, weights = load_checkpoint(run)
    assert all(np.isfinite(w).all() for w in weights.values())
    # and it resumes on the CPU, Adam's moments and all (from the GPU's: moved to the CPU)
    code, out, err = cli(capsys, "train", "--task", "copy", "--backend", backend, "--steps", "1",
                         "--eval-every", "0", "--heldout", "2", "--checkpoint", run, "--no-progress")
    assert code == 0, err
    assert "Adam's moments restored" in out
    log = json.loads((run / "train_log.json").read_text())
    assert log["step"] == 3 and [g["device"] for g in log["segments"]] == [device, "cpu"]


@pytest.mark.tf
def test_tf_builds_and_calls_in_the_device_s_scope_where_it_sees_a_gpu(capsys, monkeypatch, checkpoint):
    """Where TensorFlow sees a GPU it would put every operation there: `--device cpu` then builds
    and calls the model inside ``tf.device("/CPU:0")``, and `--device cuda:0` inside
    ``tf.device("/GPU:0")``. Run here with a GPU TensorFlow is made to report (the scopes' code
    path on any machine; where no GPU is there, TensorFlow's soft placement runs the second on the
    CPU, so this checks the wiring, not a GPU's arithmetic): `twins decode` gives the oracle's
    tokens, the adapter's logits are the oracle's within the float32 bound, and every scope entered
    named the device asked for."""
    import tensorflow as tf
    from shared.tolerances import bound_for
    from twins.backends import make_adapter

    fake = [tf.config.PhysicalDevice(name="/physical_device:GPU:0", device_type="GPU")]
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: fake if kind == "GPU" else real(kind))
    monkeypatch.setattr(tf.config.experimental, "enable_tensor_float_32_execution", lambda on: None)
    scopes = []
    device = tf.device
    monkeypatch.setattr(tf, "device", lambda name: scopes.append(name) or device(name))
    test_decode_on_a_device_gives_the_oracle_s_tokens(capsys, checkpoint, "tf", "cpu")
    assert len(scopes) > 2 and set(scopes) == {"/CPU:0"}
    if real("GPU"):  # a real GPU's cases are the parametrized ones above
        return
    scopes.clear()
    weights = random_weights(TINY, seed=SEED)
    src, tgt = np.array(SRC), np.array([[1, 5, 6], [1, 9, 0]])
    adapter = make_adapter("tf", TINY, weights, device="cuda:0")
    assert bound_for("float32", "tf:reference").allows(adapter.logits(src, tgt),
                                                       reference.forward(weights, TINY, src, tgt))
    assert len(scopes) > 1 and set(scopes) == {"/GPU:0"}
