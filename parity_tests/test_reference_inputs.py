"""Bad input to the reference: a clear error before anything is computed."""
import numpy as np
import pytest

from parity_tests.input_cases import BAD_IDS, BAD_MASKS, CONFIG, SRC, TGT, W
from shared import reference as R
from shared.weights import WeightsError


@pytest.mark.parametrize("src, tgt, error, needle", BAD_IDS)
def test_bad_ids(src, tgt, error, needle):
    with pytest.raises(error, match=needle):
        R.forward(W, CONFIG, src, tgt)


@pytest.mark.parametrize("kwargs, error, needle", [
    *BAD_MASKS, (dict(tgt_mask=[[True]]), TypeError,
                  r"^tgt_mask: expected a bool array or tensor \(True = may attend\), got list$")])
def test_bad_masks(kwargs, error, needle):
    with pytest.raises(error, match=needle):
        R.forward(W, CONFIG, SRC, TGT, **kwargs)


def test_broadcast_masks_are_accepted():
    """A causal mask given per head (batch 1, every head) and a padding mask given per batch row
    (one query row) broadcast: the logits are those of the masks made from the ids."""
    default, _ = R.forward(W, CONFIG, SRC, TGT)
    heads = np.ones((1, CONFIG.n_heads, 4, 4), bool) & np.tril(np.ones((4, 4), bool))
    assert np.array_equal(R.forward(W, CONFIG, SRC, TGT, tgt_mask=heads)[0], default)
    src_mask = (SRC != CONFIG.pad_id)[:, None, None, :]  # (2, 1, 1, 5)
    assert np.array_equal(R.forward(W, CONFIG, SRC, TGT, src_mask=src_mask)[0], default)
    shorter = R.forward(W, CONFIG, SRC, TGT, src_mask=src_mask & (np.arange(5) < 2))[0]
    assert not np.allclose(shorter, default)  # the mask given is the mask used


def test_bad_weights_and_config():
    with pytest.raises(WeightsError, match="missing"):
        R.forward({k: v for k, v in W.items() if k != "generator.bias"}, CONFIG, SRC, TGT)
    with pytest.raises(TypeError, match="config: expected a TransformerConfig, got dict"):
        R.forward(W, CONFIG.to_dict(), SRC, TGT)
