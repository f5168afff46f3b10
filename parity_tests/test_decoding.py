"""The decoding contract of torch_impl and tf_impl, written once and run by every backend where it
applies (`parity_tests.decoding_backends`: ``torch``, ``torch-cuda`` where present, ``tf-eager``,
``tf-function``, ``tf-xla``): the key/value cache against full recomputation, parity with the
float64 oracle (greedy and beam, cached and recompute), float32 tokens with near-ties reported,
TF vs torch, all-padding sources, masks and bad input. Behaviour one framework alone has is in
test_decoding_torch_only.py and test_decoding_tf_only.py, except TF's modes against each other,
which compare the very loops the contract cases compile and so run here, beside them (see that
section); the search loops alone, on fixed tables, in test_decoding_stub.py.

A test takes the ``model_backend`` fixture when it holds for every backend; where a check was
measured on chosen cases per backend (a TF trace costs about a second, XLA several), its cases are
listed per backend. TF models are built once per (variant, dtype) and decodes are memoised
(`decoding_cases.greedy`, `.beams`), so each compiled loop is traced once."""
import re

import numpy as np
import pytest

from parity_tests.decoding_backends import MODEL_BACKENDS, ModelBackend, model_backend  # noqa: F401
from parity_tests.decoding_cases import (ALPHAS, BEAM, MAX_LEN, beams, config64, greedy, model_for,
                                         reference_decodes, sources, targets, tiny_configs, weights_for)
from shared import masks as shared_masks
from shared import reference as R
from shared.divergence import first_divergence
from shared.loss import log_softmax
from shared.tolerances import assert_close, bound_for
from shared.weights import random_weights

TINY = tiny_configs()
# Norm placement and style, final norm, shared and tied embeddings: every decode-step code path.
DECODE_VARIANTS = ["tiny-pre-annotated", "tiny-post-standard", "tiny-shared-tied-post",
                   "tiny-post-final-norm"]
MARGIN = bound_for("float32", "decode-margin").rtol  # absolute log-prob margin
TORCH_BACKENDS = [name for name in MODEL_BACKENDS if name.startswith("torch")]


def backend_params(cases: dict[str, list[tuple]]) -> list:
    """``{backend: [case, ...]}`` as ``(backend, *case)`` params, backends not present dropped."""
    return [pytest.param(name, *case, id=f"{name}-" + "-".join(map(str, case)))
            for name, rows in cases.items() if name in MODEL_BACKENDS for case in rows]


def bound(backend: ModelBackend, dtype: str):
    return bound_for(dtype, f"{backend.framework}:reference")


def assert_same_greedy(got, want, tol, where: str) -> None:
    """Identical tokens and lengths; log-probs within ``tol``."""
    np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=f"greedy {where}")
    np.testing.assert_array_equal(got.lengths, want.lengths, err_msg=f"greedy {where}")
    assert_close(got.log_probs, want.log_probs, tol, f"greedy log_probs {where}")


def assert_same_beams(got_beams, want_beams, tol, where: str) -> None:
    """Identical tokens and lengths of every beam; scores within ``tol``."""
    for alpha, want in want_beams.items():
        got = got_beams[alpha]
        for field in ("tokens", "lengths", "all_tokens", "all_lengths"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field),
                                          err_msg=f"beam alpha={alpha} {field} {where}")
        for field in ("scores", "step_scores", "all_scores"):
            assert_close(getattr(got, field), getattr(want, field), tol,
                         f"beam alpha={alpha} {field} {where}")


# -- the cache: token by token equals one full pass (keras-hub's test_cache_call_is_correct) -------
CACHE_VARIANTS = ["tiny-pre-annotated", "tiny-post-standard", "tiny-tied", "tiny-shared-tied-post",
                  "tiny-post-final-norm"]
CACHE_BACKENDS = TORCH_BACKENDS + ["tf-eager"]  # decode_step is called eagerly


def self_attn_inputs(model, trace, i):
    """What decoder layer ``i``'s self-attention read in the full pass: the normalised stream in
    pre-norm, the stream itself in post-norm."""
    if model.config.norm_first:
        return trace[f"decoder.layers.{i}.self_attn_norm"]
    return trace["decoder.embed"] if i == 0 else trace[f"decoder.layers.{i - 1}.ffn.residual"]


