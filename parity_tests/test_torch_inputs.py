"""Bad input to torch_impl: the same error types and messages as the reference, before any compute."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from shared.batches import src_tgt  # noqa: E402
from parity_tests.torch_support import build, run_logits  # noqa: E402
from shared import TransformerConfig, make_src_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402

CONFIG = TransformerConfig.preset("tiny")
W = random_weights(CONFIG, 0)
MODEL = build(CONFIG, W)
SRC, TGT = src_tgt(CONFIG, batch=2, src_len=5, tgt_len=4)


def _with(ids, value):
    out = ids.copy()
    out[0, 1] = value
    return out


BAD_IDS = [
    (SRC[0], TGT, ValueError, r"src: expected token ids of shape \(batch, seq\), got rank 1"),
    (SRC, TGT[None], ValueError, "tgt: expected token ids of shape"),
    (SRC.astype(np.float32), TGT, TypeError, "src: expected integer token ids, got dtype float32"),
    (SRC, TGT.astype(bool), TypeError, "tgt: expected integer token ids, got dtype bool"),
    (_with(SRC, 13), TGT, ValueError, r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"),
    (SRC, _with(TGT, -1), ValueError, r"tgt: expected token ids in \[0, 17\), got values in \[-1,"),
    (np.ones((2, 65), np.int64), TGT, ValueError, "src: expected at most max_len=64 tokens, got 65"),
    (SRC[:, :0], TGT, ValueError, r"src: expected a non-empty \(batch, seq\), got shape \(2, 0\)"),
    (SRC, TGT[:1], ValueError, "tgt: expected batch size 2 \\(as src\\), got 1"),
]


@pytest.mark.parametrize("src, tgt, error, needle", BAD_IDS)
def test_bad_ids_fail_like_the_reference(src, tgt, error, needle):
    with pytest.raises(error, match=needle) as ours:
        MODEL(torch.from_numpy(src), torch.from_numpy(tgt))
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, src, tgt)
    assert str(ours.value) == str(theirs.value)


def test_ids_must_be_tensors():
    with pytest.raises(TypeError, match="src: expected a torch tensor of token ids, got ndarray"):
        MODEL(SRC, torch.from_numpy(TGT))
    with pytest.raises(TypeError, match="tgt: expected a torch tensor of token ids, got list"):
        MODEL(torch.from_numpy(SRC), TGT.tolist())


MASKS = [
    (dict(src_mask=np.ones((2, 1, 1, 5), np.int64)), TypeError, "src_mask: expected a bool mask .*got dtype int64"),
    (dict(src_mask=np.ones((2, 5), bool)), ValueError, r"src_mask: expected a rank-4 mask"),
    (dict(src_mask=np.ones((2, 1, 5, 5), bool)), ValueError, r"src_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 5), bool)), ValueError, r"tgt_mask: expected a mask broadcastable to \(batch\|1"),
    (dict(tgt_mask=np.ones((3, 1, 4, 4), bool)), ValueError, "tgt_mask: expected a mask broadcastable"),
    (dict(tgt_mask=np.ones((2, 1, 4, 4), np.float32)), TypeError, "tgt_mask: expected a bool mask"),
]


@pytest.mark.parametrize("kwargs, error, needle", MASKS)
def test_bad_masks_fail_like_the_reference(kwargs, error, needle):
    masks = {k: torch.from_numpy(v) for k, v in kwargs.items()}
    with pytest.raises(error, match=needle) as ours:
        MODEL(torch.from_numpy(SRC), torch.from_numpy(TGT), **masks)
    with pytest.raises(error) as theirs:
        R.forward(W, CONFIG, SRC, TGT, **kwargs)
    assert str(ours.value) == str(theirs.value)


def test_masks_must_be_tensors():
    with pytest.raises(TypeError, match="tgt_mask: expected a torch bool tensor, got list"):
        MODEL(torch.from_numpy(SRC), torch.from_numpy(TGT), tgt_mask=[[True]])


def test_ids_are_checked_before_any_lookup():
    """An id out of range must not reach the embedding (CPU: IndexError; CUDA: a device assert)."""
    with pytest.raises(ValueError, match="src: expected token ids in"):
        MODEL.encode(torch.from_numpy(_with(SRC, 100)))


def test_broadcast_and_explicit_masks_are_accepted():
    heads = np.ones((1, CONFIG.n_heads, 4, 4), bool) & np.tril(np.ones((4, 4), bool))
    want = R.forward(W, CONFIG, SRC, TGT, tgt_mask=heads)
    got = run_logits(MODEL, SRC, TGT, tgt_mask=torch.from_numpy(heads))
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * max(1, np.abs(want).max()))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int16, torch.uint8])
def test_other_integer_dtypes_give_the_same_logits(dtype):
    want = run_logits(MODEL, SRC, TGT)
    with torch.no_grad():
        got = MODEL(torch.from_numpy(SRC).to(dtype), torch.from_numpy(TGT).to(dtype)).numpy()
    np.testing.assert_array_equal(got, want)


def test_decode_checks_memory_and_requires_src_mask():
    src, tgt = torch.from_numpy(SRC), torch.from_numpy(TGT)
    memory = MODEL.encode(src)
    mask = torch.from_numpy(make_src_mask(SRC, CONFIG.pad_id))
    with pytest.raises(ValueError, match="src_mask: required by decode"):
        MODEL.decode(tgt, memory, None)
    with pytest.raises(ValueError, match=r"memory: expected a tensor of shape \(batch, src_len, 16\)"):
        MODEL.decode(tgt, memory[..., :8], mask)
    with pytest.raises(ValueError, match="tgt: expected batch size 1"):
        MODEL.decode(tgt, memory[:1], mask)
    with pytest.raises(ValueError, match="src_mask: expected a mask broadcastable"):
        MODEL.decode(tgt, memory, mask[..., :3])
