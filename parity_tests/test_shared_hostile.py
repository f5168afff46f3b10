"""Hostile arguments to shared/'s weights, batches and tolerances: a clear error naming the argument,
what was expected and what was got (docs/design.md), before anything is drawn, built or written.
NumPy only."""
import os
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

import shared.memory as memory
from shared import TransformerConfig
from shared.batches import src_tgt, token_batch
from shared.checks import check_config, check_seed
from shared.tolerances import FLOAT64, bound_for, max_abs_diff
from shared.weights import (check_buildable, check_fits, check_weights, init_weights, parameter_count,
                            random_weights, save_checkpoint, weight_schema)

TINY = TransformerConfig.preset("tiny")
ROOT = Path(__file__).resolve().parents[1]


# -- seeds ----------------------------------------------------------------------------------------
SEEDED = {
    "init_weights": lambda seed: init_weights(TINY, seed),
    "random_weights": lambda seed: random_weights(TINY, seed),
    "token_batch": lambda seed: token_batch(TINY, 13, 2, 4, seed),
    "src_tgt": lambda seed: src_tgt(TINY, seed=seed),
}


@pytest.mark.parametrize("call", SEEDED.values(), ids=SEEDED.keys())
@pytest.mark.parametrize("seed, error, got", [
    (-1, ValueError, "-1"),
    (1.5, TypeError, "1.5"),
    ("0", TypeError, "'0'"),
    (np.float64(1), TypeError, r"np.float64\(1.0\)"),
    (None, TypeError, "None"),  # NumPy would draw fresh entropy: not deterministic in the seed
    (True, TypeError, "True"),
])
def test_a_seed_is_an_int_of_at_least_zero(call, seed, error, got):
    with pytest.raises(error, match=f"^seed: expected an int >= 0, got {got}$"):
        call(seed)


@pytest.mark.parametrize("call", SEEDED.values(), ids=SEEDED.keys())
def test_a_numpy_int_seed_draws_what_the_int_draws(call):
    def arrays(got) -> list:  # a dict's values, a tuple's items, or the one array
        return list(got.values()) if isinstance(got, dict) else list(got) if isinstance(got, tuple) else [got]
    a, b = arrays(call(np.int64(3))), arrays(call(3))
    assert len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))
    check_seed(np.uint8(0))


# -- sizes that cannot fit ------------------------------------------------------------------------
def test_a_schema_too_deep_for_the_memory_is_refused_from_its_counts(monkeypatch):
    """The count comes from arithmetic on three small schemas (`_totals`), so a 10**9-layer config
    is one line, not a dict that grows until the memory runs out."""
    monkeypatch.setattr(memory, "total_memory", lambda: 2**30)
    with pytest.raises(ValueError, match=r"^config: n_encoder_layers=10000, n_decoder_layers=2 make "
                                         r"160,0\d\d tensors, which need at least 2.4 GiB \(16 KiB a "
                                         r"tensor\), more than this machine's 1.0 GiB$"):
        weight_schema(TINY.replace(n_encoder_layers=10**4))
    assert len(weight_schema(TINY)) == 92
    monkeypatch.undo()
    with pytest.raises(ValueError, match=r"^config: n_encoder_layers=1000000000, .* tensors, which need"):
        weight_schema(TINY.replace(n_encoder_layers=10**9))


@pytest.mark.parametrize("make", [init_weights, random_weights], ids=["init_weights", "random_weights"])
@pytest.mark.parametrize("fields, values", [
    (dict(src_vocab=10**12), "16,000,000,011,761"),  # was NumPy's MemoryError
    (dict(src_vocab=2**62), "[\\d,]+"),  # was "Maximum allowed dimension exceeded" (10**30, now
    # past int64: TransformerConfig refuses it)
    (dict(n_encoder_layers=10**4, n_decoder_layers=10**4), "[\\d,]+"),  # was made, at 1 GiB
])
def test_weights_too_large_for_the_memory_are_refused_before_any_is_drawn(monkeypatch, make, fields,
                                                                            values):
    monkeypatch.setattr(memory, "total_memory", lambda: 2**30)
    with pytest.raises(ValueError, match=rf"^{make.__name__}: config: [\d,]+ tensors of {values} values "
                                         r"need at least [\d.]+ GiB for inference, more than this "
                                         r"machine's 1.0 GiB$"):
        make(TINY.replace(**fields))


