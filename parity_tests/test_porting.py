"""Porting weights across the frameworks through the files: torch ``.pt`` -> neutral -> Keras
``.weights.h5`` -> neutral -> torch, byte for byte, and a neutral checkpoint computing the same in
either backend.

One backend's files on their own are in test_checkpoints.py (and test_torch_weights.py,
test_tf_weights.py for what one format alone has); `twins convert` in test_porting_convert.py.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from parity_tests.checkpoint_backends import TIED, TINY, assert_same_bytes  # noqa: E402
from shared.weights import random_weights, save_checkpoint  # noqa: E402
from tf_impl import checkpoints as tf_ckpt  # noqa: E402
from torch_impl import checkpoints as torch_ckpt  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.tf]

IMPL = {"torch": torch_impl, "tf": tf_impl}


@pytest.mark.parametrize("config", [TINY, TIED], ids=["tiny_float32", "tied_float64"])
def test_round_trip_through_the_files_is_byte_identical(tmp_path, config):
    """torch -> .pt -> neutral -> TF -> .weights.h5 -> neutral -> torch -> .pt: every tensor the
    same bytes (compared as bytes, not within a tolerance), and the files themselves too."""
    weights = random_weights(config, 5)
    weights["generator.bias"][0] = -0.0  # the sign of zero survives too
    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    torch_impl.save_checkpoint(model, tmp_path / "a.pt")
    torch_impl.save_checkpoint(torch_impl.load_checkpoint(tmp_path / "a.pt"), tmp_path / "n1")
    tf_impl.save_checkpoint(tf_impl.load_checkpoint(tmp_path / "n1"), tmp_path / "b.weights.h5")
    tf_impl.save_checkpoint(tf_impl.load_checkpoint(tmp_path / "b.weights.h5"), tmp_path / "n2")
    last = torch_impl.load_checkpoint(tmp_path / "n2")
    torch_impl.save_checkpoint(last, tmp_path / "c.pt")

    assert last.config == config
    assert_same_bytes(last.export_weights(), weights)
    for path in ("a.pt", "b.weights.h5", "c.pt"):  # each file read on its own
        reader = tf_ckpt if path.endswith(".h5") else torch_ckpt
        assert_same_bytes(reader.read_checkpoint(tmp_path / path)[1], weights)
    first = torch.load(tmp_path / "a.pt", weights_only=True)["state_dict"]
    again = torch.load(tmp_path / "c.pt", weights_only=True)["state_dict"]
    assert list(first) == list(again)
    for key in first:
        assert first[key].dtype == again[key].dtype
        assert first[key].numpy().tobytes() == again[key].numpy().tobytes(), key
    assert (tmp_path / "a.pt").read_bytes() == (tmp_path / "c.pt").read_bytes()
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "n1" / name).read_bytes() == (tmp_path / "n2" / name).read_bytes()


@pytest.mark.parametrize("backend", IMPL)
def test_neutral_checkpoint_from_either_backend_computes_the_same(tmp_path, backend):
    from shared import reference
    from shared.batches import src_tgt
    from shared.tolerances import assert_close, bound_for

    config, weights = TINY, random_weights(TINY, 3)
    save_checkpoint(tmp_path / "c", config, weights)
    model = IMPL[backend].load_checkpoint(tmp_path / "c")
    src, tgt = src_tgt(config, 2, 7, 5)
    with torch.no_grad():
        logits = model(torch.as_tensor(src), torch.as_tensor(tgt)) if backend == "torch" else model(src, tgt)
    assert_close(np.asarray(logits), reference.forward(weights, config, src, tgt),
                 bound_for("float32", f"{backend}:reference"), "logits")
