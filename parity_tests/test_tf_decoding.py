"""tf_impl decoding: the key/value cache against full recomputation, the TF search loops (eager and
compiled, XLA included) on the stub tables of test_decoding_stub, parity with the float64 oracle
(greedy and beam, cached and recompute, eager / tf.function / XLA), float32 tokens with near-ties
reported, TF vs torch, and bad input.

Tracing a loop costs about a second (XLA: several), so models are built once per (variant, dtype)
and given each seed's weights by `import_weights`, sources keep one shape, and decoding results are
memoised: the compiled loops of one model are traced once and reused by every test."""
import functools

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from parity_tests import test_decoding_stub as stub  # noqa: E402
from shared.batches import token_batch  # noqa: E402
from parity_tests.matrix import VARIANTS  # noqa: E402
from parity_tests.tf_support import DEVICES  # noqa: E402  (importing it switches TF32 off)
from shared.tolerances import assert_close, bound_for  # noqa: E402
from shared import decoding as D  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl import decoding, search  # noqa: E402
from tf_impl.inputs import make_src_mask  # noqa: E402

TINY = {name: config for name, config in VARIANTS.items() if name != "base"}
# Norm placement and style, final norm, shared and tied embeddings: every decode-step code path.
DECODE_VARIANTS = ["tiny-pre-annotated", "tiny-post-standard", "tiny-shared-tied-post",
                   "tiny-post-final-norm"]
MAX_LEN, BEAM, ALPHAS = 10, 3, (0.0, 0.6)
MARGIN = bound_for("float32", "decode-margin").rtol  # absolute log-prob margin
MODES = {"eager": dict(compiled=False), "function": dict(compiled=True, jit_compile=False),
         "xla": dict(compiled=True, jit_compile=True)}


def weights_for(config, seed: int, eos_boost: float = 1.5) -> dict:
    """Random weights with the EOS logit raised (as test_decoding_reference does), so that rows
    end at different steps instead of nearly all running to max_len."""
    w = random_weights(config, seed)
    w["generator.bias"] = w["generator.bias"].copy()
    w["generator.bias"][config.eos_id] += eos_boost
    return w


def sources(config, seed: int, lengths=(7, 5, 2, 1, 0)) -> np.ndarray:
    """A padded batch; the last row is all padding."""
    return token_batch(config, config.src_vocab, len(lengths), 7, seed, list(lengths))


def targets(config, rows: int, length: int, seed: int) -> np.ndarray:
    """BOS then ordinary tokens, no pad: what decoding feeds (it never generates pad)."""
    tgt = token_batch(config, config.tgt_vocab, rows, length, seed, [length] * rows)
    tgt[:, 0] = config.bos_id
    return tgt


@functools.lru_cache(maxsize=None)
def _model(variant: str, dtype: str) -> tf_impl.Transformer:
    return tf_impl.Transformer(TINY[variant].replace(dtype=dtype))


def model_with(variant: str, dtype: str, weights: dict) -> tf_impl.Transformer:
    """The one model of (variant, dtype), holding ``weights`` (its compiled loops are kept)."""
    model = _model(variant, dtype)
    model.import_weights({name: value.astype(dtype) for name, value in weights.items()})
    return model


def config64(variant: str):
    return TINY[variant].replace(dtype="float64")


@functools.lru_cache(maxsize=None)
def reference_decodes(variant: str, seed: int):
    """The oracle's greedy result and beam results (K = 3, every beam) per alpha."""
    config = config64(variant)
    model, src = R.Model(weights_for(config, seed), config), sources(config, seed)
    return (R.greedy_decode(model, src, MAX_LEN),
            {alpha: R.beam_search(model, src, MAX_LEN, BEAM, alpha, True) for alpha in ALPHAS})


def _decode_args(variant: str, dtype: str, seed: int, use_cache: bool, mode: str):
    """The model holding ``weights_for(float64, seed)`` cast to ``dtype``, the sources, the mode."""
    config = config64(variant)
    model = model_with(variant, dtype, weights_for(config, seed))
    return model, sources(config, seed), dict(MODES[mode], use_cache=use_cache)


@functools.lru_cache(maxsize=None)
def tf_greedy(variant: str, dtype: str, seed: int, use_cache: bool, mode: str):
    model, src, kw = _decode_args(variant, dtype, seed, use_cache, mode)
    return tf_impl.greedy_decode(model, src, MAX_LEN, **kw)


@functools.lru_cache(maxsize=None)
def tf_beams(variant: str, dtype: str, seed: int, use_cache: bool, mode: str):
    """Beam results (K = 3, every beam) per alpha; one compiled loop serves both alphas."""
    model, src, kw = _decode_args(variant, dtype, seed, use_cache, mode)
    return {alpha: tf_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True, **kw) for alpha in ALPHAS}


