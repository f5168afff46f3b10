"""Hostile inputs to `TransformerConfig` and `noam_lr`: each is refused with the project's own
message naming the argument (docs/design.md, section 4: "what was expected and what was got"),
never accepted as a broken config nor left to a Python or NumPy error from deep inside."""
import numpy as np
import pytest

from shared import TransformerConfig, noam_lr, positional_table

SMALL = dict(src_vocab=11, tgt_vocab=11, d_model=8, n_heads=2, max_len=16)


def test_pe_offset_past_float64_exact_integers_is_refused():
    # Positions are float64: past 2**53 neighbours round to one value and every row is the same.
    last = 2**53 - 16 + 1  # the largest offset whose last position, 2**53, is still exact
    table = positional_table(TransformerConfig(**SMALL, pe_offset=last))
    assert np.unique(table, axis=0).shape[0] == 16
    for offset in (last + 1, 2**53):
        with pytest.raises(ValueError, match=r"TransformerConfig\.pe_offset: expected an int "
                                             rf"<= 2\*\*53 - max_len \+ 1 = {last} .*got {offset}"):
            TransformerConfig(**SMALL, pe_offset=offset)
    base = TransformerConfig(**SMALL)
    with pytest.raises(ValueError, match="pe_offset"):
        base.replace(pe_offset=2**53)
    with pytest.raises(ValueError, match="pe_offset"):
        TransformerConfig.from_dict({**base.to_dict(), "pe_offset": 2**53})


def test_replace_keeps_an_explicit_final_norm_when_the_placement_stays():
    post = TransformerConfig.preset("tiny", norm_first=False, final_norm=True)
    assert post.replace(norm_first=False).final_norm is True
    assert post.replace(dropout=0.0).final_norm is True
    # A new placement still re-derives it, unless given (test_config.py, documented behaviour).
    assert post.replace(norm_first=True).final_norm is True
    assert post.replace(norm_first=True, final_norm=False).final_norm is False
    assert TransformerConfig.preset("tiny").replace(norm_first=False).final_norm is False


@pytest.mark.parametrize("dtype", [np.dtype("float32"), np.float32, b"float32"])
def test_dtype_must_be_a_name(dtype):
    # np.dtype("float32") == "float32", yet it hashes otherwise and JSON cannot write it.
    with pytest.raises(ValueError, match=r"TransformerConfig\.dtype: expected one of "
                                         r"\('float32', 'float64'\), got"):
        TransformerConfig.preset("tiny", dtype=dtype)


@pytest.mark.parametrize("value, message", [
    pytest.param(10**400, r"TransformerConfig\.norm_eps: expected a value float32 holds.*got an int of "
                          r"about 401 digits", id="10**400"),
    (float("inf"), r"TransformerConfig\.norm_eps: expected a positive finite float, got inf"),
    (float("nan"), r"TransformerConfig\.norm_eps: expected a positive finite float, got nan"),
])
def test_norm_eps_out_of_float_range_is_refused_by_name(value, message):
    with pytest.raises(ValueError, match=message):
        TransformerConfig.preset("tiny", norm_eps=value)


def test_dropout_out_of_float_range_is_refused_by_name():
    with pytest.raises(ValueError, match=r"TransformerConfig\.dropout: expected a value in \[0, 1\)"):
        TransformerConfig.preset("tiny", dropout=10**400)


@pytest.mark.parametrize("factor", [pytest.param(10**400, id="10**400"), float("inf"), float("nan")])
def test_noam_factor_out_of_float_range_is_refused_by_name(factor):
    with pytest.raises(ValueError, match=r"noam_lr: factor expected a positive float \(at most "
                                         r"1\.798e\+308"):
        noam_lr(1, 512, 4000, factor)


@pytest.mark.parametrize("step", [pytest.param(10**30, id="10**30"), 2**53 + 1, 2**63,
                                  np.array([1, 2**53 + 1])])
def test_noam_step_past_float64_exact_integers_names_the_bound(step):
    with pytest.raises(ValueError, match=r"noam_lr: step expected an int in \[1, 2\*\*53\]"):
        noam_lr(step, 512, 4000)


def test_noam_step_at_the_bound():
    assert noam_lr(2**53, 512, 4000) == pytest.approx(512 ** -0.5 * 2 ** -26.5)