@pytest.mark.parametrize("model_backend", CACHE_BACKENDS, indirect=True)
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("variant", CACHE_VARIANTS)
def test_cache_step_by_step_equals_one_full_pass(model_backend, variant, dtype):
    be = model_backend
    config = TINY[variant].replace(dtype=dtype)
    model = be.build(config, random_weights(config, 3))
    tol = bound(be, dtype)
    src = be.tensor(sources(config, 3, lengths=(7, 3, 0)))  # batch 3, padded, one all-padding row
    t_len = 9
    tgt = be.tensor(targets(config, 3, t_len, 4))
    with be.no_grad():
        full = be.numpy(model(src, tgt))  # (B, T, V), the fast attention path
        _, trace = model(src, tgt, return_trace=True)
        memory = model.encode(src)
        cache = model.init_cache(memory, be.make_src_mask(src, config.pad_id), max_len=t_len)
        for t in range(t_len):
            logits, cache = model.decode_step(tgt[:, t], cache)
            assert_close(be.numpy(logits), full[:, t], tol, f"logits at step {t}")
        assert int(cache.length) == t_len and cache.capacity == t_len
        for i, (layer, kept) in enumerate(zip(model.decoder.layers, cache.layers)):
            k, v = layer.self_attn.keys_values(self_attn_inputs(model, trace, i))
            assert_close(be.numpy(kept.self_key), be.numpy(k), tol, f"layer {i} self keys")
            assert_close(be.numpy(kept.self_value), be.numpy(v), tol, f"layer {i} self values")
            # the cache's source keys come from one stacked product (StepWeights' cross_kv): the
            # modules' two give them to rounding
            ck, cv = layer.cross_attn.keys_values(memory)
            assert_close(be.numpy(kept.cross_key), be.numpy(ck), tol, f"layer {i} cross keys")
            assert_close(be.numpy(kept.cross_value), be.numpy(cv), tol, f"layer {i} cross values")
        with pytest.raises(ValueError, match=r"cache: expected a free position, got a full cache"):
            model.decode_step(tgt[:, 0], cache)


@pytest.mark.parametrize("rows", [[2, 0, 0, 4, 5, 3], [1, 0, 2, 3, 3, 5], [0, 1, 2, 3, 4, 5]],
                         ids=["every-row", "half-with-a-swap", "none"])
@pytest.mark.parametrize("model_backend", CACHE_BACKENDS, indirect=True)
def test_reordered_cache_equals_full_pass_on_the_reordered_sequences(model_backend, rows):
    """Beam reordering: after ``cache = cache.reorder_beams(rows)``, row n continues row rows[n]'s
    prefix; whether every row changes, half of them (torch_impl's CPU copies only those, and two
    rows swap), or none."""
    be = model_backend
    config = config64("tiny-post-standard")
    model = be.build(config, random_weights(config, 5))
    items, beam_count, split, t_len = 2, 3, 4, 8
    src = sources(config, 5, lengths=(7, 2))
    tgt = targets(config, items * beam_count, t_len, 6)  # (N, T), rows item * beams + beam
    rows = np.array(rows)  # within each item
    spliced = np.concatenate([tgt[rows, :split], tgt[:, split:]], axis=1)  # what the rows hold after
    with be.no_grad():
        before, after = (be.numpy(model(be.tensor(np.repeat(src, beam_count, axis=0)), be.tensor(x)))
                         for x in (tgt, spliced))
        cache = model.init_cache(model.encode(be.tensor(src)),
                                 be.make_src_mask(src, config.pad_id), t_len, beam_count)
        for t in range(t_len):
            if t == split:
                cache = cache.reorder_beams(be.tensor(rows))
            seq, want = (tgt, before) if t < split else (spliced, after)
            logits, cache = model.decode_step(be.tensor(seq[:, t]), cache)
            assert_close(be.numpy(logits), want[:, t], bound(be, "float64"), f"step {t}")