def assert_same_greedy(greedy, want_greedy, bound, where: str) -> None:
    """Identical tokens and lengths; log-probs within ``bound``."""
    np.testing.assert_array_equal(greedy.tokens, want_greedy.tokens, err_msg=f"greedy {where}")
    np.testing.assert_array_equal(greedy.lengths, want_greedy.lengths, err_msg=f"greedy {where}")
    assert_close(greedy.log_probs, want_greedy.log_probs, bound, f"greedy log_probs {where}")


def assert_same_beams(beams, want_beams, bound, where: str) -> None:
    """Identical tokens and lengths of every beam; scores within ``bound``."""
    for alpha, want_beam in want_beams.items():
        beam = beams[alpha]
        for field in ("tokens", "lengths", "all_tokens", "all_lengths"):
            np.testing.assert_array_equal(getattr(beam, field), getattr(want_beam, field),
                                          err_msg=f"beam alpha={alpha} {field} {where}")
        for field in ("scores", "step_scores", "all_scores"):
            assert_close(getattr(beam, field), getattr(want_beam, field), bound,
                         f"beam alpha={alpha} {field} {where}")


# -- the cache: token by token equals one full pass (keras-hub's test_cache_call_is_correct) -------
CACHE_CASES = [("tiny-pre-annotated", "float64"), ("tiny-pre-annotated", "float32"),
               ("tiny-post-standard", "float64"), ("tiny-post-standard", "float32"),
               ("tiny-shared-tied-post", "float64"), ("tiny-post-final-norm", "float64")]


def self_attn_inputs(model, trace, i):
    """What decoder layer ``i``'s self-attention read in the full pass: the normalised stream in
    pre-norm, the stream itself in post-norm."""
    if model.config.norm_first:
        return trace[f"decoder.layers.{i}.self_attn_norm"]
    return trace["decoder.embed"] if i == 0 else trace[f"decoder.layers.{i - 1}.ffn.residual"]


@pytest.mark.parametrize("variant, dtype", CACHE_CASES)
def test_cache_step_by_step_equals_one_full_pass(variant, dtype):
    config = TINY[variant].replace(dtype=dtype)
    model = model_with(variant, dtype, random_weights(config, 3))
    bound = bound_for(dtype, "tf:reference")
    src = sources(config, 3, lengths=(7, 3, 0))  # batch 3, padded, one all-padding row
    t_len = 9
    tgt = targets(config, 3, t_len, 4)
    logits_full, trace = model(src, tgt, return_trace=True)  # (B, T, V)
    memory = model.encode(src)
    cache = model.init_cache(memory, make_src_mask(tf.constant(src), config.pad_id), max_len=t_len)
    for t in range(t_len):
        logits, cache = model.decode_step(tgt[:, t], cache)
        assert_close(logits.numpy(), logits_full[:, t].numpy(), bound, f"logits at step {t}")
    assert int(cache.length) == t_len and cache.capacity == t_len
    for i, (layer, kept) in enumerate(zip(model.decoder.layers, cache.layers)):
        k, v = layer.self_attn.keys_values(self_attn_inputs(model, trace, i))
        assert_close(kept.self_key.numpy(), k.numpy(), bound, f"layer {i} self keys")
        assert_close(kept.self_value.numpy(), v.numpy(), bound, f"layer {i} self values")
        ck, cv = layer.cross_attn.keys_values(memory)
        assert np.array_equal(kept.cross_key, ck) and np.array_equal(kept.cross_value, cv)
    with pytest.raises(ValueError, match=r"cache: expected a free position, got a full cache"):
        model.decode_step(tgt[:, 0], cache)


def test_reordered_cache_equals_full_pass_on_the_reordered_sequences():
    """Beam reordering: after ``reorder_beams(rows)``, row n continues row rows[n]'s prefix."""
    config = config64("tiny-post-standard")
    model = model_with("tiny-post-standard", "float64", random_weights(config, 5))
    items, beams, split, t_len = 2, 3, 4, 8
    src = sources(config, 5, lengths=(7, 2))
    tgt = targets(config, items * beams, t_len, 6)  # (N, T), rows item * beams + beam
    rows = np.array([2, 0, 0, 4, 5, 3])  # within each item
    spliced = np.concatenate([tgt[rows, :split], tgt[:, split:]], axis=1)  # what the rows hold after
    before, after = (model(np.repeat(src, beams, axis=0), x).numpy() for x in (tgt, spliced))
    cache = model.init_cache(model.encode(src), make_src_mask(tf.constant(src), config.pad_id), t_len,
                             beams)
    for t in range(t_len):
        if t == split:
            cache = cache.reorder_beams(tf.constant(rows))
        seq, want = (tgt, before) if t < split else (spliced, after)
        logits, cache = model.decode_step(seq[:, t], cache)
        assert_close(logits.numpy(), want[:, t], bound_for("float64", "tf:reference"), f"step {t}")


