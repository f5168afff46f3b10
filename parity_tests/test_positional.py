import numpy as np
import pytest
from hypothesis import given, strategies as st

from shared import positional_encoding


def test_first_pair_is_sin_and_cos_of_position():
    pe = positional_encoding(50, 8)
    p = np.arange(50)
    np.testing.assert_array_equal(pe[:, 0], np.sin(p))
    np.testing.assert_array_equal(pe[:, 1], np.cos(p))
    assert pe.dtype == np.float64 and pe.shape == (50, 8)


def test_closed_form_every_column():
    d = 10
    pe = positional_encoding(20, d)
    for p in range(20):
        for i in range(d // 2):
            angle = p / 10000 ** (2 * i / d)
            assert pe[p, 2 * i] == pytest.approx(np.sin(angle), abs=1e-15)
            assert pe[p, 2 * i + 1] == pytest.approx(np.cos(angle), abs=1e-15)


@given(p=st.integers(0, 60), k=st.integers(0, 60), d=st.sampled_from([2, 4, 8, 16, 64]))
def test_shift_is_a_fixed_rotation_of_each_pair(p, k, d):
    """PE(p + k) = R(k) PE(p) with R(k) block-diagonal of 2x2 rotations by k * w_i, independent of p."""
    pe = positional_encoding(128, d)
    for i in range(d // 2):
        w = 10000.0 ** (-2 * i / d)
        c, s = np.cos(k * w), np.sin(k * w)
        rotation = np.array([[c, s], [-s, c]])  # acts on (sin, cos) column pairs
        shifted = rotation @ pe[p, 2 * i: 2 * i + 2]
        np.testing.assert_allclose(shifted, pe[p + k, 2 * i: 2 * i + 2], atol=1e-12)


def test_odd_width_keeps_a_last_sine_column():
    pe = positional_encoding(5, 5)
    np.testing.assert_allclose(pe[:, 4], np.sin(np.arange(5) / 10000 ** (4 / 5)), rtol=1e-15, atol=0)


@pytest.mark.parametrize("args, error", [((0, 4), ValueError), ((4, 0), ValueError), ((4.0, 4), TypeError),
                                         ((True, 4), TypeError)])
def test_bad_sizes(args, error):
    with pytest.raises(error, match="expected a positive int"):
        positional_encoding(*args)


@pytest.mark.parametrize("integer", [np.int8, np.uint8, np.int16, np.int32, np.uint32, np.int64, np.uint64])
def test_numpy_integers_give_the_table_of_python_ints(integer):
    """Before: a NumPy int narrower than 64 bits as max_len met the offset's bound (2**53) in its
    own width, NumPy's OverflowError naming nothing."""
    want = positional_encoding(6, 8, "halves", "t2t", offset=2)
    got = positional_encoding(integer(6), integer(8), "halves", "t2t", offset=integer(2))
    assert got.dtype == np.float64 and np.array_equal(got, want)


def test_public_helpers_check_their_arguments_by_name():
    """Before: inverse_frequencies of -4, 0 or None gave an empty array, 3.5 and True were taken,
    2**40 was NumPy's MemoryError of 4 TiB; positional_table(None), padding_id(None) and
    start_is_pad(None) an AttributeError naming a field."""
    from shared.masks import padding_id, start_is_pad
    from shared.positional import inverse_frequencies, positional_table
    for bad, error in ((-4, ValueError), (0, ValueError), (None, TypeError), (3.5, TypeError), (True, TypeError),
                       ("8", TypeError)):
        with pytest.raises(error, match=r"^inverse_frequencies: d_model expected a positive int, got "):
            inverse_frequencies(bad)
    with pytest.raises(ValueError, match=r"^inverse_frequencies: d_model expected at most POSITIONAL_TABLE_LIMIT"):
        inverse_frequencies(2**40)
    assert inverse_frequencies(np.int64(8)).shape == (4,)
    for helper in (positional_table, padding_id, start_is_pad):
        with pytest.raises(TypeError, match=r"^config: expected a TransformerConfig, got NoneType$"):
            helper(None)