@pytest.mark.parametrize("model_backend", CACHE_BACKENDS, indirect=True)
def test_decode_step_checks_its_arguments(model_backend):
    be = model_backend
    config = TINY["tiny-pre-annotated"]
    model = be.build(config, random_weights(config, 0))
    src = be.tensor(sources(config, 0))
    mask = be.make_src_mask(src, config.pad_id)
    cache = model.init_cache(model.encode(src), mask, 4)
    with pytest.raises(ValueError, match=r"tokens: expected a tensor of shape \(5,\)"):
        model.decode_step(be.tensor(np.ones(4, np.int64)), cache)
    with pytest.raises(TypeError, match=r"tokens: expected integer token ids, got dtype float32"):
        model.decode_step(be.tensor(np.ones(5, np.float32)), cache)
    with pytest.raises(ValueError, match=r"tokens: expected token ids in \[0, 17\)"):
        model.decode_step(be.tensor(np.full(5, 17)), cache)
    with pytest.raises(ValueError, match=r"got values in \[9223372036854775813, 9223372036854775813\]$"):
        model.decode_step(be.tensor(np.full(5, 2**63 + 5, np.uint64)), cache)  # not wrapped negative
    with pytest.raises(TypeError, match=rf"cache: expected a {be.framework}_impl.cache.DecoderCache"):
        model.decode_step(be.tensor(np.ones(5, np.int64)), {})
    with pytest.raises(ValueError, match=r"max_len: expected at most config.max_len=64"):
        model.init_cache(model.encode(src), mask, 65)
    with pytest.raises(ValueError, match=r"beams: expected an int >= 1, got 0"):
        model.init_cache(model.encode(src), mask, 4, beams=0)
    # a beam has tgt_vocab - 1 children: refused before a cache of 10**9 rows is allocated
    with pytest.raises(ValueError, match=r"beams: expected at most tgt_vocab - 1 = 16 .*got 1000000000"):
        model.init_cache(model.encode(src), mask, 4, beams=10**9)
    assert model.init_cache(model.encode(src), mask, 4, beams=np.int64(16)).rows == 16 * 5
    # memory of no rows or no positions: before, a cache that failed at its first step in torch's
    # words (aminmax over an empty dimension) and gave (0, V) logits in tf_impl
    d = config.d_model
    for shape in [(0, 7, d), (5, 0, d)]:
        empty = be.tensor(np.zeros(shape, np.float32))
        with pytest.raises(ValueError, match=re.escape(f"memory: expected a non-empty (batch, src_len, {d}), "
                                                       f"got shape {shape}")):
            model.init_cache(empty, be.tensor(np.ones((shape[0], 1, 1, shape[1]), bool)), 4)
    with pytest.raises(ValueError, match=re.escape(f"memory: expected a tensor of shape (batch, src_len, {d}), "
                                                   f"got (7, {d})")):
        model.init_cache(model.encode(src)[0], mask, 4)
    with pytest.raises(TypeError, match=r"^tokens: expected a .*got NoneType"):
        model.decode_step(None, cache)
    if be.framework == "torch":  # torch takes tensors (tf_impl arrays too): named as not one
        with pytest.raises(TypeError, match=r"^tokens: expected a torch tensor of token ids, got ndarray$"):
            model.decode_step(np.ones(5, np.int64), cache)
        with pytest.raises(TypeError, match=r"^memory: expected a torch tensor \(from encode\), got ndarray$"):
            model.init_cache(np.zeros((5, 7, d), np.float32), mask, 4)


@pytest.mark.parametrize("model_backend", CACHE_BACKENDS, indirect=True)
def test_a_cache_of_another_models_shape_is_refused_naming_what_differs(model_backend):
    """A cache made by a model of another vocabulary or depth used to decode silently (logits of
    its vocabulary); of other heads, width, dtype or a longer table it failed inside the framework.
    Each is now one ValueError naming ``cache``, the same in both backends."""
    be = model_backend
    config = TINY["tiny-pre-annotated"]
    model = be.build(config, random_weights(config, 0))
    src = sources(config, 0)
    expected = (r"cache: expected one of this model's init_cache \(2 layers of 4 heads of 4, float32, "
                r"at most max_len=64 positions, tgt_vocab=17\), got ")
    for change, got in [({"tgt_vocab": 30}, "tgt_vocab=30"), ({"n_decoder_layers": 1}, "1 layer"),
                        ({"n_heads": 2}, r"2 heads of 8 \(cross-attention 2 of 8\)"),
                        ({"max_len": 80}, "70 positions"), ({"dtype": "float64"}, "float64")]:
        other = be.build(config.replace(**change), random_weights(config.replace(**change), 0))
        cache = other.init_cache(other.encode(be.tensor(src)), be.make_src_mask(src, config.pad_id),
                                 70 if "max_len" in change else 4)
        with pytest.raises(ValueError, match=expected + got + "$"):
            model.decode_step(be.tensor(np.ones(cache.rows, np.int64)), cache)
    cache = model.init_cache(model.encode(be.tensor(src)), be.make_src_mask(src, config.pad_id), 4)
    assert tuple(model.decode_step(be.tensor(np.ones(cache.rows, np.int64)), cache)[0].shape) == (5, 17)


