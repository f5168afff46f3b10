"""The architecture variants (docs/design.md, convention 15) in all three implementations: each new
field alone and every non-default value at once (two combinations, since learned positions exclude
the ``pe_*`` fields), on batches with padded and all-padding rows.

* float64: reference vs torch (explicit and SDPA paths) vs TF (eager; tf.function and XLA for the
  combinations) on every traced intermediate, at the float64 bound; gradients torch vs TF;
* float32: the same comparisons at today's measured bounds (`shared.tolerances`);
* decoding: greedy and beam tokens and scores, cached and recomputing, against the oracle; the
  key/value cache against the full pass position by position;
* files: the three checkpoint formats and `twins convert` round trips, `twins compare --config`
  and `twins train --config` with a variant config.

Models are built once per (variant, dtype) and only read."""
import functools
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tf = pytest.importorskip("tensorflow")

from parity_tests.backends import Backend  # noqa: E402
from parity_tests.variant_configs import ALL, VARIANTS, config, weights  # noqa: E402
import tf_impl  # noqa: E402
import torch_impl  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared import tasks  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, assert_trace_close, bound_for, max_rel_diff  # noqa: E402
from shared.weights import save_checkpoint  # noqa: E402
from tf_impl import decoding as tf_decoding  # noqa: E402
from torch_impl import decoding as torch_decoding  # noqa: E402
from twins import demo_tasks  # noqa: E402
from twins.cli import main  # noqa: E402

MAX_NEW = 6


TORCH = Backend("torch", "eager", "cpu")
TF = {mode: Backend("tf", mode, "/CPU:0") for mode in ("eager", "function", "xla")}


@functools.lru_cache(maxsize=None)
def models(variant: str, dtype: str = "float64"):
    """(reference Model, torch model, TF model) with the same weights; read only."""
    c, w = config(variant, dtype), weights(variant, dtype)
    return R.Model(w, c), TORCH.build(c, w), TF["eager"].build(c, w)


def batch(c: TransformerConfig):
    """Rows: full, padded, all padding (the target's start token stays when it is pad)."""
    return src_tgt(c, batch=3, src_len=7, tgt_len=6, seed=1, src_lengths=[7, 3, 0], tgt_lengths=[6, 2, 0])


# -- forward parity -------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float64_every_intermediate(variant):
    c = config(variant)
    _, torch_model, tf_model = models(variant)
    src, tgt = batch(c)
    logits, trace = R.forward(weights(variant), c, src, tgt, return_trace=True)
    _, torch_trace = TORCH.trace(torch_model, src, tgt)
    assert_trace_close(torch_trace, trace, FLOAT64)
    assert_close(TORCH.logits(torch_model, src, tgt), logits, FLOAT64, "torch SDPA logits")
    assert_trace_close(TF["eager"].trace(tf_model, src, tgt)[1], trace, FLOAT64)


@pytest.mark.parametrize("mode", ["function", "xla"])
@pytest.mark.parametrize("variant", ALL)
def test_float64_tf_compiled(variant, mode):
    c = config(variant)
    src, tgt = batch(c)
    _, trace = R.forward(weights(variant), c, src, tgt, return_trace=True)
    assert_trace_close(TF[mode].trace(models(variant)[2], src, tgt)[1], trace, FLOAT64)


def float32_differences(variant: str, tf_mode: str = "eager") -> dict[str, float]:
    """The largest scaled difference over the trace for each pair (what the bounds compare)."""
    c = config(variant, "float32")
    _, torch_model, tf_model = models(variant, "float32")
    src, tgt = batch(c)
    _, ref = R.forward(weights(variant, "float32"), c, src, tgt, return_trace=True)
    _, torch_trace = TORCH.trace(torch_model, src, tgt)
    _, tf_trace = TF[tf_mode].trace(tf_model, src, tgt)
    worst = {}
    for pair, (a, b) in {"torch:reference": (torch_trace, ref), "tf:reference": (tf_trace, ref),
                         "torch:tf": (torch_trace, tf_trace)}.items():
        assert_trace_close(a, b, bound_for("float32", pair))
        worst[pair] = max(max_rel_diff(a[name], b[name]) for name in b)
    return worst


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float32_at_todays_bounds(variant):
    float32_differences(variant)