def test_a_batch_of_a_huge_vocabulary_lists_none_of_its_ids():
    """The ids are drawn by index, not from a list of the vocabulary (10**9 entries was 10**9
    Python ints)."""
    tracemalloc.start()
    try:
        token_batch(TINY, 10**6, 2, 4)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 100_000, peak
    src, tgt = src_tgt(TINY.replace(src_vocab=10**9, tgt_vocab=10**9))
    assert src.dtype == np.int64 and 0 <= src.min() and src.max() < 10**9 and tgt.max() < 10**9
    ids = token_batch(TINY, 2**63, 3, 5, lengths=[5, 5, 5])
    assert (ids > 2).all()  # the special ids 0, 1, 2 skipped, and no overflow past them
    with pytest.raises(ValueError, match=r"^vocab: expected at most 2\*\*63 \(the ids are int64\), "
                                         r"got 9223372036854775809$"):
        token_batch(TINY, 2**63 + 1, 2, 4)


def test_the_batches_are_the_ones_drawn_before():
    """Drawing ids by index draws what `rng.choice` over the list of ordinary ids drew."""
    rng = np.random.default_rng(7)
    ordinary = np.array([i for i in range(13) if i not in (0, 1, 2)])
    expected = rng.choice(ordinary, size=(3, 6))
    expected[1, 5:] = expected[2, 3:] = 0  # the default lengths: 6, 5, 3
    assert np.array_equal(token_batch(TINY, 13, 3, 6, seed=7), expected)


# -- token_batch's and src_tgt's arguments ----------------------------------------------------------
@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(lengths=[-1, 2]), ValueError, r"lengths: expected one int in \[0, 4\] per row, 2 in all, "
                                        r"got lengths\[0\] = -1$"),  # padded the last position
    (dict(batch=3, lengths=[1]), ValueError, r"lengths: expected one int in \[0, 4\] per row, 3 in "
                                             r"all, got 1$"),  # left rows 1 and 2 unpadded
    (dict(lengths=[3, 3, 3]), ValueError, r"per row, 2 in all, got 3$"),  # an IndexError
    (dict(lengths=[5, 1]), ValueError, r"got lengths\[0\] = 5$"),
    (dict(lengths=[1.5, 1]), TypeError, r"got lengths\[0\] = 1.5$"),
    (dict(lengths="12"), TypeError, r"lengths: expected one int .* got str$"),
    (dict(vocab=0), ValueError, "^vocab: expected an int >= 1, got 0$"),  # "a cannot be empty"
    (dict(vocab=13.5), TypeError, "^vocab: expected an int >= 1, got 13.5$"),
    (dict(batch=-1), ValueError, "^batch: expected an int >= 1, got -1$"),  # "negative dimensions"
    (dict(batch=0), ValueError, "^batch: expected an int >= 1, got 0$"),
    (dict(length=0), ValueError, "^length: expected an int >= 1, got 0$"),
    (dict(length=np.float32(4)), TypeError, r"^length: expected an int >= 1, got np.float32\(4.0\)$"),
    (dict(config=None), TypeError, "^config: expected a TransformerConfig, got NoneType$"),
])
def test_token_batch_refuses_bad_arguments_naming_them(kwargs, error, needle):
    args = dict(config=TINY, vocab=13, batch=2, length=4) | kwargs
    with pytest.raises(error, match=needle):
        token_batch(**args)