def test_decode_step_checks_its_arguments():
    config = TINY["tiny-pre-annotated"]
    model = model_with("tiny-pre-annotated", "float32", random_weights(config, 0))
    src = sources(config, 0)
    mask = make_src_mask(tf.constant(src), config.pad_id)
    cache = model.init_cache(model.encode(src), mask, 4)
    with pytest.raises(ValueError, match=r"tokens: expected a tensor of shape \(5,\)"):
        model.decode_step(tf.ones(4, tf.int64), cache)
    with pytest.raises(TypeError, match=r"tokens: expected integer token ids, got dtype float32"):
        model.decode_step(tf.ones(5), cache)
    with pytest.raises(ValueError, match=r"tokens: expected token ids in \[0, 17\)"):
        model.decode_step(tf.fill([5], 17), cache)
    with pytest.raises(TypeError, match=r"cache: expected a tf_impl.cache.DecoderCache"):
        model.decode_step(tf.ones(5, tf.int64), {})
    with pytest.raises(ValueError, match=r"max_len: expected at most config.max_len=64"):
        model.init_cache(model.encode(src), mask, 65)
    with pytest.raises(ValueError, match=r"beams: expected an int >= 1, got 0"):
        model.init_cache(model.encode(src), mask, 4, beams=0)


# -- the search loops on the stub tables of test_decoding_stub --------------------------------------
class NumpyStep:
    """A NumPy step ``prefixes (N, t+1) -> log-probs (N, V)`` (the stub tables) as a TF step:
    called directly eagerly, through ``tf.numpy_function`` inside a ``tf.function`` (which looks
    ``fn`` up when it runs, so a compiled loop can be reused with another table)."""

    def __init__(self, fn, vocab: int, dtype=tf.float64):
        self.fn, self.vocab, self.dtype = fn, vocab, dtype

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        prefix = prefixes[:, : t + 1]
        if tf.executing_eagerly():
            return tf.constant(self.fn(prefix.numpy())), state
        return tf.numpy_function(lambda p: self.fn(p), [prefix], self.dtype, stateful=True), state

    def reorder(self, state, rows):
        return state


# Compiled stub runs reuse one traced loop per shape: the tables go through this one step.
TABLE = NumpyStep(None, stub.V)


@functools.lru_cache(maxsize=None)
def _compiled_greedy(*args):
    return tf.function(lambda: search.greedy_loop(TABLE, *args), autograph=False)


@functools.lru_cache(maxsize=None)
def _compiled_beam(*args):
    return tf.function(lambda alpha: search.beam_loop(TABLE, *args, length_penalty=alpha), autograph=False)


def tf_greedy_search(step, batch, max_len, bos_id, eos_id, pad_id, compiled=False):
    if not compiled:
        return search.greedy_search(NumpyStep(step, stub.V), batch, max_len, bos_id, eos_id, pad_id)
    TABLE.fn = step
    search.check_greedy_args(TABLE, batch, max_len, bos_id, eos_id, pad_id)
    return search.greedy_result(_compiled_greedy(batch, max_len, bos_id, eos_id, pad_id)())


def tf_beam_search(step, batch, max_len, beam_size, bos_id, eos_id, pad_id, length_penalty=0.0,
                   return_all=False, compiled=False):
    if not compiled:
        return search.beam_search(NumpyStep(step, stub.V), batch, max_len, beam_size, bos_id, eos_id,
                                  pad_id, length_penalty, return_all)
    TABLE.fn = step
    search.check_beam_args(TABLE, batch, max_len, beam_size, bos_id, eos_id, pad_id, length_penalty)
    loop = _compiled_beam(batch, max_len, beam_size, bos_id, eos_id, pad_id)
    return search.beam_result(loop(tf.constant(float(length_penalty), tf.float64)), return_all)


# Every test of test_decoding_stub that runs a search is collected here twice, as test_stub_eager_*
# and test_stub_compiled_*, with the module's greedy_search / beam_search swapped for the TF loops
# (the fixture below), so the hand-derived expected tokens and scores of those tables apply to TF
# unchanged, eagerly and inside tf.function. test_bad_step_output has a TF version below: a TF step
# declares its vocabulary, so the first message names it.
STUB_TESTS = [name for name in dir(stub) if name.startswith("test_")
              and name not in ("test_length_penalty_closed_forms", "test_bad_step_output")]
for _name in STUB_TESTS:
    for _mode in ("eager", "compiled"):
        globals()[f"test_stub_{_mode}_{_name[len('test_'):]}"] = getattr(stub, _name)


