"""Decoding behaviour only tf_impl has: the mode arguments, the compiled loops on a GPU, and a cached
step that records gradients (torch_impl's is inference-only: its `decode_step` says why). The
contract both backends share is test_decoding.py; so are, though TF-only, the modes (eager,
tf.function, XLA) against each other and the measured default mode, because they compare the very
loops its contract cases trace and XLA-compile (in this module they would compile them again)."""
import pytest

tf = pytest.importorskip("tensorflow")

import tf_impl  # noqa: E402
from parity_tests.decoding_backends import TF_MODES  # noqa: E402
from parity_tests.decoding_cases import (ALPHAS, BEAM, MAX_LEN, config64, model_for,  # noqa: E402
                                         reference_decodes, sources, targets, weights_for)
from parity_tests.test_decoding import MODEL64, SRC, W64, assert_same_beams, assert_same_greedy  # noqa: E402
from parity_tests.tf_support import DEVICES  # noqa: E402  (importing it switches TF32 off)
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402


@pytest.mark.parametrize("device", DEVICES[1:] or [pytest.param("/GPU:0", marks=pytest.mark.skip("no GPU"))])
def test_float64_parity_on_gpu(device):
    """The compiled loops (tf.function and XLA) on a GPU: a fresh model, traced there."""
    name, seed = "tiny-post-final-norm", 1
    config = config64(name)
    want_greedy, want_beams = reference_decodes(name, seed)
    tol = bound_for("float64", "tf:reference")
    with tf.device(device):
        model = tf_impl.Transformer(config)
        model.import_weights(weights_for(config, seed))
        for mode in ("tf-function", "tf-xla"):
            src, kw = sources(config, seed), TF_MODES[mode]
            assert_same_greedy(tf_impl.greedy_decode(model, src, MAX_LEN, **kw), want_greedy, tol, mode)
            got = {alpha: tf_impl.beam_search(model, src, MAX_LEN, BEAM, alpha, True, **kw)
                   for alpha in ALPHAS}
            assert_same_beams(got, want_beams, tol, f"{device} {mode}")


def test_mode_arguments():
    model = model_for("tf-eager", "tiny-pre-annotated", "float64", 0)
    with pytest.raises(ValueError, match=r"jit_compile: XLA compiles the tf.function of the loop"):
        tf_impl.greedy_decode(model, SRC, 5, compiled=False, jit_compile=True)
    with pytest.raises(ValueError, match=r"observe: a Python hook called once a step"):
        tf_impl.beam_search(model, SRC, 5, observe=print)
    with pytest.raises(RuntimeError, match=r"call them eagerly"):
        tf.function(lambda: tf_impl.greedy_decode(model, tf.constant(SRC), 5))()
    # The model-type check of test_decoding, here with the reference model of the same weights.
    with pytest.raises(TypeError, match=r"model: expected a tf_impl.Transformer, got shared.reference.Model$"):
        tf_impl.greedy_decode(R.Model(W64, MODEL64), SRC, 5)


def test_an_xla_decode_that_may_not_fit_the_process_is_refused_before_it_compiles(monkeypatch):
    """TensorFlow keeps every XLA executable until the process ends, each holding memory
    mappings, and past vm.max_map_count LLVM aborts the process (docs/performance.md,
    "Retracing"). A decode whose signature its function has not run is refused with a
    MemoryError, before XLA compiles it, when fewer than the headroom are left; a signature
    already compiled, and a decode without XLA, run as before."""
    import os

    import numpy as np

    from tf_impl import decoding
    if os.path.exists("/proc/self/maps"):  # Linux: the counts are read
        used, limit = decoding._mapping_use()
        assert 0 < used < limit
    model = model_for("tf-eager", "tiny-pre-annotated", "float64", 0)
    want = tf_impl.greedy_decode(model, SRC, 5, jit_compile=True).tokens  # its signature compiled
    monkeypatch.setattr(decoding, "_mapping_use", lambda: (65530 - 100, 65530))
    np.testing.assert_array_equal(tf_impl.greedy_decode(model, SRC, 5, jit_compile=True).tokens, want)
    refusal = (r"tf_impl decoding: this process holds 65,430 memory mappings of the 65,530 the system allows "
               r"\(vm.max_map_count\), and XLA would compile another decode \(shapes .*\): TensorFlow never "
               r"releases a compiled decode, even with its model, and past the limit LLVM aborts the process\. "
               r"Decode sources padded to a few fixed shapes with models you keep, or pass jit_compile=False")
    with pytest.raises(MemoryError, match=refusal):
        tf_impl.greedy_decode(model, SRC[:1], 5, jit_compile=True)  # a new batch
    with pytest.raises(MemoryError, match=refusal):
        tf_impl.beam_search(model, SRC, 5, 2, jit_compile=True)
    np.testing.assert_array_equal(tf_impl.greedy_decode(model, SRC, 5, jit_compile=False).tokens, want)
    monkeypatch.setattr(decoding, "_mapping_use", lambda: None)  # no /proc: no limit known, no check
    np.testing.assert_array_equal(tf_impl.greedy_decode(model, SRC[:1], 5, jit_compile=True).tokens, want[:1])


