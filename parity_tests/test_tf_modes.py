"""tf_impl runs the same eagerly, inside tf.function, with XLA (jit_compile=True) and through
keras.Model.predict; dropout only with training=True; encode/decode equal the call; masks; Keras
serialisation of the config."""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

import tf_impl  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from parity_tests.matrix import case  # noqa: E402
from parity_tests.tf_support import DEVICES, build, cached, run_logits, run_trace  # noqa: E402
from shared.tolerances import assert_close, assert_trace_close, bound_for  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import make_src_mask as np_src_mask, make_tgt_mask as np_tgt_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl.inputs import make_src_mask, make_tgt_mask  # noqa: E402

TINY = TransformerConfig.preset("tiny")  # dropout 0.1
MODE_CASES = [("tiny-pre-annotated", "b3-all-padding-row", "float64"),
              ("tiny-shared-tied-post", "b3-padded-src-longer", "float32"),
              ("base", "b2-tgt-longer", "float32")]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant, shape, dtype", MODE_CASES, ids=lambda p: str(p))
def test_every_mode_matches_reference_and_eager(variant, shape, dtype, device):
    """Every intermediate in eager, tf.function and XLA, and the logits of predict, against the
    reference; the compiled modes also against eager (same bound: XLA fuses and reorders)."""
    config, src, tgt = case(variant, shape, dtype)
    weights = random_weights(config, 0)
    _, ref = R.forward(weights, config, src, tgt, return_trace=True)
    model = cached(config)
    bound = bound_for(dtype, "tf:reference")
    eager = run_trace(model, src, tgt, device, "eager")
    for mode in ("function", "xla"):
        trace = run_trace(model, src, tgt, device, mode)
        assert_trace_close(trace, ref, bound)
        assert_trace_close(trace, eager, bound)
        assert_close(run_logits(model, src, tgt, device, mode), trace["logits"], bound, f"{mode} logits")
    predicted = run_logits(model, src, tgt, device, "predict")
    assert predicted.dtype == config.dtype
    assert_close(predicted, ref["logits"], bound, "predict logits")
    assert_close(predicted, eager["logits"], bound, "predict vs eager logits")


def test_predict_accepts_tuple_dict_and_batches():
    config = TINY.replace(dtype="float64")
    model = cached(config)
    src, tgt = src_tgt(config, batch=5, src_len=6, tgt_len=4)
    want = run_logits(model, src, tgt)
    bound = bound_for("float64", "tf:reference")
    assert_close(model.predict((src, tgt), verbose=0), want, bound, "tuple")
    assert_close(model.predict({"src": src, "tgt": tgt}, batch_size=2, verbose=0), want, bound, "dict")
    masks = {"src": src, "tgt": tgt, "src_mask": np_src_mask(src, 0), "tgt_mask": np_tgt_mask(tgt, 0)}
    assert_close(model.predict(masks, batch_size=2, verbose=0), want, bound, "dict with masks")


def test_predict_compiled_with_xla():
    config = TINY.replace(dtype="float32")
    model = build(config)
    src, tgt = src_tgt(config, batch=3, src_len=6, tgt_len=5)
    want = run_logits(model, src, tgt)
    model.compile(jit_compile=True)
    assert_close(model.predict((src, tgt), verbose=0), want, bound_for("float32", "tf:reference"),
                 "xla predict")


def test_variable_lengths_in_one_function_need_no_retrace_per_batch():
    config = TINY.replace(dtype="float64")
    model = cached(config)
    fn = tf.function(lambda s, t: model(s, t),
                     input_signature=[tf.TensorSpec([None, None], tf.int64)] * 2)
    for b, s, t in [(1, 3, 2), (3, 7, 5)]:
        src, tgt = src_tgt(config, batch=b, src_len=s, tgt_len=t)
        assert_close(fn(src, tgt).numpy(), R.forward(random_weights(config, 0), config, src, tgt),
                     bound_for("float64", "tf:reference"), f"{(b, s, t)}")


@pytest.mark.parametrize("return_trace", [False, True])
def test_dropout_only_with_training(return_trace):
    config = TINY.replace(dtype="float64")
    w = random_weights(config, 0)
    model = build(config, w)
    src, tgt = src_tgt(config, batch=2, src_len=6, tgt_len=5)

    def logits(training):
        out = model(src, tgt, training=training, return_trace=return_trace)
        return np.asarray(out[0] if return_trace else out)

    a, b = logits(False), logits(False)
    np.testing.assert_array_equal(a, b)
    assert_close(a, R.forward(w, config, src, tgt), bound_for("float64", "tf:reference"))
    c, d = logits(True), logits(True)
    assert np.isfinite(c).all()
    assert not np.allclose(c, a) and not np.allclose(c, d)
    np.testing.assert_array_equal(logits(False), a)
    fn = tf.function(lambda s, t, training: model(s, t, training=training))
    assert_close(fn(src, tgt, False).numpy(), a, bound_for("float64", "tf:reference"), "graph eval")
    assert not np.allclose(fn(src, tgt, True).numpy(), a)


