"""Bad input to the reference: a clear error before anything is computed."""
import numpy as np
import pytest

from shared.batches import src_tgt
from shared import TransformerConfig
from shared import reference as R
from shared.weights import WeightsError, random_weights

CONFIG = TransformerConfig.preset("tiny")
W = random_weights(CONFIG, 0)
SRC, TGT = src_tgt(CONFIG, batch=2, src_len=5, tgt_len=4)


def _with(ids, value):
    out = ids.copy()
    out[0, 1] = value
    return out


@pytest.mark.parametrize("src, tgt, error, needle", [
    (SRC[0], TGT, ValueError, r"src: expected token ids of shape \(batch, seq\), got rank 1"),
    (SRC, TGT[None], ValueError, "tgt: expected token ids of shape"),
    (SRC.astype(np.float32), TGT, TypeError, "src: expected integer token ids, got dtype float32"),
    (SRC, TGT.astype(bool), TypeError, "tgt: expected integer token ids, got dtype bool"),
    (_with(SRC, 13), TGT, ValueError, r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"),
    (SRC, _with(TGT, -1), ValueError, r"tgt: expected token ids in \[0, 17\), got values in \[-1,"),
    (np.ones((2, 65), np.int64), TGT, ValueError, "src: expected at most max_len=64 tokens, got 65"),
    (SRC[:, :0], TGT, ValueError, r"src: expected a non-empty \(batch, seq\), got shape \(2, 0\)"),
    (SRC, TGT[:1], ValueError, "tgt: expected batch size 2 \\(as src\\), got 1"),
])
def test_bad_ids(src, tgt, error, needle):
    with pytest.raises(error, match=needle):
        R.forward(W, CONFIG, src, tgt)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(src_mask=np.ones((2, 1, 1, 5), np.int64)), TypeError, "src_mask: expected a bool mask .*got dtype int64"),
    (dict(src_mask=np.ones((2, 5), bool)), ValueError, r"src_mask: expected a rank-4 mask"),
    (dict(src_mask=np.ones((2, 1, 5, 5), bool)), ValueError, r"src_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 5), bool)), ValueError, r"tgt_mask: expected a mask broadcastable to \(batch\|1"),
    (dict(tgt_mask=np.ones((3, 1, 4, 4), bool)), ValueError, "tgt_mask: expected a mask broadcastable"),
    (dict(tgt_mask=[[True]]), TypeError, "tgt_mask: expected a numpy bool array, got list"),
])
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