@pytest.fixture(autouse=True)
def _stub_tests_run_the_tf_loops(request, monkeypatch):
    if request.function.__module__ == stub.__name__:
        compiled = request.node.name.startswith("test_stub_compiled_")
        monkeypatch.setattr(stub, "greedy_search", functools.partial(tf_greedy_search, compiled=compiled))
        monkeypatch.setattr(stub, "beam_search", functools.partial(tf_beam_search, compiled=compiled))


def test_stub_tests_are_collected_here():
    assert len(STUB_TESTS) >= 14 and "test_exact_ties_go_to_lowest_token_then_lowest_beam" in STUB_TESTS


@pytest.mark.parametrize("compiled", [False, True])
def test_bad_step_output(compiled):
    def run(fn, vocab=stub.V, beam=None):
        step = NumpyStep(fn, vocab)
        if beam is None:
            return search.greedy_search(step, 2, 3, stub.BOS, stub.EOS, stub.PAD, compiled=compiled)
        return search.beam_search(step, 1, 3, beam, stub.BOS, stub.EOS, stub.PAD, compiled=compiled)

    with pytest.raises(ValueError, match=r"step: expected log-probs without NaN or \+inf \(step 0\)"):
        run(lambda p: np.full((len(p), stub.V), np.nan))
    with pytest.raises(ValueError, match=r"step: expected log-probs without NaN or \+inf \(step 1\)"):
        run(lambda p: np.full((len(p), stub.V), np.inf if p.shape[1] == 2 else -1.0))
    if not compiled:  # eagerly the shapes are known at the call; compiled, ensure_shape raises
        with pytest.raises(ValueError, match=r"step: expected log-probs of shape \(2, 6\), got shape \(2,\)"):
            run(lambda p: np.zeros(len(p)))
        calls = []

        def shrinking(prefixes):  # the vocabulary may not change between steps
            calls.append(1)
            return np.log(np.full((len(prefixes), stub.V - len(calls) + 1), 0.1))
        with pytest.raises(ValueError, match=r"expected log-probs of shape \(2, 6\), got shape \(2, 5\)"):
            run(shrinking, beam=2)
    else:
        with pytest.raises(tf.errors.InvalidArgumentError):
            run(lambda p: np.zeros(len(p)))
    with pytest.raises(ValueError, match=r"eos_id: expected an int in \[0, 2\), got 2"):
        run(lambda p: np.zeros((len(p), 2)), vocab=2)  # the ids are checked against step.vocab first


@pytest.mark.parametrize("beam_size, alpha", [(1, 0.0), (2, 0.0), (3, 0.7), (5, 1.0)])
@pytest.mark.parametrize("seed", range(3))
def test_tf_loops_equal_the_spec(seed, beam_size, alpha):
    """On random prefix-dependent tables (float64), the eager TF loops return the spec's arrays,
    bit for bit but for the ulp the penalty's pow may differ by (see the next test)."""
    step = stub.RandomStep(seed, beam_size)
    want = D.beam_search(step, 3, 8, beam_size, stub.BOS, stub.EOS, stub.PAD, alpha, return_all=True)
    got = tf_beam_search(step, 3, 8, beam_size, stub.BOS, stub.EOS, stub.PAD, alpha, True)
    for name, x, y in zip(D.BeamResult._fields, got, want):
        if alpha == 0.0 or "scores" not in name:
            np.testing.assert_array_equal(x, y, err_msg=name)
        else:
            np.testing.assert_allclose(x, y, rtol=1e-15, atol=0, err_msg=name)
    greedy = D.greedy_search(stub.RandomStep(seed, 1), 3, 8, stub.BOS, stub.EOS, stub.PAD)
    got = tf_greedy_search(stub.RandomStep(seed, 1), 3, 8, stub.BOS, stub.EOS, stub.PAD)
    for name, x, y in zip(D.GreedyResult._fields, got, greedy):
        np.testing.assert_array_equal(x, y, err_msg=name)


def test_search_runs_in_the_dtype_of_the_step():
    step = stub.RandomStep(0, 2)
    r = search.beam_search(NumpyStep(lambda p: step(p).astype(np.float32), stub.V, tf.float32), 2, 5, 2,
                           stub.BOS, stub.EOS, stub.PAD, 0.6, True)
    assert r.scores.dtype == np.float32 and r.all_tokens.dtype == np.int64


def markov_table(seed: int, batch: int, max_len: int) -> np.ndarray:
    """``table[item, t, last token]`` = next-token log-probs ``(B, T, V, V)``, drawn from a few
    probabilities (exact ties everywhere, some impossible tokens); after EOS it is NaN, which the
    loops must never read."""
    rng = np.random.default_rng(seed)
    probs = rng.choice([0.0, 0.05, 0.1, 0.2, 0.3], size=(batch, max_len, stub.V, stub.V))
    probs[..., stub.EOS] += 0.05 * np.arange(max_len)[:, None]  # rows end, at different steps
    with np.errstate(divide="ignore"):
        table = np.log(probs)
    table[..., stub.EOS, :] = np.nan
    return table