@pytest.mark.parametrize("variant", ALL)
def test_float32_xla_at_todays_bounds(variant):
    float32_differences(variant, "xla")


# -- gradients ------------------------------------------------------------------------------------
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_float64_gradients_torch_vs_tf(variant):
    """d(sum(logits * probe)) / d(every weight), learned positions included, torch against TF."""
    c = config(variant)
    _, torch_model, tf_model = models(variant)
    src, tgt = batch(c)
    probe = np.random.default_rng(0).normal(size=(3, 6, c.tgt_vocab))
    grads = TORCH.probe_gradients(torch_model, src, tgt, probe)
    expected = TF["eager"].probe_gradients(tf_model, src, tgt, probe)
    assert list(grads) == list(expected)
    for name, grad in grads.items():
        assert_close(grad, expected[name], FLOAT64, f"gradient of {name}")
    if c.positional == "learned":
        assert np.abs(grads["src_embed.positions"]).max() > 0


# -- decoding -------------------------------------------------------------------------------------
# The fields decoding reads beyond the forward pass (the start token, the positional row and the
# embedding of a decoding step, the cache's head width), and every field at once. An activation or
# a table layout changes only code the forward tests already cover.
DECODE_VARIANTS = ["learned", "offset", "head-dim", "start-pad", "start-eos", "no-pad-mask"] + ALL


@pytest.mark.parametrize("variant", DECODE_VARIANTS)
def test_float64_decoding_matches_the_oracle(variant):
    """Greedy and beam (K=3, alpha 0.6) against the oracle: torch cached and recomputing; TF
    compiled, cached (XLA) and recomputing (tf.function), for the combinations, and eager and
    cached for the single fields (an eager TF loop costs seconds; its recomputing step is the
    forward pass, covered above)."""
    c = config(variant)
    ref_model, torch_model, tf_model = models(variant)
    src, _ = batch(c)
    greedy = R.greedy_decode(ref_model, src, MAX_NEW)
    beam = R.beam_search(ref_model, src, MAX_NEW, 3, 0.6)
    compiled = variant in ALL
    runs = []
    for use_cache in (True, False):
        runs.append((f"torch use_cache={use_cache}",
                     torch_decoding.greedy_decode(torch_model, src, MAX_NEW, use_cache=use_cache),
                     torch_decoding.beam_search(torch_model, src, MAX_NEW, 3, 0.6, use_cache=use_cache)))
        if use_cache or compiled:
            runs.append((f"tf use_cache={use_cache} compiled={compiled}",
                         tf_decoding.greedy_decode(tf_model, src, MAX_NEW, use_cache=use_cache,
                                                   compiled=compiled),
                         tf_decoding.beam_search(tf_model, src, MAX_NEW, 3, 0.6, use_cache=use_cache,
                                                 compiled=compiled)))
    for where, g, b in runs:
        np.testing.assert_array_equal(g.tokens, greedy.tokens, where)
        np.testing.assert_array_equal(b.tokens, beam.tokens, where)
        assert_close(g.log_probs, greedy.log_probs, FLOAT64, f"{where} greedy log_probs")
        assert_close(b.scores, beam.scores, FLOAT64, f"{where} beam scores")


def _teacher_forced(c: TransformerConfig, src: np.ndarray) -> np.ndarray:
    """A target of the start token then non-pad tokens (decode_step is defined on pad-free prefixes)."""
    rng = np.random.default_rng(2)
    body = rng.choice([i for i in range(c.tgt_vocab) if i != c.pad_id], size=(len(src), MAX_NEW - 1))
    return np.concatenate([np.full((len(src), 1), c.start_id), body], axis=1)


