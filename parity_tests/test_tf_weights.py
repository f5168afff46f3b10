"""What only tf_impl has in its weights and files: Keras' own ``model.save`` / ``load_model``, and
the ``.weights.h5`` as a plain Keras weights file (``load_weights`` reads it; a plain
``save_weights`` file is read given the config).

The contracts both backends share are in test_backend_weights.py and test_checkpoints.py.
"""
import os

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import h5py  # noqa: E402

import tf_impl  # noqa: E402
from parity_tests.checkpoint_backends import TINY, assert_same_bytes  # noqa: E402
from parity_tests.tf_support import run_logits  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.weights import random_weights  # noqa: E402

pytestmark = pytest.mark.tf


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_keras_save_and_load_model_round_trip(tmp_path, dtype):
    """``model.save`` / ``keras.models.load_model`` keep every weight (Keras' saving skips attributes
    that a plain Layer also has, such as ``output``: the attention's output projection must still be
    saved)."""
    import keras

    config = TransformerConfig.preset("tiny", dtype=dtype).replace(tie_output=True)
    model = tf_impl.Transformer(config)
    model.import_weights(random_weights(config, 4))
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert isinstance(loaded, tf_impl.Transformer) and loaded.config == config
    before, after = model.export_weights(), loaded.export_weights()
    assert all(after[k].tobytes() == before[k].tobytes() for k in before)
    src, tgt = src_tgt(config)
    np.testing.assert_array_equal(run_logits(loaded, src, tgt), run_logits(model, src, tgt))


def test_h5_is_a_keras_weights_file_with_the_config_inside(tmp_path):
    weights = random_weights(TINY, 2)
    model = tf_impl.Transformer(TINY)
    model.import_weights(weights)
    tf_impl.save_checkpoint(model, tmp_path / "m.weights.h5")
    assert sorted(os.listdir(tmp_path)) == ["m.weights.h5"]  # no sidecar, no temporary left
    with h5py.File(tmp_path / "m.weights.h5", "r") as f:
        assert TransformerConfig.from_json(f.attrs["twin_transformer.config"]) == TINY
        assert f.attrs["twin_transformer.format_version"] == 1
    plain = tf_impl.Transformer(TINY)
    plain.load_weights(str(tmp_path / "m.weights.h5"))  # plain Keras ignores the attributes
    assert_same_bytes(plain.export_weights(), weights)
    # A file from plain Keras save_weights holds no config: read given one, refused without.
    plain.save_weights(str(tmp_path / "keras.weights.h5"))
    with pytest.raises(ValueError, match="keras.weights.h5.*holds no config.*--config"):
        tf_impl.load_checkpoint(tmp_path / "keras.weights.h5")
    loaded = tf_impl.load_checkpoint(tmp_path / "keras.weights.h5", config=TINY)
    assert_same_bytes(loaded.export_weights(), weights)