def test_no_dropout_config_trains_like_eval():
    config = TINY.replace(dtype="float64", dropout=0.0)
    model = cached(config)
    src, tgt = src_tgt(config)
    np.testing.assert_array_equal(np.asarray(model(src, tgt, training=True)), np.asarray(model(src, tgt)))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_encode_decode_generator_equal_call(dtype, device):
    config = TINY.replace(dtype=dtype)
    model = cached(config, 1)
    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=5, src_lengths=[7, 0, 2])
    with tf.device(device):
        memory = model.encode(src)
        hidden = model.decode(tgt, memory, make_src_mask(tf.constant(src), config.pad_id))
        logits = model.generator(hidden)
        whole = model(src, tgt)
    assert logits.dtype.name == dtype and memory.shape == (3, 7, config.d_model)
    np.testing.assert_array_equal(logits.numpy(), whole.numpy())
    assert_close(memory.numpy(), R.encode(random_weights(config, 1), config, src),
                 bound_for(dtype, "tf:reference"), "memory")


def test_derived_masks_equal_shared_masks():
    src, tgt = src_tgt(TINY, batch=3, src_len=6, tgt_len=4)
    np.testing.assert_array_equal(make_src_mask(tf.constant(src), 0).numpy(), np_src_mask(src, 0))
    np.testing.assert_array_equal(make_tgt_mask(tf.constant(tgt), 0).numpy(), np_tgt_mask(tgt, 0))


def test_explicit_masks_equal_derived_ones_and_matter():
    config = TINY.replace(dtype="float64")
    model = cached(config, 2)
    src, tgt = src_tgt(config)
    derived = run_logits(model, src, tgt)
    explicit = np.asarray(model(src, tgt, src_mask=np_src_mask(src, 0), tgt_mask=np_tgt_mask(tgt, 0)))
    np.testing.assert_array_equal(derived, explicit)
    everything = np.ones((1, 1, 1, src.shape[1]), bool)
    assert not np.allclose(np.asarray(model(src, tgt, src_mask=everything)), derived)


def test_decoder_is_causal():
    config = TINY.replace(dtype="float64")
    model = cached(config, 5)
    src, tgt = src_tgt(config, batch=1, src_len=5, tgt_len=6, tgt_lengths=[6])
    changed = tgt.copy()
    changed[0, 4] = 3 if tgt[0, 4] != 3 else 4
    a, b = run_logits(model, src, tgt), run_logits(model, src, changed)
    np.testing.assert_array_equal(a[:, :4], b[:, :4])
    assert not np.allclose(a[:, 4:], b[:, 4:])


def test_all_padding_rows_are_zero_and_finite():
    config = TINY.replace(dtype="float32", norm_first=False, norm_style="standard")
    model = cached(config, 3)
    src, tgt = src_tgt(config, batch=2, src_len=5, tgt_len=4, src_lengths=[5, 0], tgt_lengths=[4, 0])
    trace = run_trace(model, src, tgt)
    for name, value in trace.items():
        assert np.isfinite(value).all(), name
    for name in ("encoder.layers.0.self_attn.weights", "decoder.layers.0.self_attn.weights",
                 "decoder.layers.1.cross_attn.weights"):
        assert (trace[name][1] == 0).all(), name
    src_keys = np.broadcast_to(np_src_mask(src, 0), trace["decoder.layers.0.cross_attn.weights"].shape)
    assert (trace["decoder.layers.0.cross_attn.weights"][~src_keys] == 0).all()  # exactly zero


def test_get_config_from_config_round_trip():
    config = TINY.replace(dtype="float64", share_embeddings=True, tgt_vocab=TINY.src_vocab, tie_output=True)
    model = tf_impl.Transformer(config, name="twin")
    saved = model.get_config()
    assert saved["config"] == config.to_dict() and saved["name"] == "twin"
    clone = tf_impl.Transformer.from_config(saved)
    assert clone.config == config and clone.name == "twin"
    clone.import_weights(model.export_weights())
    src, tgt = src_tgt(config)
    np.testing.assert_array_equal(run_logits(clone, src, tgt), run_logits(model, src, tgt))
    again = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(model))
    assert isinstance(again, tf_impl.Transformer) and again.config == config


def test_sublayers_and_dtypes():
    config = TINY.replace(dtype="float64")
    model = tf_impl.Transformer(config)
    for name in ("src_embed", "tgt_embed", "positional", "encoder", "decoder", "generator", "config"):
        assert hasattr(model, name), name
    assert all(v.dtype == "float64" for v in model.weights)
    assert model.positional.table.dtype == tf.float64
    layer = model.decoder.layers[1]
    for name in ("self_attn", "self_attn_norm", "cross_attn", "cross_attn_norm", "ffn", "ffn_norm"):
        assert hasattr(layer, name), name
    assert model.encoder.final_norm is not None  # tiny is pre-norm
    assert layer.self_attn_norm.eps == config.norm_eps  # never Keras' 1e-3
