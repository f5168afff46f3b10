"""Hostile arguments to the mask helpers and the positional table: a clear error naming the argument,
the same in the NumPy reference (`shared.masks`) and both backends' ``inputs.make_*_mask``, before
anything is computed; never a silently wrong mask, another function's name or a MemoryError.

The helpers that exist in all three are parametrized over ``numpy`` / ``torch`` / ``tf``; a framework
that is not importable here is skipped by conftest (the ``torch`` / ``tf`` parameter values).
"""
import re

import numpy as np
import pytest

import shared.masks
from shared import make_src_mask, make_tgt_mask, padding_mask, positional_encoding, subsequent_mask
from shared.config import POSITIONAL_TABLE_LIMIT
from shared.masks import SUBSEQUENT_MASK_LIMIT
from shared.messages import shown
from shared.positional import inverse_frequencies
from twins.backends import to_numpy

IMPLS = ["numpy", "torch", "tf"]


def _impl(name: str):
    """``(module with make_src_mask / make_tgt_mask, ids converter)`` of one implementation; a
    framework is imported only by the tests that use it."""
    if name == "numpy":
        return shared.masks, np.asarray
    if name == "torch":
        import torch
        from torch_impl import inputs
        return inputs, torch.as_tensor
    import tensorflow as tf
    from tf_impl import inputs
    return inputs, tf.constant


IDS = np.array([[1, 2, 0]])
# Each would be compared with the ids element-wise: "0", 0.5 and NaN masked nothing (padding
# attended), True masked id 1, a list broadcast; a float 0.0 happens to work but is no id either.
BAD_PAD_IDS = ["0", 0.5, float("nan"), np.float64(0.5), True, np.bool_(False), [0], np.array(0), 0.0, b"0"]


def _pad_id_message(value) -> str:
    """The value quoted as every message quotes it (`shared.messages.shown`: NumPy 2's repr of a
    NumPy number, on NumPy 1 too)."""
    return re.escape(f"pad_id: expected an int (the padding id) or None (no padding masked), got {shown(value)}")


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("helper", ["make_src_mask", "make_tgt_mask"])
@pytest.mark.parametrize("pad_id", BAD_PAD_IDS, ids=shown)
def test_bad_pad_id_is_refused_alike(impl, helper, pad_id):
    inputs, ids = _impl(impl)
    with pytest.raises(TypeError, match=_pad_id_message(pad_id)):
        getattr(inputs, helper)(ids(IDS), pad_id)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("helper", ["make_src_mask", "make_tgt_mask"])
def test_pad_id_is_checked_before_the_ids(impl, helper):
    """Checked first, so all three name pad_id even where the ids are bad too."""
    inputs, ids = _impl(impl)
    with pytest.raises(TypeError, match=_pad_id_message("0")):
        getattr(inputs, helper)(ids(IDS.astype(np.float32)), "0")


@pytest.mark.parametrize("pad_id", BAD_PAD_IDS, ids=shown)
def test_padding_mask_bad_pad_id(pad_id):
    with pytest.raises(TypeError, match=_pad_id_message(pad_id)):
        padding_mask(IDS, pad_id)