@pytest.mark.parametrize("variant", ALL + ["start-pad", "learned", "head-dim", "no-pad-mask"])
def test_the_cache_equals_the_full_pass(variant):
    """decode_step, token by token from the start token, gives the forward pass's logits at every
    position (float64, both backends); with a pad start token the column-0 rule is what makes them
    agree."""
    c = config(variant)
    ref_model, torch_model, tf_model = models(variant)
    src, _ = batch(c)
    tgt = _teacher_forced(c, src)
    full = R.forward(ref_model.w, c, src, tgt)
    with torch.no_grad():
        s = torch.from_numpy(src)
        mask = torch_model._src_mask(s, None)
        cache = torch_model.init_cache(torch_model.encode(s), mask, tgt.shape[1])
        for t in range(tgt.shape[1]):
            logits, cache = torch_model.decode_step(torch.from_numpy(tgt[:, t]), cache)
            assert_close(logits.numpy(), full[:, t], FLOAT64, f"torch position {t}")
    cache = tf_model.init_cache(tf_model.encode(src), tf_model._src_mask(tf.constant(src), None), tgt.shape[1])
    for t in range(tgt.shape[1]):
        logits, cache = tf_model.decode_step(tgt[:, t], cache)
        assert_close(np.asarray(logits), full[:, t], FLOAT64, f"tf position {t}")


# -- files and the command line ---------------------------------------------------------------------
@pytest.mark.parametrize("variant", ALL)
def test_checkpoints_in_every_format_and_convert_round_trips(variant, tmp_path, capsys):
    c, w = config(variant, "float32"), weights(variant, "float32")
    save_checkpoint(tmp_path / "n1", c, w)
    for path in ("m.pt", "m.weights.h5"):
        module = torch_impl.checkpoints if path.endswith(".pt") else tf_impl.checkpoints
        module.write_checkpoint(tmp_path / path, c, w)
        read_config, read = module.read_checkpoint(tmp_path / path)
        assert read_config == c and all(np.array_equal(read[n], w[n]) for n in w) and read.keys() == w.keys()
    assert torch_impl.load_checkpoint(tmp_path / "m.pt").export_weights().keys() == w.keys()
    assert tf_impl.load_checkpoint(tmp_path / "m.weights.h5").config == c
    for src, dst in [("n1", "a.pt"), ("a.pt", "b.weights.h5"), ("b.weights.h5", "n2")]:
        assert main(["convert", str(tmp_path / src), str(tmp_path / dst), "--verify"]) == 0
    capsys.readouterr()
    for name in ("model.safetensors", "config.json"):
        assert (tmp_path / "n1" / name).read_bytes() == (tmp_path / "n2" / name).read_bytes()


def test_compare_with_a_variant_config(tmp_path, capsys):
    file = tmp_path / "variant.json"
    file.write_text(config("all-sinusoidal", "float32").to_json())
    assert main(["compare", "--config", str(file), "--src-len", "7", "--tgt-len", "6", "--decode",
                 "--max-new", "6"]) == 0
    out = capsys.readouterr().out
    assert "FAIL" not in out


@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_train_with_a_variant_config(backend, tmp_path, capsys):
    variant = demo_tasks.task_config("copy", preset="tiny").replace(
        dropout=0.0, activation="swish", positional="learned", embed_scale=False, head_dim=3,
        decoder_start_id=tasks.PAD_ID)
    file = tmp_path / "variant.json"
    file.write_text(variant.to_json())
    run = tmp_path / "run"
    assert main(["train", "--task", "copy", "--backend", backend, "--steps", "2", "--checkpoint",
                 str(run), "--eval-every", "2", "--heldout", "4", "--config", str(file),
                 "--no-progress", "--threads", "1"]) == 0
    capsys.readouterr()
    stored = json.loads((run / "config.json").read_text())["config"]
    assert TransformerConfig.from_dict(stored) == variant