@pytest.mark.parametrize("model_backend", CACHE_BACKENDS, indirect=True)
def test_reorder_beams_checks_its_rows(model_backend):
    """``cache.reorder_beams(rows)``: one integer row per cache row, each from its own item (the
    cache keeps the source's keys once per item); the same messages in both backends, and a
    refused reorder leaves the cache as it was."""
    be = model_backend
    config = config64("tiny-post-standard")
    model = be.build(config, random_weights(config, 5))
    src = sources(config, 5, lengths=(7, 2))  # 2 items, 3 beams each: 6 rows
    cache = model.init_cache(model.encode(be.tensor(src)), be.make_src_mask(src, config.pad_id), 4, 3)
    logits, cache = model.decode_step(be.tensor(np.full(6, 3, np.int64)), cache)
    before = [be.numpy(layer.self_key) for layer in cache.layers]
    with pytest.raises(ValueError, match=r"rows: expected a tensor of shape \(6,\) \(one source row per "
                                         r"cache row\), got \(5,\)"):
        cache.reorder_beams(be.tensor(np.arange(5)))
    with pytest.raises(TypeError, match=r"rows: expected integer row indices, got dtype float32"):
        cache.reorder_beams(be.tensor(np.arange(6, dtype=np.float32)))
    item = (r"rows: expected each row's source among its own item's beams \(rows 3 to 5 for row 4, "
            r"3 beams an item\)")
    with pytest.raises(ValueError, match=item + r", got rows\[4\] = 1"):
        cache.reorder_beams(be.tensor(np.array([0, 1, 2, 3, 1, 5])))
    with pytest.raises(ValueError, match=r"rows: .*for row 0, 3 beams an item\), got rows\[0\] = -1"):
        cache.reorder_beams(be.tensor(np.array([-1, 1, 2, 3, 4, 5])))
    for layer, key in zip(cache.layers, before):
        np.testing.assert_array_equal(be.numpy(layer.self_key), key)
    # any integer dtype (TF's gather took no int8, uint16, ...): the same reorder as int64 rows
    rows = np.array([2, 0, 1, 3, 5, 4])
    want = [be.numpy(layer.self_key)[rows] for layer in cache.layers]
    cache.reorder_beams(be.tensor(rows.astype(np.uint8)))
    for layer, key in zip(cache.layers, want):
        np.testing.assert_array_equal(be.numpy(layer.self_key)[:, :, :1], key[:, :, :1])
    cache = cache.reorder_beams(be.tensor(np.array([2, 2, 0, 3, 3, 3], np.int32)))  # any integer dtype
    for layer, key in zip(cache.layers, before):
        np.testing.assert_array_equal(be.numpy(layer.self_key)[:, :, :1], key[[2, 2, 0, 3, 3, 3], :, :1])


# -- parity with the float64 oracle ---------------------------------------------------------------
# torch: every tiny variant, cached and recompute. TF: every decode variant compiled (tf.function)
# with the cache; recompute, eager and XLA on some, so that each trace is paid once (the expensive
# part) and every mode meets the oracle. XLA recompute (all max_len positions every step, see
# tf_impl.decoding) is the same step for greedy and beam: greedy only.
TORCH_PARITY = [(name, seed, use_cache, True) for name in sorted(TINY) for seed in range(3)
                for use_cache in (True, False)]
PARITY = {
    "torch": TORCH_PARITY, "torch-cuda": TORCH_PARITY,
    "tf-function": ([(name, seed, True, True) for name in DECODE_VARIANTS for seed in range(3)]
                    + [(name, seed, False, True) for name in ("tiny-pre-annotated", "tiny-shared-tied-post")
                       for seed in range(3)]),
    "tf-eager": [("tiny-post-final-norm", 0, use_cache, True) for use_cache in (True, False)],
    "tf-xla": [("tiny-post-standard", seed, use_cache, use_cache) for seed in range(2)
               for use_cache in (True, False)],
}