class MarkovStep:
    """A markov_table as a TF-native step (so it also runs under XLA): row n at step t reads
    ``table[n // beams, t, prefixes[n, t]]``. ``numpy`` is the same step for the spec."""

    def __init__(self, table, beams: int):
        self.table, self.beams = table, beams  # (B, T, V, V)
        self.vocab, self.dtype = table.shape[-1], tf.float64

    def numpy(self, prefixes):
        item = np.arange(len(prefixes)) // self.beams
        return self.table[item, prefixes.shape[1] - 1, prefixes[:, -1]]

    def initial_state(self):
        return ()

    def __call__(self, prefixes, t, state):
        n = prefixes.shape[0]
        last = tf.gather(prefixes, t, axis=1)  # (N,)
        at = tf.stack([tf.range(n, dtype=tf.int64) // self.beams, tf.fill([n], tf.cast(t, tf.int64)),
                       last], axis=-1)
        return tf.gather_nd(self.table, at), state

    def reorder(self, state, rows):
        return state


@functools.lru_cache(maxsize=None)
def _markov_loop(beam_size, batch, max_len, jit_compile):
    """One compiled loop per shape, table and alpha as arguments (beam_size 0: greedy)."""
    def loop(table, alpha):
        step, ids = MarkovStep(table, max(beam_size, 1)), (stub.BOS, stub.EOS, stub.PAD)
        if beam_size == 0:
            return search.greedy_loop(step, batch, max_len, *ids)
        return search.beam_loop(step, batch, max_len, beam_size, *ids, alpha)
    return tf.function(loop, jit_compile=jit_compile, autograph=False)


def markov_search(table, beam_size, alpha, mode):
    """The TF loops on a markov_table (beam_size 0: greedy) in one of MODES."""
    batch, max_len, ids = table.shape[0], table.shape[1], (stub.BOS, stub.EOS, stub.PAD)
    if mode == "eager":
        step = MarkovStep(tf.constant(table), max(beam_size, 1))
        if beam_size == 0:
            return search.greedy_search(step, batch, max_len, *ids)
        return search.beam_search(step, batch, max_len, beam_size, *ids, alpha, True)
    out = _markov_loop(beam_size, batch, max_len, mode == "xla")(tf.constant(table),
                                                                 tf.constant(alpha, tf.float64))
    return search.greedy_result(out) if beam_size == 0 else search.beam_result(out, True)


@pytest.mark.parametrize("mode", list(MODES))
def test_markov_tables_in_every_mode(mode):
    """Eager, tf.function and XLA loops against the spec, on tables full of exact ties: identical
    tokens and lengths everywhere, and identical scores whenever alpha = 0 (sums of the same
    numbers in the same order). With alpha > 0 the penalty ``((5 + L) / 6) ** alpha`` may differ
    from NumPy's by an ulp (TF's pow is Eigen's, not libm's; in a graph ``/ 6`` becomes ``* (1/6)``)."""
    batch, max_len, ids = 3, 7, (stub.BOS, stub.EOS, stub.PAD)
    for seed, beam_size, alpha in [(0, 0, 0.0), (1, 1, 0.0), (2, 4, 0.0), (3, 4, 0.7), (4, 4, 1.0)]:
        table = markov_table(seed, batch, max_len)
        spec = MarkovStep(table, max(beam_size, 1)).numpy
        got = markov_search(table, beam_size, alpha, mode)
        if beam_size == 0:
            want = D.greedy_search(spec, batch, max_len, *ids)
        else:
            want = D.beam_search(spec, batch, max_len, beam_size, *ids, alpha, return_all=True)
        for name, x, y in zip(type(want)._fields, got, want):
            if alpha == 0.0 or "scores" not in name:
                np.testing.assert_array_equal(x, y, err_msg=f"{name} seed {seed}")
            else:
                np.testing.assert_allclose(x, y, rtol=1e-15, atol=0, err_msg=f"{name} seed {seed}")


# -- parity with the float64 oracle ---------------------------------------------------------------
# Every decode variant compiled (tf.function) with the cache; recompute, eager and XLA on some, so
# that each trace is paid once (the expensive part) and every mode meets the oracle. XLA recompute
# (all max_len positions every step, see tf_impl.decoding) is the same step for greedy and beam.
PARITY = ([(name, seed, True, "function", True) for name in DECODE_VARIANTS for seed in range(3)]
          + [(name, seed, False, "function", True) for name in ("tiny-pre-annotated", "tiny-shared-tied-post")
             for seed in range(3)]
          + [("tiny-post-final-norm", 0, use_cache, "eager", True) for use_cache in (True, False)]
          + [("tiny-post-standard", seed, use_cache, "xla", use_cache) for seed in range(2)
             for use_cache in (True, False)])


