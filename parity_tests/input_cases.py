"""Bad ids and bad masks for the forward pass, with the error each must raise: one list for the
reference alone (test_reference_inputs.py, which imports no framework) and for every eager backend
beside it (test_inputs.py, which also compares their messages with the reference's)."""
import numpy as np

from shared import TransformerConfig
from shared.batches import src_tgt
from shared.weights import random_weights

CONFIG = TransformerConfig.preset("tiny")
W = random_weights(CONFIG, 0)
SRC, TGT = src_tgt(CONFIG, batch=2, src_len=5, tgt_len=4)  # (2, 5) and (2, 4) int64


def with_id(ids: np.ndarray, value: int, row: int = 0) -> np.ndarray:
    """A copy of ``ids`` holding ``value`` at ``[row, 1]``."""
    out = ids.copy()
    out[row, 1] = value
    return out


# (src, tgt, error type, the message's pattern)
BAD_IDS = [
    (SRC[0], TGT, ValueError, r"src: expected token ids of shape \(batch, seq\), got rank 1"),
    (SRC, TGT[None], ValueError, "tgt: expected token ids of shape"),
    (SRC.astype(np.float32), TGT, TypeError, "src: expected integer token ids, got dtype float32"),
    (SRC.astype(np.float64), TGT, TypeError, "src: expected integer token ids, got dtype float64"),
    (SRC, TGT.astype(bool), TypeError, "tgt: expected integer token ids, got dtype bool"),
    (with_id(SRC, 13), TGT, ValueError, r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"),
    (SRC, with_id(TGT, -1), ValueError, r"tgt: expected token ids in \[0, 17\), got values in \[-1,"),
    (np.ones((2, 65), np.int64), TGT, ValueError, "src: expected at most max_len=64 tokens, got 65"),
    (SRC[:, :0], TGT, ValueError, r"src: expected a non-empty \(batch, seq\), got shape \(2, 0\)"),
    (SRC, TGT[:1], ValueError, "tgt: expected batch size 2 \\(as src\\), got 1"),
]

# (the forward pass's mask keywords, error type, the message's pattern); bool = True may attend
BAD_MASKS = [
    (dict(src_mask=np.ones((2, 1, 1, 5), np.int64)), TypeError,
     "src_mask: expected a bool mask .*got dtype int64"),
    (dict(src_mask=np.ones((2, 5), bool)), ValueError, r"src_mask: expected a rank-4 mask"),
    (dict(src_mask=np.ones((2, 1, 5, 5), bool)), ValueError, r"src_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 5), bool)), ValueError,
     r"tgt_mask: expected a mask broadcastable to \(batch\|1"),
    (dict(tgt_mask=np.ones((3, 1, 4, 4), bool)), ValueError, "tgt_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 4), np.float32)), TypeError, "tgt_mask: expected a bool mask"),
]