@pytest.mark.parametrize("backend, name, seed, use_cache, with_beams", backend_params(PARITY))
def test_float64_parity_with_the_reference(backend, name, seed, use_cache, with_beams):
    """Identical tokens and lengths; per-step and final scores within the float64 bound (1e-12 of
    the scale, tighter than the issue's 1e-10), greedy and beam (alpha 0 and 0.6, every beam)."""
    be = ModelBackend(backend)
    tol, where = bound(be, "float64"), f"{name} seed {seed} use_cache={use_cache} {backend}"
    want_greedy, want_beams = reference_decodes(name, seed)
    assert_same_greedy(greedy(backend, name, "float64", seed, use_cache), want_greedy, tol, where)
    if with_beams:
        assert_same_beams(beams(backend, name, "float64", seed, use_cache), want_beams, tol, where)


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_parity_cases_cover_early_eos_and_max_len(framework):
    """Each framework's parity cases (all its modes together) exercise both ends: rows that stop
    early and rows that run out."""
    cases = [case for name, rows in PARITY.items() if name.startswith(framework) for case in rows]
    lengths = np.concatenate([reference_decodes(name, seed)[0].lengths for name, seed, *_ in cases])
    assert (lengths < MAX_LEN).sum() >= 10 and (lengths == MAX_LEN).sum() >= 5, lengths


# -- float32: identical tokens unless a near-tie explains the difference --------------------------
def teacher_forced_log_probs(w, config, src, tokens) -> np.ndarray:
    """The oracle's step log-probs (B, T, V) along ``tokens``, pad impossible (as the search sees it)."""
    tgt = np.concatenate([np.full((len(src), 1), config.bos_id), tokens[:, :-1]], axis=1)
    lp = log_softmax(R.forward(w, config, src, tgt))
    lp[..., config.pad_id] = -np.inf
    return lp


def unexplained(divergences) -> list:
    """Divergences whose two tokens were further apart (in float64) than float32 can move them."""
    return [d for d in divergences if not d.margin <= MARGIN]


def report(divergences) -> str:
    return "; ".join(str(d) for d in divergences) + f" (near-tie bound {MARGIN:g})"


def float32_divergences(name: str, seed: int, want, got) -> list:
    """Where float32 ``got`` parts from ``want`` (the oracle or torch), with the oracle's margins."""
    c64 = config64(name)
    src = sources(c64, seed)
    lp64 = teacher_forced_log_probs(weights_for(c64, seed), c64, src, want.tokens)
    return first_divergence(want.tokens, got.tokens, lp64)


TORCH_FLOAT32 = [(name, seed, use_cache) for name in sorted(TINY) for seed in range(3)
                 for use_cache in (True, False)]
FLOAT32 = {"torch": TORCH_FLOAT32, "torch-cuda": TORCH_FLOAT32,
           "tf-function": [(name, seed, True) for name in DECODE_VARIANTS for seed in range(2)],
           "tf-eager": [("tiny-pre-annotated", 1, True)], "tf-xla": [("tiny-pre-annotated", 1, True)]}


@pytest.mark.parametrize("backend, name, seed, use_cache", backend_params(FLOAT32))
def test_float32_greedy_tokens_equal_unless_a_near_tie(backend, name, seed, use_cache):
    want = reference_decodes(name, seed)[0]
    got = greedy(backend, name, "float32", seed, use_cache)
    divergences = float32_divergences(name, seed, want, got)
    assert not unexplained(divergences), (f"float32 vs float64, {backend} use_cache={use_cache}: "
                                          + report(divergences))
    same = ~np.isin(np.arange(len(want.tokens)), [d.item for d in divergences])  # rows that agree
    assert_close(got.log_probs[same], want.log_probs[same], bound(ModelBackend(backend), "float32"),
                 "float32 greedy log_probs")


@pytest.mark.parametrize("model_backend", TORCH_BACKENDS + ["tf-function"], indirect=True)
def test_float32_near_tie_is_reported_not_failed(model_backend):
    """Two generator columns made identical, their biases 1e-8 apart: float64 prefers the higher id,
    float32 rounds the biases equal and the tie goes to the lower id. The parting is reported with
    its step, tokens and margin, and recognised as a near-tie."""
    c64 = config64("tiny-pre-annotated")
    w64 = weights_for(c64, 0)
    lo, hi = 5, 9
    w64["generator.kernel"][:, hi] = w64["generator.kernel"][:, lo]
    w64["generator.bias"][lo], w64["generator.bias"][hi] = 4.0, 4.0 + 1e-8  # both on top, 1e-8 apart
    src = sources(c64, 0)
    want = R.greedy_decode(R.Model(w64, c64), src, MAX_LEN)
    model = model_backend.build(c64.replace(dtype="float32"), w64)  # cast to float32 by build
    got = model_backend.greedy_decode(model, src, MAX_LEN)
    divergences = first_divergence(want.tokens, got.tokens,
                                     teacher_forced_log_probs(w64, c64, src, want.tokens))
    assert [(d.item, d.step, d.token_a, d.token_b) for d in divergences] == [
        (item, 0, hi, lo) for item in range(5)]
    assert all(abs(d.margin - 1e-8) < 1e-12 for d in divergences) and not unexplained(divergences)
    assert str(divergences[0]).startswith(f"item 0: first differs at step 0: token {hi} vs {lo}, "
                                          "margin 1e-08")