@pytest.mark.parametrize("name, seed, use_cache, mode, beams", PARITY)
def test_float64_parity_with_the_reference(name, seed, use_cache, mode, beams):
    """Identical tokens and lengths; per-step and final scores within the float64 bound (1e-12 of
    the scale, tighter than the issue's 1e-10), greedy and beam (alpha 0 and 0.6, every beam)."""
    bound, where = bound_for("float64", "tf:reference"), f"{name} seed {seed} use_cache={use_cache} {mode}"
    want_greedy, want_beams = reference_decodes(name, seed)
    assert_same_greedy(tf_greedy(name, "float64", seed, use_cache, mode), want_greedy, bound, where)
    if beams:
        assert_same_beams(tf_beams(name, "float64", seed, use_cache, mode), want_beams, bound, where)


@pytest.mark.parametrize("device", DEVICES[1:] or [pytest.param("/GPU:0", marks=pytest.mark.skip("no GPU"))])
def test_float64_parity_on_gpu(device):
    """The compiled loops (tf.function and XLA) on a GPU: a fresh model, traced there."""
    name, seed = "tiny-post-final-norm", 1
    config = config64(name)
    want_greedy, want_beams = reference_decodes(name, seed)
    bound = bound_for("float64", "tf:reference")
    with tf.device(device):
        model = tf_impl.Transformer(config)
        model.import_weights(weights_for(config, seed))
        for mode in ("function", "xla"):
            src, kw = sources(config, seed), MODES[mode]
            assert_same_greedy(tf_impl.greedy_decode(model, src, MAX_LEN, **kw), want_greedy, bound, mode)
            beams = {alpha: tf_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True, **kw)
                     for alpha in ALPHAS}
            assert_same_beams(beams, want_beams, bound, f"{device} {mode}")


def test_parity_cases_cover_early_eos_and_max_len():
    lengths = np.concatenate([reference_decodes(name, seed)[0].lengths for name, seed, *_ in PARITY])
    assert (lengths < MAX_LEN).sum() >= 10 and (lengths == MAX_LEN).sum() >= 5, lengths


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_compiled_and_eager_give_the_same_tokens(dtype):
    """Eager, tf.function and XLA: identical tokens and lengths, scores equal to rounding. Not bit
    for bit: in a tf.function TF's graph optimizer (grappler's constant folding) rewrites divisions
    by constants (the layer norm's, the length penalty's) into multiplications by the rounded
    reciprocal, as it does for the model's plain forward pass; XLA compiles its own kernels."""
    name, seed = ("tiny-post-standard", 0) if dtype == "float64" else ("tiny-pre-annotated", 1)
    bound = bound_for(dtype, "tf:reference")
    eager_greedy = tf_greedy(name, dtype, seed, True, "eager")
    eager_beams = tf_beams(name, dtype, seed, True, "eager")
    for mode in ("function", "xla"):
        where = f"{mode} vs eager, {dtype}"
        assert_same_greedy(tf_greedy(name, dtype, seed, True, mode), eager_greedy, bound, where)
        assert_same_beams(tf_beams(name, dtype, seed, True, mode), eager_beams, bound, where)


@pytest.mark.parametrize("use_cache, name", [(True, "tiny-post-standard"), (False, "tiny-pre-annotated")])
def test_default_is_the_measured_mode(use_cache, name):
    """compiled=True by default, with XLA where it was measured to help (decoding.JIT_COMPILE)."""
    model, src, _ = _decode_args(name, "float64", 0, use_cache, "eager")
    mode = "xla" if decoding.JIT_COMPILE[use_cache] else "function"
    for x, y in zip(tf_impl.greedy_decode(model, src, MAX_LEN, use_cache=use_cache),
                    tf_greedy(name, "float64", 0, use_cache, mode)):
        np.testing.assert_array_equal(x, y)


# -- float32: identical tokens unless a near-tie explains the difference --------------------------
def teacher_forced_log_probs(w, config, src, tokens) -> np.ndarray:
    """The oracle's step log-probs (B, T, V) along ``tokens``, pad impossible (as the search sees it)."""
    tgt = np.concatenate([np.full((len(src), 1), config.bos_id), tokens[:, :-1]], axis=1)
    lp = R.log_softmax(R.forward(w, config, src, tgt))
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
    return D.first_divergence(want.tokens, got.tokens, lp64)


FLOAT32 = [(name, seed, "function") for name in DECODE_VARIANTS for seed in range(2)] + [
    ("tiny-pre-annotated", 1, "eager"), ("tiny-pre-annotated", 1, "xla")]