def test_a_source_decodes_alike_whatever_its_model_decoded_before():
    """One source gives one model the same tokens and scores, bit for bit, whatever sources of
    other shapes that model decoded before. Before: the decode's tf.function traced its first
    source shapes with their sizes and later ones with unknown sizes (``reduce_retracing``), and a
    trace's sizes shape its graph (one row keeps the generator as ``(d, V)``), so a batch of one
    decoded after a batch of two got scores 2.4e-7 apart (tiny, float32; at a near tie, another
    token), with XLA (the default) or without. Now every source runs the trace of unknown sizes,
    as a SavedModel's signature does (test_saved_model: bit for bit)."""
    import numpy as np

    from parity_tests.tf_support import build
    from shared.batches import src_tgt
    config = TransformerConfig.preset("tiny", dropout=0.0)
    one, two = (src_tgt(config, batch=b, src_len=s, tgt_len=2, seed=b)[0] for b, s in ((1, 3), (2, 4)))
    fresh = tf_impl.greedy_decode(build(config), one, 12)
    model = build(config)
    tf_impl.greedy_decode(model, two, 12)
    after = tf_impl.greedy_decode(model, one, 12)
    for field in fresh._fields:
        np.testing.assert_array_equal(getattr(after, field), getattr(fresh, field), err_msg=field)


def test_decode_step_records_gradients_as_the_full_pass():
    """tf_impl's cached step is differentiable: its caches are immutable tensors and its step
    weights are read from the variables when the cache is made. Made and stepped under a
    ``tf.GradientTape``, a target fed token by token gives every variable the gradient the full
    pass gives it (float64: to op order)."""
    model = model_for("tf-eager", "tiny-post-final-norm", "float64", 0)
    config = model.config
    src = sources(config, 0)[:4]  # rows of 7, 5, 2 and 1 source tokens
    tgt = targets(config, 4, 3, 0)  # BOS, then two tokens fed and scored

    def log_probs(logits):  # of the token fed next (arbitrary but fixed targets)
        return tf.reduce_sum(tf.nn.log_softmax(logits) * tf.one_hot(tgt[:, 1:], config.tgt_vocab,
                                                                     dtype=logits.dtype))

    with tf.GradientTape() as tape:
        memory = model.encode(src)
        cache = model.init_cache(memory, src[:, None, None, :] != config.pad_id, 2)
        steps = []
        for t in range(2):
            logits, cache = model.decode_step(tgt[:, t], cache)
            steps.append(logits)
        stepped = log_probs(tf.stack(steps, axis=1))
    got = tape.gradient(stepped, model.trainable_variables)
    with tf.GradientTape() as tape:
        full = log_probs(model(src, tgt[:, :2]))
    want = tape.gradient(full, model.trainable_variables)
    assert_close(stepped.numpy(), full.numpy(), FLOAT64, "log-probs")
    for variable, g, w in zip(model.trainable_variables, got, want):
        assert g is not None, variable.path
        assert_close(tf.convert_to_tensor(g).numpy(), tf.convert_to_tensor(w).numpy(), FLOAT64,
                     variable.path)


def test_the_tensor_programs_honour_mask_padding():
    """`greedy_decode_tensors` and `beam_search_tensors` (what a SavedModel's signatures run) mask
    the source as the model does: not at all with ``mask_padding=False``, where they masked pad
    and an exported model decoded otherwise than tf_impl."""
    import numpy as np
    from tf_impl.decoding import beam_search_tensors, greedy_decode_tensors
    config = config64("tiny-pre-annotated").replace(mask_padding=False)
    model = tf_impl.Transformer(config)
    model.import_weights(weights_for(config, 0))
    src = sources(config, 0)
    assert (src == config.pad_id).any()  # padded rows: what the mask decides
    greedy = tf_impl.greedy_decode(model, src, MAX_LEN, jit_compile=False)  # one mode: the mask is the point
    got = greedy_decode_tensors(model, tf.constant(src, tf.int64), MAX_LEN, jit_compile=False)
    np.testing.assert_array_equal(got["tokens"].numpy(), greedy.tokens)
    np.testing.assert_array_equal(got["log_probs"].numpy(), greedy.log_probs)
    beams = tf_impl.beam_search(model, src, MAX_LEN, BEAM, jit_compile=False)
    got = beam_search_tensors(model, tf.constant(src, tf.int64), MAX_LEN, BEAM, jit_compile=False)
    np.testing.assert_array_equal(got["tokens"].numpy(), beams.tokens)
    np.testing.assert_array_equal(got["scores"].numpy(), beams.scores)