TORCH_GAPS = [(name,) for name in sorted(TINY)]
GAPS = {"torch": TORCH_GAPS, "torch-cuda": TORCH_GAPS,
        "tf-function": [("tiny-pre-annotated",), ("tiny-post-standard",)]}


@pytest.mark.parametrize("alpha", ALPHAS)
@pytest.mark.parametrize("backend, name", backend_params(GAPS))
def test_float32_beam_tokens_equal_where_every_gap_exceeds_the_bound(backend, name, alpha):
    """Margins come from a float64 run of the same backend, eager (equal to the oracle, above),
    observed at each step: the gaps between consecutive candidates among the 2K drawn (an item
    that has stopped decides nothing more: NaN). Raw scores sum t + 1 step log-probs, so at step
    t the bound is MARGIN * (t + 1). Items above it must give identical beams."""
    seed = 0
    be = ModelBackend(backend)
    src = sources(config64(name), seed)
    gaps = np.full((len(src), MAX_LEN), np.inf)

    def observe(t, top):  # (B, 2K) sorted descending
        top = be.numpy(top)
        with np.errstate(invalid="ignore"):
            diff = top[:, :-1] - top[:, 1:]  # nan: a tie of impossibles, by index, or stopped
        gaps[:, t] = np.nan_to_num(diff, nan=np.inf).min(axis=1) / (t + 1)

    want = be.eager().beam_search(model_for(backend, name, "float64", seed), src, MAX_LEN, BEAM, alpha,
                                  True, observe=observe)
    got = beams(backend, name, "float32", seed)[alpha]
    clear = gaps.min(axis=1) > MARGIN
    assert clear.sum() >= 3, gaps.min(axis=1)
    for item in np.flatnonzero(clear):
        np.testing.assert_array_equal(got.all_tokens[item], want.all_tokens[item],
                                      err_msg=f"alpha {alpha} item {item}: smallest gap "
                                              f"{gaps[item].min():.3g}")
    for d in first_divergence(want.tokens, got.tokens):  # allowed where not clear; said
        if not clear[d.item]:
            print(f"near-tie: {d}; smallest gap per (t + 1) {gaps[d.item].min():.3g} at step "
                  f"{int(gaps[d.item].argmin())}")


# -- TF vs torch ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", DECODE_VARIANTS)
def test_tf_and_torch_decode_the_same_tokens(name):
    """float64: identical tokens, scores within the torch:tf bound, greedy and beam. float32:
    identical greedy tokens unless a near-tie (by the oracle's margins) explains the parting."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    seed, where = 0, f"{name} tf vs torch"
    tol = bound_for("float64", "torch:tf")
    assert_same_greedy(greedy("tf-function", name, "float64", seed), greedy("torch", name, "float64", seed),
                       tol, where)
    assert_same_beams(beams("tf-function", name, "float64", seed), beams("torch", name, "float64", seed),
                      tol, where)
    divergences = float32_divergences(name, seed, greedy("torch", name, "float32", seed),
                                      greedy("tf-function", name, "float32", seed))
    assert not unexplained(divergences), "float32 torch vs tf: " + report(divergences)


# -- TF only: its modes against each other ---------------------------------------------------------
# TF-only behaviour, kept here rather than in test_decoding_tf_only.py because it compares exactly
# the decodes the contract cases above memoise (`decoding_cases.greedy` / `.beams`: tf-function and
# XLA, cached, on the float64 tiny-post-standard seed 0 and float32 tiny-pre-annotated seed 1 cases).
# Under `--dist loadfile` a module runs on one worker, which has not necessarily run this one, so
# from another module these would trace and XLA-compile those loops a second time: measured 11 s
# there (most of test_decoding_tf_only.py's time in the full suite), 3 s here (the float32 XLA
# beam loop alone is new).
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compiled_and_eager_give_the_same_tokens(dtype):
    """Eager, tf.function and XLA: identical tokens and lengths, scores equal to rounding. Not bit
    for bit: in a tf.function TF's graph optimizer (grappler's constant folding) rewrites divisions
    by constants (the layer norm's, the length penalty's) into multiplications by the rounded
    reciprocal, as it does for the model's plain forward pass; XLA compiles its own kernels."""
    pytest.importorskip("tensorflow")
    name, seed = ("tiny-post-standard", 0) if dtype == "float64" else ("tiny-pre-annotated", 1)
    tol = bound_for(dtype, "tf:reference")
    eager_greedy, eager_beams = greedy("tf-eager", name, dtype, seed), beams("tf-eager", name, dtype, seed)
    for mode in ("tf-function", "tf-xla"):
        where = f"{mode} vs eager, {dtype}"
        assert_same_greedy(greedy(mode, name, dtype, seed), eager_greedy, tol, where)
        assert_same_beams(beams(mode, name, dtype, seed), eager_beams, tol, where)