@pytest.mark.parametrize("name, seed, mode", FLOAT32)
def test_float32_greedy_tokens_equal_unless_a_near_tie(name, seed, mode):
    want = reference_decodes(name, seed)[0]
    got = tf_greedy(name, "float32", seed, True, mode)
    divergences = float32_divergences(name, seed, want, got)
    assert not unexplained(divergences), f"float32 vs float64, {mode}: " + report(divergences)
    same = ~np.isin(np.arange(len(want.tokens)), [d.item for d in divergences])  # rows that agree
    assert_close(got.log_probs[same], want.log_probs[same], bound_for("float32", "tf:reference"),
                 "float32 greedy log_probs")


def test_float32_near_tie_is_reported_not_failed():
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
    got = tf_impl.greedy_decode(model_with("tiny-pre-annotated", "float32", w64), src, MAX_LEN,
                                **MODES["function"])
    divergences = D.first_divergence(want.tokens, got.tokens,
                                     teacher_forced_log_probs(w64, c64, src, want.tokens))
    assert [(d.item, d.step, d.token_a, d.token_b) for d in divergences] == [
        (item, 0, hi, lo) for item in range(5)]
    assert all(abs(d.margin - 1e-8) < 1e-12 for d in divergences) and not unexplained(divergences)
    assert str(divergences[0]).startswith(f"item 0: first differs at step 0: token {hi} vs {lo}")


@pytest.mark.parametrize("name", ["tiny-pre-annotated", "tiny-post-standard"])
def test_float32_beam_tokens_equal_where_every_gap_exceeds_the_bound(name):
    """Margins come from an eager float64 run (equal to the oracle, above), observed at each step:
    the gaps between consecutive candidates among the best K + 1. Ranking scores sum t + 1 step
    log-probs, so at step t the bound is MARGIN * (t + 1). Items above it must give identical beams."""
    seed = 0
    model, src, _ = _decode_args(name, "float64", seed, True, "eager")
    for alpha in ALPHAS:
        gaps = np.full((len(src), MAX_LEN), np.inf)

        def observe(t, top):  # (B, K + 1) sorted descending
            top = top.numpy()
            with np.errstate(invalid="ignore"):
                diff = top[:, :-1] - top[:, 1:]  # -inf - -inf = nan: a tie of impossibles, by index
            gaps[:, t] = np.nan_to_num(diff, nan=np.inf).min(axis=1) / (t + 1)

        want = tf_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True, compiled=False, observe=observe)
        got = tf_beams(name, "float32", seed, True, "function")[alpha]
        clear = gaps.min(axis=1) > MARGIN
        assert clear.sum() >= 3, gaps.min(axis=1)
        for item in np.flatnonzero(clear):
            np.testing.assert_array_equal(got.all_tokens[item], want.all_tokens[item],
                                          err_msg=f"alpha {alpha} item {item}: smallest gap "
                                                  f"{gaps[item].min():.3g}")
        for d in D.first_divergence(want.tokens, got.tokens):  # allowed where not clear; said
            print(f"near-tie: {d}; smallest gap per (t + 1) {gaps[d.item].min():.3g}")


# -- TF vs torch ----------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def torch_decodes(name: str, dtype: str, seed: int):
    torch = pytest.importorskip("torch")
    torch_impl = pytest.importorskip("torch_impl")
    if not hasattr(torch_impl, "greedy_decode"):
        pytest.skip("torch_impl has no decoding yet")
    c64 = config64(name)
    model = torch_impl.Transformer(c64.replace(dtype=dtype))
    model.import_weights({k: v.astype(dtype) for k, v in weights_for(c64, seed).items()})
    src = torch.from_numpy(sources(c64, seed))
    return (torch_impl.greedy_decode(model, src, MAX_LEN),
            {alpha: torch_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True) for alpha in ALPHAS})


@pytest.mark.parametrize("name", DECODE_VARIANTS)
def test_tf_and_torch_decode_the_same_tokens(name):
    """float64: identical tokens, scores within the torch:tf bound, greedy and beam. float32:
    identical greedy tokens unless a near-tie (by the oracle's margins) explains the parting."""
    seed, where = 0, f"{name} tf vs torch"
    torch_greedy, torch_beams = torch_decodes(name, "float64", seed)
    bound = bound_for("float64", "torch:tf")
    assert_same_greedy(tf_greedy(name, "float64", seed, True, "function"), torch_greedy, bound, where)
    assert_same_beams(tf_beams(name, "float64", seed, True, "function"), torch_beams, bound, where)
    divergences = float32_divergences(name, seed, torch_decodes(name, "float32", seed)[0],
                                      tf_greedy(name, "float32", seed, True, "function"))
    assert not unexplained(divergences), "float32 torch vs tf: " + report(divergences)