def test_token_batch_keeps_the_lengths_it_is_given():
    ids = token_batch(TINY, 13, 3, 4, lengths=np.array([4, 0, 2]))
    assert ((ids != TINY.pad_id).sum(1) == [4, 0, 2]).all()


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(tgt_len=0), ValueError, "^tgt_len: expected an int >= 1, got 0$"),  # was an IndexError
    (dict(src_len=-2), ValueError, "^src_len: expected an int >= 1, got -2$"),
    (dict(batch=2.0), TypeError, r"^batch: expected an int >= 1, got 2.0$"),
    (dict(tgt_lengths=[-1, 0]), ValueError, r"^tgt_lengths: expected one int in \[0, 5\] per row, 2 "
                                            r"in all, got tgt_lengths\[0\] = -1$"),
    (dict(src_lengths=[7]), ValueError, r"^src_lengths: expected one int in \[0, 7\] per row, 2 in "
                                        r"all, got 1$"),
    (dict(config={}), TypeError, "^config: expected a TransformerConfig, got dict$"),
])
def test_src_tgt_refuses_bad_arguments_by_its_own_names(kwargs, error, needle):
    args = dict(config=TINY) | kwargs
    with pytest.raises(error, match=needle):
        src_tgt(**args)


# -- configs --------------------------------------------------------------------------------------
WEIGHTS = random_weights(TINY, 0)
GIVEN_A_CONFIG = {
    "check_weights": lambda c, tmp: check_weights(c, WEIGHTS),
    "save_checkpoint": lambda c, tmp: save_checkpoint(tmp / "ck", c, WEIGHTS),
    "init_weights": lambda c, tmp: init_weights(c),
    "random_weights": lambda c, tmp: random_weights(c),
    "weight_schema": lambda c, tmp: weight_schema(c),
    "parameter_count": lambda c, tmp: parameter_count(c),
    "check_buildable": lambda c, tmp: check_buildable(c, "inference", "--config x"),
    "check_fits": lambda c, tmp: check_fits(c, 10, 100, "f"),
}


@pytest.mark.parametrize("call", GIVEN_A_CONFIG.values(), ids=GIVEN_A_CONFIG.keys())
@pytest.mark.parametrize("config, got", [(None, "NoneType"), (TINY.to_dict(), "dict"), ("tiny", "str")])
def test_a_config_that_is_not_a_transformer_config_is_named(tmp_path, call, config, got):
    with pytest.raises(TypeError, match=f"^config: expected a TransformerConfig, got {got}$"):
        call(config, tmp_path)
    assert not os.listdir(tmp_path)  # nothing written


def test_check_config_names_the_argument_it_is_given():
    check_config(TINY)
    with pytest.raises(TypeError, match="^stored: expected a TransformerConfig, got NoneType$"):
        check_config(None, "stored")