def test_from_dict_reports_keys_of_any_type_as_unknown_fields():
    base = TransformerConfig.preset("tiny").to_dict()
    with pytest.raises(ValueError, match=r"from_dict: unknown fields \['z', 1, None\] \(written by"):
        TransformerConfig.from_dict({**base, 1: 1, "z": 2, None: 3})


@pytest.mark.parametrize("name", [["tiny"], None, 3])
def test_preset_name_of_another_type(name):
    with pytest.raises(ValueError, match=r"TransformerConfig\.preset: name expected one of "
                                         r"\['base', 'big', 'small', 'tiny'\], got"):
        TransformerConfig.preset(name)


@pytest.mark.parametrize("call, where", [
    (lambda: TransformerConfig.preset("tiny").replace(foo=1, norm_first=False), "replace"),
    (lambda: TransformerConfig.preset("tiny", foo=1), "preset"),
])
def test_unknown_keywords_are_unknown_fields(call, where):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.{where}: unknown fields \['foo'\] "
                                         r"\(written by a newer version\? this version does not know"):
        call()


@pytest.mark.parametrize("text, got", [(None, "NoneType"), ({"src_vocab": 3}, "dict"), (3, "int")])
def test_from_json_of_no_text(text, got):
    with pytest.raises(ValueError, match=rf"TransformerConfig\.from_json: expected a str or bytes "
                                         rf"of JSON, got {got}"):
        TransformerConfig.from_json(text)


def test_from_json_still_reads_bytes():
    config = TransformerConfig.preset("tiny")
    assert TransformerConfig.from_json(config.to_json().encode()) == config


def test_numpy_numbers_are_taken_as_the_python_numbers_they_hold():
    """Before: ``d_model=np.int64(16)`` (a size read from an array's shape) was refused as "expected
    an int", while ``np.float64`` passed and stayed a NumPy value; every other argument of the API
    (steps, seeds, beams) takes NumPy ints. Now both are stored as Python numbers, so the config
    equals, hashes and writes its JSON as one made of them; a NumPy bool, an array or a float
    where an int belongs is still refused."""
    config = TransformerConfig.preset("tiny", d_model=np.int64(16), n_heads=np.int32(4),
                                      dropout=np.float64(0.25), norm_eps=np.float32(0.5))
    plain = TransformerConfig.preset("tiny", d_model=16, n_heads=4, dropout=0.25, norm_eps=0.5)
    assert config == plain and hash(config) == hash(plain) and config.to_json() == plain.to_json()
    assert type(config.d_model) is int and type(config.dropout) is float and type(config.norm_eps) is float
    for bad, shown in [(np.bool_(True), "np.True_"), (np.array([4]), r"array\(\[4\]\)"), (np.float64(4.0), "4.0")]:
        with pytest.raises(ValueError, match=rf"^TransformerConfig.n_heads: expected an int, got {shown}$"):
            TransformerConfig.preset("tiny", n_heads=bad)


def test_numpy_bools_are_taken_as_the_python_bools_they_hold():
    """Before: ``norm_first=np.bool_(False)`` (a flag read from an array) was refused as "expected
    a bool", though every flag of the API (``return_trace``, ``allow_nonfinite``, the decoders')
    takes a NumPy bool. Now it is stored as a Python bool; a NumPy int where a bool belongs is
    still refused."""
    flags = dict(norm_first=np.bool_(False), final_norm=np.bool_(True), share_embeddings=np.bool_(True),
                 tie_output=np.bool_(True), embed_scale=np.bool_(False), mask_padding=np.bool_(False))
    config = TransformerConfig.preset("tiny", src_vocab=17, **flags)
    plain = TransformerConfig.preset("tiny", src_vocab=17, **{k: bool(v) for k, v in flags.items()})
    assert config == plain and hash(config) == hash(plain) and config.to_json() == plain.to_json()
    assert all(type(getattr(config, name)) is bool for name in flags)
    assert type(TransformerConfig.preset("tiny", norm_first=np.bool_(False)).final_norm) is bool
    with pytest.raises(ValueError, match=r"^TransformerConfig.embed_scale: expected a bool, got np\.int64\(1\)$"):
        TransformerConfig.preset("tiny", embed_scale=np.int64(1))
