import numpy as np
import pytest

from shared import make_src_mask, make_tgt_mask, padding_mask, subsequent_mask


def test_subsequent_is_lower_triangular_with_diagonal():
    m = subsequent_mask(5)
    assert m.shape == (1, 1, 5, 5) and m.dtype == np.bool_
    for i in range(5):
        for j in range(5):
            assert m[0, 0, i, j] == (j <= i)


def test_src_mask_marks_non_padding_keys():
    src = np.array([[5, 6, 0, 0], [7, 0, 0, 0]])
    m = make_src_mask(src, pad_id=0)
    assert m.shape == (2, 1, 1, 4)
    np.testing.assert_array_equal(m[:, 0, 0], src != 0)


def test_tgt_mask_is_padding_and_subsequent():
    tgt = np.array([[1, 4, 5, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    m = make_tgt_mask(tgt, pad_id=0)
    assert m.shape == (3, 1, 4, 4)
    for b in range(3):
        for i in range(4):
            for j in range(4):
                assert m[b, 0, i, j] == (tgt[b, j] != 0 and j <= i)
    assert not m[2].any()  # all padding: no query may attend anything


def test_padding_mask_other_pad_id():
    np.testing.assert_array_equal(padding_mask(np.array([[3, 9, 9]]), 9)[0, 0, 0], [True, False, False])


@pytest.mark.parametrize("fn", [make_src_mask, make_tgt_mask])
def test_bad_ids(fn):
    with pytest.raises(ValueError, match=r"shape \(batch, seq\), got shape \(3,\)"):
        fn(np.array([1, 2, 3]), 0)
    with pytest.raises(TypeError, match="integer token ids, got dtype float64"):
        fn(np.array([[1.0, 2.0]]), 0)


def test_bad_subsequent_size():
    with pytest.raises(ValueError, match="size expected a positive int, got 0"):
        subsequent_mask(0)