@pytest.mark.parametrize("impl", IMPLS)
def test_good_pad_ids_unchanged(impl):
    """An int of any kind masks that id; None masks nothing (``config.mask_padding=False``)."""
    inputs, ids = _impl(impl)
    causal = np.tril(np.ones((3, 3), bool))
    for pad_id in (0, np.int64(0), np.uint8(0)):
        np.testing.assert_array_equal(to_numpy(inputs.make_src_mask(ids(IDS), pad_id))[0, 0, 0],
                                      [True, True, False])
        np.testing.assert_array_equal(to_numpy(inputs.make_tgt_mask(ids(IDS), pad_id))[0, 0],
                                      causal & [True, True, False])
    np.testing.assert_array_equal(to_numpy(inputs.make_src_mask(ids(IDS), None)), np.ones((1, 1, 1, 3), bool))
    for first_is_real in (False, True):
        np.testing.assert_array_equal(to_numpy(inputs.make_tgt_mask(ids(IDS), None, first_is_real)),
                                      causal[None, None])
    np.testing.assert_array_equal(padding_mask(IDS, None), np.ones((1, 1, 1, 3), bool))


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("pad_id", [0, None])
@pytest.mark.parametrize("first_is_real", [False, True])
def test_empty_sequence_gives_an_empty_mask_everywhere(impl, pad_id, first_is_real):
    """Length 0: an empty mask from both helpers in all three (the reference's target mask raised
    ``subsequent_mask: size ...``, naming neither the function called nor its argument)."""
    inputs, ids = _impl(impl)
    empty = ids(np.zeros((2, 0), np.int64))
    src_mask = to_numpy(inputs.make_src_mask(empty, pad_id))
    tgt_mask = to_numpy(inputs.make_tgt_mask(empty, pad_id, first_is_real))
    assert src_mask.shape == (2, 1, 1, 0) and src_mask.dtype == np.bool_
    assert tgt_mask.shape == (2, 1, 0, 0) and tgt_mask.dtype == np.bool_


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("dtype", [np.uint8, np.int16, np.int32, np.uint64])
def test_a_pad_id_the_ids_dtype_cannot_hold_masks_no_id(impl, dtype):
    """Compared as numbers: torch_impl compared in the ids' own dtype, so pad_id 300 wrapped to 44
    in uint8 and hid token 44 (tf_impl's helper too; its model widened the ids first, torch_impl's
    did not: wrong logits and tokens). A pad_id the dtype holds still masks it, negative ones none."""
    inputs, ids = _impl(impl)
    row = np.array([[5, 44, 7, 9]], dtype)
    for pad_id, keys in ((300, [1, 1, 1, 1]), (-212, [1, 1, 1, 1]), (2**70, [1, 1, 1, 1]), (44, [1, 0, 1, 1])):
        np.testing.assert_array_equal(to_numpy(inputs.make_src_mask(ids(row), pad_id)).ravel(), keys)
        np.testing.assert_array_equal(to_numpy(inputs.make_tgt_mask(ids(row), pad_id))[0, 0, -1], keys)


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("helper, name", [("make_src_mask", "src"), ("make_tgt_mask", "tgt")])
def test_ids_are_checked_alike(impl, helper, name):
    """Before, the backends' helpers did not check their ids: rank 1 failed in each framework's
    words (IndexError, InvalidArgumentError), float, bool or rank-3 ids gave a mask."""
    inputs, ids = _impl(impl)
    shape = r"token ids of shape \(batch, seq\), got shape"
    for value, error, message in ((np.array([5, 6]), ValueError, rf"{shape} \(2,\)"),
                                  (np.zeros((1, 2, 2), np.int64), ValueError, rf"{shape} \(1, 2, 2\)"),
                                  (np.array([[1.0, 2.0]]), TypeError, "integer token ids, got dtype float64"),
                                  (np.array([[True]]), TypeError, "integer token ids, got dtype bool")):
        with pytest.raises(error, match=f"^{name}: expected {message}$"):
            getattr(inputs, helper)(ids(value), 0)


@pytest.mark.parametrize("helper, name", [(make_src_mask, "src"), (make_tgt_mask, "tgt"),
                                          (padding_mask, "ids")])
def test_ragged_rows_get_the_project_message(helper, name):
    with pytest.raises(ValueError, match=rf"{name}: expected token ids of shape \(batch, seq\), every "
                                         r"row of one length, got rows of lengths \[2, 1\]"):
        helper([[1, 2], [3]], 0)