@pytest.mark.parametrize("use_cache, name", [(True, "tiny-post-standard"), (False, "tiny-pre-annotated")])
def test_default_is_the_measured_mode(use_cache, name):
    """compiled=True by default, with XLA where it was measured to help (decoding.JIT_COMPILE)."""
    pytest.importorskip("tensorflow")
    import tf_impl
    from tf_impl import decoding

    model = model_for("tf-eager", name, "float64", 0)
    mode = "tf-xla" if decoding.JIT_COMPILE[use_cache] else "tf-function"
    for x, y in zip(tf_impl.greedy_decode(model, sources(config64(name), 0), MAX_LEN, use_cache=use_cache),
                    greedy(mode, name, "float64", 0, use_cache)):
        np.testing.assert_array_equal(x, y)


# -- all-padding sources, masks and inputs --------------------------------------------------------
@pytest.mark.parametrize("model_backend", TORCH_BACKENDS + ["tf-function"], indirect=True)
def test_all_padding_sources_decode_like_the_reference(model_backend):
    """Rows of nothing but padding, inside a batch and as whole batches, cached and recompute. TF
    decodes the batch of the parity sources' shape only (each new shape is a new trace; the parity
    sources hold an all-padding row too)."""
    config = config64("tiny-post-standard")
    w = weights_for(config, 0)
    model, ref = model_backend.build(config, w), R.Model(w, config)
    batches = [np.full((5, 7), config.pad_id)]
    if model_backend.framework == "torch":
        batches += [sources(config, 0, lengths=(7, 0, 3)), np.full((1, 2), config.pad_id)]
    for src in batches:
        want_greedy = R.greedy_decode(ref, src, MAX_LEN)
        want_beam = R.beam_search(ref, src, MAX_LEN, BEAM, 0.6, True)
        for use_cache in (True, False):
            got = model_backend.greedy_decode(model, src, MAX_LEN, use_cache=use_cache)
            beam = model_backend.beam_search(model, src, MAX_LEN, BEAM, 0.6, True, use_cache=use_cache)
            assert np.isfinite(got.log_probs).all() and np.isfinite(beam.all_scores).all()
            np.testing.assert_array_equal(got.tokens, want_greedy.tokens)
            np.testing.assert_array_equal(beam.all_tokens, want_beam.all_tokens)


@pytest.mark.parametrize("max_len, beam_size, alpha", [(6, 2, 0.0), (MAX_LEN, BEAM, 0.6)])
@pytest.mark.parametrize("model_backend", TORCH_BACKENDS + ["tf-function"], indirect=True)
def test_explicit_src_mask_equals_the_default(model_backend, max_len, beam_size, alpha):
    be = model_backend
    model = model_for(be.name, "tiny-pre-annotated", "float64", 0)
    src = be.src(sources(config64("tiny-pre-annotated"), 0))
    mask = be.make_src_mask(sources(config64("tiny-pre-annotated"), 0), model.config.pad_id)
    for fn in (lambda **kw: be.greedy_decode(model, src, max_len, **kw),
               lambda **kw: be.beam_search(model, src, max_len, beam_size, alpha, True, **kw)):
        for x, y in zip(fn(), fn(src_mask=mask)):
            np.testing.assert_array_equal(x, y)