# -- all-padding sources, masks, modes and inputs -------------------------------------------------
def test_all_padding_sources_decode_like_the_reference():
    """A batch of nothing but padding (the parity sources hold one all-padding row too)."""
    config = config64("tiny-pre-annotated")
    w = weights_for(config, 0)
    model, ref = model_with("tiny-pre-annotated", "float64", w), R.Model(w, config)
    src = np.full((5, 7), config.pad_id)
    want_greedy = R.greedy_decode(ref, src, MAX_LEN)
    want_beam = R.beam_search(ref, src, MAX_LEN, BEAM, 0.6, True)
    for use_cache in (True, False):
        kw = dict(MODES["function"], use_cache=use_cache)
        greedy = tf_impl.greedy_decode(model, src, MAX_LEN, **kw)
        beam = tf_impl.beam_search(model, src, MAX_LEN, BEAM, 0.6, True, **kw)
        assert np.isfinite(greedy.log_probs).all() and np.isfinite(beam.all_scores).all()
        np.testing.assert_array_equal(greedy.tokens, want_greedy.tokens)
        np.testing.assert_array_equal(beam.all_tokens, want_beam.all_tokens)


def test_explicit_src_mask_equals_the_default():
    model, src, kw = _decode_args("tiny-pre-annotated", "float64", 0, True, "function")
    mask = make_src_mask(tf.constant(src), model.config.pad_id)
    for x, y in zip(tf_impl.greedy_decode(model, src, MAX_LEN, src_mask=mask, **kw),
                    tf_greedy("tiny-pre-annotated", "float64", 0, True, "function")):
        np.testing.assert_array_equal(x, y)
    want = tf_beams("tiny-pre-annotated", "float64", 0, True, "function")[0.6]
    for x, y in zip(tf_impl.beam_search(model, src, MAX_LEN, BEAM, 0.6, True, src_mask=mask, **kw), want):
        np.testing.assert_array_equal(x, y)


MODEL64 = config64("tiny-pre-annotated")
W64 = weights_for(MODEL64, 0)
SRC = sources(MODEL64, 0, lengths=(7, 5, 2, 1))
BAD_INPUTS = [
    ("greedy", dict(max_len=0)), ("beam", dict(max_len=-3)), ("greedy", dict(max_len=2.5)),
    ("greedy", dict(max_len=65)), ("beam", dict(beam_size=0)), ("beam", dict(beam_size=17)),
    ("beam", dict(beam_size=100)), ("beam", dict(length_penalty=-1.0)),
    ("greedy", dict(src=SRC[0])), ("beam", dict(src=SRC[None])),
    ("greedy", dict(src=SRC.astype(np.float64))), ("beam", dict(src=SRC + 13)),
    ("greedy", dict(src=SRC[:, :0])),
    ("greedy", dict(src_mask=np.ones((4, 1, 1, 6), bool))),
    ("beam", dict(src=SRC.astype(np.float32), max_len=0, beam_size=0)),  # src is checked first
]


@pytest.mark.parametrize("kind, kwargs", BAD_INPUTS)
def test_bad_input_raises_the_reference_error(kind, kwargs):
    """Checked eagerly, before anything is traced, with the reference's type and message, whatever
    the mode (XLA included: nothing can raise inside the compiled loop)."""
    args = dict(src=SRC, max_len=5) | kwargs
    errors = {}
    calls = {"ref": (R.Model(W64, MODEL64), R.greedy_decode, R.beam_search, {}),
             "tf": (model_with("tiny-pre-annotated", "float64", W64), tf_impl.greedy_decode,
                    tf_impl.beam_search, MODES["xla"])}
    for impl, (model, greedy, beam, mode) in calls.items():
        with pytest.raises((TypeError, ValueError)) as info:
            (greedy if kind == "greedy" else beam)(model, **args, **mode)
        errors[impl] = (type(info.value), str(info.value))
    assert errors["tf"] == errors["ref"]


def test_model_and_mode_arguments():
    model = model_with("tiny-pre-annotated", "float64", W64)
    with pytest.raises(TypeError, match=r"model: expected a tf_impl.Transformer, got _?Model"):
        tf_impl.greedy_decode(R.Model(W64, MODEL64), SRC, 5)
    with pytest.raises(ValueError, match=r"jit_compile: XLA compiles the tf.function of the loop"):
        tf_impl.greedy_decode(model, SRC, 5, compiled=False, jit_compile=True)
    with pytest.raises(ValueError, match=r"observe: a Python hook called once a step"):
        tf_impl.beam_search(model, SRC, 5, observe=print)
    with pytest.raises(RuntimeError, match=r"call them eagerly"):
        tf.function(lambda: tf_impl.greedy_decode(model, tf.constant(SRC), 5))()