# Ids that hold no array of numbers, as the helpers that take any array (the reference's and
# tf_impl's; torch_impl's take torch tensors only, and say so) name them.
NOT_IDS = [(None, TypeError, "expected a tensor or array, got NoneType"),
           ([[1, [2, 3]]], TypeError, "expected a tensor or array, got list"),
           ([[1, 2], 3], TypeError, "expected a tensor or array, got list"),
           ([[1, None]], TypeError, "expected a tensor or array, got list"),
           ({"ids": [[1, 2]]}, TypeError, "expected a tensor or array, got dict"),
           (np.array([[1, 2]], dtype=object), TypeError,
            "expected a tensor or array of numbers, got an ndarray of dtype object"),
           ([["a", "b"]], TypeError, "expected integer token ids, got dtype string"),
           ("abc", ValueError, "expected token ids of shape (batch, seq), got rank 0 shape ()")]


@pytest.mark.parametrize("impl", ["numpy", "tf"])
@pytest.mark.parametrize("helper, name", [("make_src_mask", "src"), ("make_tgt_mask", "tgt")])
def test_ids_that_are_no_array_are_named_alike(impl, helper, name):
    """The reference's helpers failed in NumPy's words on lists ragged below their rows
    ("inhomogeneous shape"), read None and a dict as ids of "shape ()", and named a list holding
    None "dtype object" and text "dtype <U1": each now as tf_impl's names it."""
    inputs, _ = _impl(impl)
    for value, error, message in NOT_IDS:
        with pytest.raises(error, match=f"^{re.escape(f'{name}: {message}')}$"):
            getattr(inputs, helper)(value, 0)


def test_subsequent_mask_size_is_bounded():
    """10**7 asked NumPy for 10**14 bytes (MemoryError); refused by name before any allocation."""
    assert SUBSEQUENT_MASK_LIMIT ** 2 == POSITIONAL_TABLE_LIMIT
    for size in (10**7, SUBSEQUENT_MASK_LIMIT + 1, np.int64(2**62)):
        with pytest.raises(ValueError, match=rf"subsequent_mask: size expected at most "
                                             rf"{SUBSEQUENT_MASK_LIMIT} positions .*got {size}"):
            subsequent_mask(size)


def test_tgt_mask_length_is_bounded_naming_tgt():
    with pytest.raises(ValueError, match=rf"tgt: expected at most {SUBSEQUENT_MASK_LIMIT} positions "
                                         rf"\(a causal mask of at most POSITIONAL_TABLE_LIMIT = "
                                         rf"{POSITIONAL_TABLE_LIMIT} values\), got {SUBSEQUENT_MASK_LIMIT + 1}"):
        make_tgt_mask(np.zeros((1, SUBSEQUENT_MASK_LIMIT + 1), np.int64), 0)


@pytest.mark.parametrize("name", ["layout", "timescale"])
@pytest.mark.parametrize("value", [np.array(["interleaved", "halves"]), np.array(["paper"]), ["halves"],
                                   None, 0, b"halves"], ids=repr)
def test_layout_and_timescale_must_be_one_of_the_names(name, value):
    """An array was compared element-wise ("truth value of an array is ambiguous")."""
    with pytest.raises(ValueError, match=rf"positional_encoding: {name} expected one of \("):
        positional_encoding(3, 4, **{name: value})


def test_inverse_frequencies_timescale_must_be_a_name():
    with pytest.raises(ValueError, match=r"positional_encoding: timescale expected one of \("):
        inverse_frequencies(4, np.array(["t2t"]))


@pytest.mark.parametrize("max_len, d_model", [(10**13, 2), (POSITIONAL_TABLE_LIMIT // 2 + 1, 2),
                                              (np.int64(2**62), np.int64(4))])  # int64 product wraps to 0
def test_positional_table_is_bounded(max_len, d_model):
    """10**13 rows asked NumPy for 160 TB (MemoryError); the config's bound, by name."""
    with pytest.raises(ValueError, match=rf"positional_encoding: max_len expected max_len \* d_model <= "
                                         rf"POSITIONAL_TABLE_LIMIT = {POSITIONAL_TABLE_LIMIT} .*got "
                                         rf"{max_len} \* {d_model} = {int(max_len) * int(d_model)}$"):
        positional_encoding(max_len, d_model)