MODEL64 = config64("tiny-pre-annotated")
W64 = weights_for(MODEL64, 0)
SRC = sources(MODEL64, 0, lengths=(7, 5, 2, 1))
BAD_INPUTS = [
    ("greedy", dict(max_len=0)), ("beam", dict(max_len=-3)), ("greedy", dict(max_len=2.5)),
    ("greedy", dict(max_len=65)), ("beam", dict(beam_size=0)), ("beam", dict(beam_size=17)),
    ("beam", dict(beam_size=100)), ("beam", dict(beam_size=None)), ("beam", dict(length_penalty=-1.0)),
    ("greedy", dict(src=SRC[0])), ("beam", dict(src=SRC[None])),
    ("greedy", dict(src=SRC.astype(np.float64))), ("beam", dict(src=SRC + 13)),
    ("greedy", dict(src=SRC[:, :0])),
    ("greedy", dict(src_mask=np.ones((4, 1, 1, 6), bool))),
    ("beam", dict(src=SRC.astype(np.float32), max_len=0, beam_size=0)),  # src is checked first
]


@pytest.mark.parametrize("kind, kwargs", BAD_INPUTS)
def test_bad_input_raises_the_reference_error(model_backend, kind, kwargs):
    """Checked before anything runs (in TF eagerly, before anything is traced: nothing can raise
    inside an XLA loop), with the reference's type and message, in every mode."""
    args = dict(src=SRC, max_len=5) | kwargs
    errors = {}
    be = model_backend
    calls = {"ref": (R.Model(W64, MODEL64), R.greedy_decode, R.beam_search),
             "backend": (be.build(MODEL64, W64), be.greedy_decode, be.beam_search)}
    for impl, (model, greedy_fn, beam_fn) in calls.items():
        with pytest.raises((TypeError, ValueError)) as info:
            (greedy_fn if kind == "greedy" else beam_fn)(model, **args)
        errors[impl] = (type(info.value), str(info.value))
    assert errors["backend"] == errors["ref"]


def test_model_must_be_the_backends_transformer(model_backend):
    with pytest.raises(TypeError, match=rf"model: expected a {model_backend.framework}_impl.Transformer, "
                                        r"got shared.reference.Model$"):
        model_backend.greedy_decode(R.Model(W64, MODEL64), SRC, 5)


@pytest.mark.parametrize("impl", ["reference", pytest.param("torch", marks=pytest.mark.torch),
                                  pytest.param("tf", marks=pytest.mark.tf)])
def test_a_flag_is_true_or_false_and_a_mask_no_list_in_every_implementation(impl):
    """Before: the decoders' flags were read for their truth (``return_all="no"`` returned every
    hypothesis, ``use_cache="no"`` used the cache, tf_impl's ``jit_compile="false"`` compiled with
    XLA; `make_tgt_mask`'s ``first_is_real="no"`` made column 0 real), and torch_impl took a
    nested list as ``src_mask`` where tf_impl and the reference refuse one."""
    config = TINY["tiny-pre-annotated"]
    weights = random_weights(config, 0)
    src = sources(config, 0)
    if impl == "reference":
        api, model, masks, ids = R, R.Model(weights, config), shared_masks, src
    else:
        api = pytest.importorskip(f"{impl}_impl")
        model, masks = api.Transformer(config), api.inputs
        model.import_weights(weights)
        ids = pytest.importorskip("torch").from_numpy(src) if impl == "torch" else src
    flag = r"^{}: expected True or False, got 'no' \(str\)$"
    with pytest.raises(TypeError, match=flag.format("return_all")):
        api.beam_search(model, src, 3, 2, return_all="no")
    with pytest.raises(TypeError, match=flag.format("first_is_real")):
        masks.make_tgt_mask(ids, config.pad_id, first_is_real="no")
    eager = {"compiled": False} if impl == "tf" else {}  # a flag's check, not a compile (1.5 s)
    assert api.beam_search(model, src, 3, 2, return_all=np.True_, **eager).all_tokens.shape[:2] == (src.shape[0], 2)
    with pytest.raises(TypeError, match=r"^src_mask: expected a bool array or tensor \(True = may attend\), "
                                        r"got list$"):
        api.greedy_decode(model, src, 3, src_mask=np.ones((src.shape[0], 1, 1, src.shape[1]), bool).tolist())
    if impl != "reference":
        with pytest.raises(TypeError, match=flag.format("use_cache")):
            api.greedy_decode(model, src, 3, use_cache="no")
    if impl == "tf":
        with pytest.raises(TypeError, match=flag.format("compiled")):
            api.greedy_decode(model, src, 3, compiled="no")
        with pytest.raises(TypeError, match=r"^jit_compile: expected True, False or None \(the measured default\), "
                                            r"got 'false' \(str\)$"):
            api.greedy_decode(model, src, 3, jit_compile="false")