# -- tolerances -----------------------------------------------------------------------------------
def test_assert_close_checks_under_python_O():
    """Under ``python -O`` an `assert` statement is gone: the check must raise by itself."""
    code = ("import numpy as np\n"
            "from shared.tolerances import FLOAT64, assert_close, assert_trace_close\n"
            "for call in (lambda: assert_close(np.ones(2), np.zeros(2), FLOAT64, 'x'),\n"
            "             lambda: assert_close(np.ones(2), np.ones(3), FLOAT64, 'x'),\n"
            "             lambda: assert_close([np.nan], [1.0], FLOAT64, 'x'),\n"
            "             lambda: assert_trace_close({'a': 1}, {'b': 1}, FLOAT64)):\n"
            "    try:\n"
            "        call()\n"
            "    except AssertionError as err:\n"
            "        print(err)\n"
            "    else:\n"
            "        print('passed')\n")
    out = subprocess.run([sys.executable, "-O", "-c", code], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert [line.split(" ")[:3] for line in out] == [["x:", "max", "abs"], ["x:", "shape", "(2,)"],
                                                     ["x:", "contains", "NaN"], ["trace", "names", "differ:"]]


@pytest.mark.parametrize("call", [FLOAT64.allows, max_abs_diff])
def test_two_shapes_are_a_value_error_naming_both(call):
    # was a bare AssertionError (inside `twins compare` too)
    with pytest.raises(ValueError, match=r"^actual: expected shape \(3,\) \(the shape of expected\), "
                                         r"got \(2,\)$"):
        call(np.ones(2), np.ones(3))


@pytest.mark.parametrize("actual, expected, name", [
    (np.array([1 + 5j]), np.array([1.0]), "actual"),  # allowed, with a ComplexWarning only
    (np.array([1.0]), np.array([1 + 0j], np.complex64), "expected"),
])
def test_complex_values_are_refused(actual, expected, name):
    with pytest.raises(TypeError, match=f"^{name}: expected real values, got dtype complex"):
        FLOAT64.allows(actual, expected)


def test_bounds_compare_lists_too():
    assert FLOAT64.allows([1.0, 2.0], [1.0, 2.0]) and not FLOAT64.allows([1.0], [2.0])


def test_an_unknown_bound_lists_the_known_names():
    with pytest.raises(TypeError, match="^dtype: expected a str, got list$"):  # was "unhashable"
        bound_for(["float32"], "torch:tf")
    with pytest.raises(TypeError, match="^pair: expected a str, got NoneType$"):
        bound_for("float32", None)
    with pytest.raises(ValueError) as err:
        bound_for("float32", "x")
    assert str(err.value).startswith("no parity bound for dtype='float32', pair='x' (the float32 pairs "
                                     "are ctranslate2:reference, ")  # not quoted as a KeyError's
    assert " torch:reference, torch:tf, " in str(err.value)
    assert str(err.value).endswith("); measure one and add it to shared/tolerances.py")
    assert isinstance(err.value, KeyError)  # twins.verify looks a pair up both ways round
    with pytest.raises(ValueError, match=r"^no parity bound for dtype='float8', pair='torch:tf' \(the "
                                         r"dtypes with bounds are bfloat16, float16, float32, float64\)"):
        bound_for("float8", "torch:tf")


@pytest.mark.parametrize("seed, error", [(None, TypeError), (1.5, TypeError), (-1, ValueError)])
def test_task_examples_check_their_seed(seed, error):
    """The demo tasks' examples are deterministic in their seed: None drew fresh entropy, and a
    float or a negative seed raised NumPy's own errors."""
    from shared.tasks import copy_examples, make_task
    with pytest.raises(error, match=r"seed: expected an int >= 0 or a list of them, got"):
        copy_examples(2, seed)
    with pytest.raises(error, match=r"seed: expected an int >= 0 or a list of them, got"):
        make_task("copy", 2, [0, seed])
    assert copy_examples(2, np.int64(3)) == copy_examples(2, 3)
    assert copy_examples(2, [0, 1]) == copy_examples(2, [0, 1]) != copy_examples(2, [0, 2])


# -- NumPy numbers in messages --------------------------------------------------------------------
# NumPy 1's repr of a NumPy number is the bare number: "seed: expected an int >= 0, got 1.0" for
# np.float64(1.0), against NumPy 2's "got np.float64(1.0)"; run at the declared floor (numpy 1.26),
# eight message tests failed. `shared.messages.shown` writes NumPy 2's form on either, of strings,
# dates and durations too (NumPy 1: 'pre', numpy.datetime64(...)).
NUMPY_SHOWN = [(np.float64(1.0), "np.float64(1.0)"), (np.float32(-0.5), "np.float32(-0.5)"),
               (np.float32(0.1), "np.float32(0.1)"), (np.float16(0.1), "np.float16(0.1)"),
               (np.float64(np.nan), "np.float64(nan)"), (np.float32(-np.inf), "np.float32(-inf)"),
               (np.float64(-0.0), "np.float64(-0.0)"), (np.float64(1e-7), "np.float64(1e-07)"),
               (np.int64(3), "np.int64(3)"), (np.uint8(7), "np.uint8(7)"), (np.int8(-5), "np.int8(-5)"),
               (np.True_, "np.True_"), (np.False_, "np.False_"),
               (np.complex128(1 + 2j), "np.complex128(1+2j)"), (np.complex64(2j), "np.complex64(2j)"),
               (np.longdouble(1.5), "np.longdouble('1.5')"),
               (np.clongdouble(1 + 1j), "np.clongdouble('1+1j')"),
               (np.str_("pre"), "np.str_('pre')"), (np.str_("it's"), 'np.str_("it\'s")'),
               (np.bytes_(b"x"), "np.bytes_(b'x')"),
               (np.datetime64("2020-01-01"), "np.datetime64('2020-01-01')"),
               (np.timedelta64(3, "s"), "np.timedelta64(3,'s')")]


@pytest.mark.parametrize("value, text", NUMPY_SHOWN, ids=[text for _, text in NUMPY_SHOWN])
def test_a_numpy_number_is_shown_as_numpy_2_writes_it_on_either_numpy(value, text):
    from shared.messages import shown
    assert shown(value) == text
    assert shown(value, str) == str(value)  # a message that formats plainly stays plain
    if int(np.__version__.split(".")[0]) >= 2:  # the table is NumPy 2's own
        assert repr(value) == text
    # And so in a message: an int is a seed, this is not (a duration is no int: is_int)
    if not isinstance(value, np.integer) or isinstance(value, np.timedelta64):
        with pytest.raises(TypeError, match=rf"^seed: expected an int >= 0, got {re.escape(text)}$"):
            check_seed(value)


# -- ints too long to print -----------------------------------------------------------------------
# Python refuses to turn an int of over 4300 digits into text, so a message quoting one raised
# "Exceeds the limit (4300 digits) for integer string conversion" in its place, naming nothing;
# `shared.messages.shown` quotes such an int by its size. Sizes and ids past int64 are refused.
HUGE = 10**5000


def _huge_calls():
    from shared import noam_lr, reference
    from shared.data_parallel import check_workers
    from shared.masks import subsequent_mask
    from shared.positional import positional_encoding
    from shared.schedule import check_start_step
    from shared.tasks import copy_examples
    from shared.threads import check_threads
    model = reference.Model(random_weights(TINY, 0), TINY)
    src = token_batch(TINY, TINY.src_vocab, 1, 3)
    calls = {f"config.{name}": (lambda v, name=name: TINY.replace(**{name: v}), f"TransformerConfig.{name}")
             for name in ("src_vocab", "d_model", "n_heads", "max_len", "pad_id", "head_dim",
                          "decoder_start_id", "pe_offset", "dropout", "norm_eps", "dtype", "norm_first")}
    calls.update({
        "from_dict key": (lambda v: TransformerConfig.from_dict({**TINY.to_dict(), v: 1}),
                          "TransformerConfig.from_dict: unknown fields"),
        "preset": (lambda v: TransformerConfig.preset(v), "TransformerConfig.preset: name"),
        "greedy max_len": (lambda v: reference.greedy_decode(model, src, v), "max_len"),
        "beam_size": (lambda v: reference.beam_search(model, src, 4, v), "beam_size"),
        "length_penalty": (lambda v: reference.beam_search(model, src, 4, 2, v), "length_penalty"),
        "noam step": (lambda v: noam_lr(v, 512, 4000), "noam_lr: step"),
        "noam warmup": (lambda v: noam_lr(1, 512, v), "noam_lr: warmup"),
        "noam factor": (lambda v: noam_lr(1, 512, 4000, v), "noam_lr: factor"),
        "start_step": (lambda v: check_start_step(v), "start_step"),
        "token_batch batch": (lambda v: token_batch(TINY, 13, v, 3), "batch"),
        "token_batch lengths": (lambda v: token_batch(TINY, 13, 2, 3, lengths=[v, 1]), "lengths"),
        "src_tgt tgt_len": (lambda v: src_tgt(TINY, 2, 3, v), "tgt_len"),
        "seed": (lambda v: random_weights(TINY, -abs(v)), "seed"),  # a huge one is a seed
        "subsequent_mask": (lambda v: subsequent_mask(v), "subsequent_mask: size"),
        "positional max_len": (lambda v: positional_encoding(v, 4), "positional_encoding: max_len"),
        "positional offset": (lambda v: positional_encoding(4, 4, offset=v), "positional_encoding: offset"),
        "copy n": (lambda v: copy_examples(v, 0), "n"),
        "copy length": (lambda v: copy_examples(2, 0, v), "length"),
        "threads": (lambda v: check_threads(v), "--threads"),
        "workers": (lambda v: check_workers(8, v), "--workers"),
        "batch of workers": (lambda v: check_workers(v, 3), "--workers 3"),
    })
    return calls


@pytest.mark.parametrize("sign", [1, -1], ids=["huge", "negative"])
@pytest.mark.parametrize("name", list(_huge_calls()))
def test_an_int_too_long_to_print_is_named_by_its_size(name, sign):
    call, names = _huge_calls()[name]
    with pytest.raises((ValueError, TypeError)) as caught:
        call(sign * HUGE)
    message = str(caught.value)
    assert message.startswith(names) and "int of about 5,001 digits" in message, message


@pytest.mark.parametrize("name", list(_huge_calls()))
def test_a_numpy_duration_is_no_int(name):
    """NumPy counts a ``timedelta64`` an integer (``numbers.Integral``, ``np.integer``): taken for
    one, it failed in ``int()``'s or a ufunc's words ("int() argument must be a string, a
    bytes-like object or a real number, not 'datetime.timedelta'"), naming nothing. Found by the
    fuzzer once its rule asked that every refusal name its argument."""
    call, names = _huge_calls()[name]
    names = {"batch of workers": "batch"}.get(name, names)  # a huge batch is divided; this is no int
    with pytest.raises((ValueError, TypeError)) as caught:
        call(np.timedelta64(3, "s"))
    assert str(caught.value).startswith(names), str(caught.value)


def test_a_batch_larger_than_the_memory_is_refused_by_name(monkeypatch):
    """A (batch, length) array or a list of examples past the machine's memory: NumPy said "Maximum
    allowed dimension exceeded" or ran out of memory."""
    from shared.tasks import copy_examples
    monkeypatch.setattr(memory, "total_memory", lambda: 2**30)
    for call, message in [
            (lambda: token_batch(TINY, 13, 10**5, 10**4),
             "batch, length: a (100000, 10000) array of int64 ids needs 7.5 GiB, more than this "
             "machine's 1.0 GiB"),
            (lambda: src_tgt(TINY, 10**5, 3, 10**4), "batch, tgt_len: a (100000, 10000) array"),
            (lambda: copy_examples(10**8, 0),
             "n: 100000000 examples need at least 15.6 GiB as Python objects"),
            (lambda: copy_examples(10**5, 0, 10**4),
             "n, length: 100000 examples of 10000 symbols need at least 14.9 GiB")]:
        with pytest.raises(ValueError) as caught:
            call()
        assert str(caught.value).startswith(message), str(caught.value)


LOG_PROBS = np.log(np.full((1, 2, 4), 0.25))


@pytest.mark.parametrize("tokens_a, tokens_b, log_probs, error, message", [
    ([[1, 2]], [[1, -1]], LOG_PROBS, ValueError, "tokens_b: expected token ids in [0, 4), got values in [-1, 1]"),
    ([[1, 2]], [[1, 4]], LOG_PROBS, ValueError, "tokens_b: expected token ids in [0, 4), got values in [1, 4]"),
    ([[1.0, 2.0]], [[1, 3]], None, TypeError, "tokens_a: expected integer token ids, got dtype float64"),
    ([[1, [2]]], [[1, 2]], None, TypeError, "tokens_a: expected a tensor or array, got list"),
    ([1, 2], [1, 3], None, ValueError, "tokens_a: expected token ids of shape (batch, steps), got shape (2,)"),
    ([[1, 2]], [[1, 2, 3]], None, ValueError, "tokens_b: expected the shape of tokens_a, (1, 2), got (1, 3)"),
    ([[1, 2]], [[1, 3]], LOG_PROBS[0], ValueError,
     "log_probs: expected float step log-probs of shape (1, 2, vocab) along tokens_a, got shape (2, 4) dtype float64"),
    ([[1, 2]], [[1, 3]], np.zeros((1, 2, 4), np.int64), ValueError,
     "log_probs: expected float step log-probs of shape (1, 2, vocab) along tokens_a, got shape (1, 2, 4) "
     "dtype int64")])
def test_first_divergence_refuses_what_would_give_a_wrong_report(tokens_a, tokens_b, log_probs, error, message):
    """`shared.divergence.first_divergence` read a token of -1 (a SavedModel's refused row) as the
    last id's log-prob, truncated float tokens to ids, and failed in NumPy's words on an id past
    the vocabulary or log-probs of another shape."""
    from shared.divergence import Divergence, first_divergence
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        first_divergence(tokens_a, tokens_b, log_probs)
    assert first_divergence([[1, 2]], [[1, 3]], LOG_PROBS) == [Divergence(0, 1, 2, 3, 0.0)]
    assert first_divergence([[1, 2]], [[1, 2]], LOG_PROBS) == []
