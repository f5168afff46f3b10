"""Models whose layers changed after they were built, in both backends: a low-rank adapter (LoRA)
on every attention and feed-forward projection (torch: a PEFT-style wrapper module, or
``torch.nn.utils.parametrize``; Keras: ``Dense.enable_lora``), quantized projections
(``torch.ao.quantization.quantize_dynamic``, Keras' ``Model.quantize("int8")``), a hook on a
projection (torch), a precision set after a compiled decode (TF).

The rule under test (docs/design.md, "Layers changed after building"): the inference pass and
decoding read a layer's weights directly only while every layer is as built
(`torch_impl.cache._as_built`, `tf_impl.cache._as_built`) and call the layers otherwise, and
tf_impl's compiled loops are traced again when the model's structure changes
(`tf_impl.model._structure`). Each case first decodes the unchanged model, so that torch_impl has
kept its weights and tf_impl has traced its loop, then changes it: the answers must be the changed
model's, never the kept or traced ones of before.
"""
import copy

import numpy as np
import pytest

from parity_tests.adapters import (RANK, adapter_factors, fold_adapters, keras_int8, keras_lora, layer_at,
                                   lora_training_differences, one_layer_config, torch_parametrize,
                                   torch_wrap)
from parity_tests.backends import HAVE_TF, HAVE_TORCH
from shared import reference as R
from shared.batches import src_tgt
from shared.loss import log_softmax
from shared.tolerances import assert_close, bound_for
from shared.weights import random_weights

MAX_LEN, BEAM = 6, 3

if HAVE_TORCH:
    import torch
    from torch import nn

    import torch_impl
    from parity_tests.torch_support import build as torch_build

if HAVE_TF:
    import tensorflow as tf

    import tf_impl
    from parity_tests.tf_support import build as tf_build
    from tf_impl.precision import set_precision as tf_set_precision


class _Torch:
    framework = "torch"

    def __init__(self, adapt):
        self.adapt = adapt

    def build(self, config, weights):
        return torch_build(config, weights)

    def forwards(self, model, src, tgt):
        """Logits of the inference pass (eval, no gradients) and of the modules (gradients on)."""
        s, t = torch.from_numpy(src), torch.from_numpy(tgt)
        with torch.no_grad():
            inferred = model(s, t).numpy()
        return [inferred, model(s, t).detach().numpy()]

    def greedy(self, model, src, use_cache=True):
        return torch_impl.greedy_decode(model, src, MAX_LEN, use_cache=use_cache)

    def beam(self, model, src, use_cache=True):
        return torch_impl.beam_search(model, src, MAX_LEN, BEAM, use_cache=use_cache)


class _Keras:
    framework = "tf"

    def __init__(self, adapt, compiled):
        self.adapt, self.compiled = adapt, compiled

    def build(self, config, weights):
        return tf_build(config, weights)

    def forwards(self, model, src, tgt):
        return [model(src, tgt).numpy()]

    def greedy(self, model, src, use_cache=True):
        return tf_impl.greedy_decode(model, src, MAX_LEN, use_cache=use_cache, **self._mode())

    def beam(self, model, src, use_cache=True):
        return tf_impl.beam_search(model, src, MAX_LEN, BEAM, use_cache=use_cache, **self._mode())

    def _mode(self):  # tf.function without XLA: the same trace-keeping, a cheaper trace
        return {"compiled": True, "jit_compile": False} if self.compiled else {"compiled": False}


def _cases():
    cases = []
    if HAVE_TORCH:
        cases += [pytest.param(lambda: _Torch(torch_wrap), variant, id=f"torch-wrapper-{variant}")
                  for variant in ("tiny-pre-annotated", "tiny-shared-tied-post")]
        cases.append(pytest.param(lambda: _Torch(torch_parametrize), "tiny-post-final-norm",
                                  id="torch-parametrization-tiny-post-final-norm"))
    if HAVE_TF:  # a trace costs about a second: one variant compiled, one eager
        cases += [pytest.param(lambda: _Keras(keras_lora, True), "tiny-pre-annotated",
                               id="tf-function-lora-tiny-pre-annotated"),
                  pytest.param(lambda: _Keras(keras_lora, False), "tiny-shared-tied-post",
                               id="tf-eager-lora-tiny-shared-tied-post")]
    return cases


def _batch(config):
    # a padded row and an all-padding one, as the decoding contract's
    return src_tgt(config, batch=3, src_len=9, tgt_len=7, seed=0, src_lengths=[9, 4, 0],
                   tgt_lengths=[7, 5, 0])


@pytest.mark.parametrize("make, variant", _cases())
def test_an_adapted_model_computes_and_decodes_its_merged_weights(make, variant):
    """With a low-rank adapter on every projection, the forward pass, greedy decoding (cached and
    recomputed) and beam search give what the float64 oracle gives for the weights with the
    adapters folded in, after a decode of the unadapted model kept its weights or traced its loop."""
    backend, config = make(), one_layer_config(variant, dtype="float64")
    weights, factors = random_weights(config, 0), adapter_factors(config)
    src, tgt = _batch(config)
    model = backend.build(config, weights)
    before = backend.greedy(model, src)  # torch_impl keeps its weights, tf_impl traces its loop
    np.testing.assert_array_equal(before.tokens, R.greedy_decode(R.Model(weights, config), src, MAX_LEN).tokens)

    backend.adapt(model, factors)
    merged_weights = fold_adapters(weights, factors)
    merged = R.Model(merged_weights, config)
    bound = bound_for("float64", f"{backend.framework}:reference")
    want = R.forward(merged_weights, config, src, tgt)
    assert not np.allclose(want, R.forward(weights, config, src, tgt), atol=1e-3)  # adapters matter
    for i, logits in enumerate(backend.forwards(model, src, tgt)):
        assert_close(logits, want, bound, f"logits ({i})")

    want_greedy = R.greedy_decode(merged, src, MAX_LEN)
    assert not np.allclose(want_greedy.log_probs, before.log_probs, atol=1e-3)  # so would a stale decode
    for use_cache in (True, False):
        got = backend.greedy(model, src, use_cache)
        np.testing.assert_array_equal(got.tokens, want_greedy.tokens, f"greedy, use_cache={use_cache}")
        assert_close(got.log_probs, want_greedy.log_probs, bound, f"greedy log-probs, use_cache={use_cache}")
    got, want_beam = backend.beam(model, src), R.beam_search(merged, src, MAX_LEN, BEAM)
    np.testing.assert_array_equal(got.tokens, want_beam.tokens, "beam tokens")
    assert_close(got.scores, want_beam.scores, bound, "beam scores")


@pytest.mark.skipif(not HAVE_TF, reason="TensorFlow not installed")
def test_keras_predict_and_evaluate_follow_an_adapter():
    """Keras keeps the functions it compiles for ``predict``, ``fit`` and ``evaluate`` (it makes
    them again only on ``quantize``); tf_impl's model makes them again when its structure changed,
    so after ``enable_lora`` they compute the adapted model: the oracle's logits and loss for the
    merged weights."""
    import keras

    config = one_layer_config("tiny-pre-annotated", dtype="float64")
    weights, factors = random_weights(config, 0), adapter_factors(config)
    src, tgt = _batch(config)
    inputs, labels = {"src": src, "tgt": tgt}, np.roll(tgt, -1, axis=1)
    model = tf_build(config, weights)
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)  # float32 arithmetic
    model.compile(loss=loss)
    model.predict(inputs, verbose=0), model.evaluate(inputs, labels, verbose=0)  # both traced
    keras_lora(model, factors)
    want = R.forward(fold_adapters(weights, factors), config, src, tgt)  # (B, T, V) float64
    assert_close(model.predict(inputs, verbose=0), want, bound_for("float64", "tf:reference"), "predict")
    # the loss of the oracle's logits, computed by the same Keras loss (in float32, as Keras does)
    assert model.evaluate(inputs, labels, verbose=0) == float(loss(labels, want))


# -- the weights of a changed model: read merged, or refused whole -------------------------------
def _changes():
    """``(backend, change, got, merged)``: how a case changes a model, what its projections then
    are (the ``got`` of `shared.weights.changed_layer`), and whether an export reads the adapted
    kernels merged (a parametrization, Keras' LoRA) or must refuse (a replacement, a quantization)."""
    cases = []
    if HAVE_TORCH:
        def quantize(model, factors):
            torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8, inplace=True)
        cases += [pytest.param("torch", torch_wrap, "a parity_tests.adapters.LowRankAdapter", False, id="torch-wrapper"),
                  pytest.param("torch", torch_parametrize, "a Linear with its weight parametrized", True,
                               id="torch-parametrization")]
        if hasattr(getattr(torch, "ao", None), "quantization"):
            cases.append(pytest.param("torch", quantize, "a torch.ao.nn.quantized.dynamic.modules.linear.Linear",
                                      False, id="torch-int8"))
    if HAVE_TF:
        cases += [pytest.param("tf", keras_lora, f"a Dense with LoRA enabled (rank {RANK})", True,
                               id="tf-lora"),
                  pytest.param("tf", keras_int8, "a Dense quantized to int8",
                               False, id="tf-int8")]
    return cases


@pytest.mark.parametrize("framework, change, got, merged", _changes())
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_the_weights_of_a_changed_model_are_read_merged_or_refused_whole(framework, change, got, merged,
                                                                          tmp_path):
    """`export_weights` (and so `save_checkpoint`) of a model whose projections were changed reads
    an adapter merged into its kernel where the layer computes one (a parametrization, Keras'
    LoRA) and otherwise refuses with one `WeightsError` naming every changed projection, writing
    no file; `import_weights` always refuses (the parameters the schema names are not the ones
    the layers compute with), leaving the model as it was. Both backends, the same words."""
    from shared.weights import WeightsError, changed_layer

    impl = torch_impl if framework == "torch" else tf_impl
    dtype = "float32" if "quantize" in got else "float64"  # quantize_dynamic takes float32 only
    config = one_layer_config("tiny-pre-annotated", dtype=dtype)
    weights, factors = random_weights(config, 0), adapter_factors(config)
    model = (torch_build if framework == "torch" else tf_build)(config, weights)
    change(model, factors)
    changed = list(factors) + (["generator"] if framework == "torch" and "quantize" in got else [])
    path = tmp_path / "model"  # a neutral directory
    if merged:
        np.testing.assert_equal(model.export_weights(), fold_adapters(weights, factors))  # dyadic: exact
        impl.save_checkpoint(model, path)
        np.testing.assert_equal(impl.load_checkpoint(path).export_weights(), fold_adapters(weights, factors))
    else:
        with pytest.raises(WeightsError) as raised:
            model.export_weights()
        assert raised.value.problems == [changed_layer(name, got, True) for name in changed]
        with pytest.raises(WeightsError):
            impl.save_checkpoint(model, path)
        assert not path.exists() and not list(tmp_path.iterdir())
    before = [np.array(v) for v in _state(framework, model)]
    with pytest.raises(WeightsError) as raised:
        model.import_weights(random_weights(config, 1))
    assert raised.value.problems == [changed_layer(name, got, False) for name in changed]
    for old, new in zip(before, _state(framework, model)):
        np.testing.assert_array_equal(new, old)  # nothing half-written


def _state(framework: str, model) -> list:
    """Every value the model holds, as arrays (torch: the state dict; Keras: its variables)."""
    if framework == "torch":
        return [t.detach().numpy() for t in _tensors(model.state_dict())]
    return [v.numpy() for v in model.variables]


def _tensors(state: dict) -> list:
    """The plain tensors of a state dict (a quantized module keeps packed parameters as tuples)."""
    out = []
    for value in state.values():
        if isinstance(value, torch.Tensor):
            out.append(value.dequantize() if value.is_quantized else value)
        elif isinstance(value, tuple):
            out += [v.dequantize() if v.is_quantized else v for v in value if isinstance(v, torch.Tensor)]
    return out


# -- torch: hooks ---------------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
def test_a_hook_on_a_projection_fires_in_every_torch_pass(monkeypatch):
    """A forward hook on one projection (the query of the first decoder layer: what attention
    probes read) fires in the modules' pass with gradients, in the forward pass without, and at
    every cached decoding step, and the values are those of the model without the hook. Where
    CUDA graphs would replay the steps (here made to think so), a hooked model is not graphed
    (`torch_impl.decoding._graphed`): a replay would not fire the hook."""
    from torch_impl import graphs
    config = one_layer_config("tiny-pre-annotated", dtype="float64")
    model = torch_build(config, random_weights(config, 0))
    src, tgt = _batch(config)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    plain_greedy, plain_beam = (torch_impl.greedy_decode(model, src, MAX_LEN),
                                torch_impl.beam_search(model, src, MAX_LEN, BEAM))
    with torch.no_grad():
        plain = model(s, t).numpy()
    seen = []
    handle = model.decoder.layers[0].self_attn.query.register_forward_hook(
        lambda module, args, out: seen.append(tuple(out.shape)))
    bound = bound_for("float64", "torch:reference")
    try:
        assert_close(model(s, t).detach().numpy(), plain, bound, "logits, gradients on")
        with torch.no_grad():
            assert_close(model(s, t).numpy(), plain, bound, "logits, no gradients")
        assert seen == [(3, 7, config.d_model)] * 2
        seen.clear()
        monkeypatch.setattr(graphs, "usable", lambda where: True)  # as on CUDA
        monkeypatch.setattr(graphs, "_capture", lambda work, where: pytest.fail("a hooked model was graphed"))
        greedy = torch_impl.greedy_decode(model, src, MAX_LEN)
        assert seen == [(3, 1, config.d_model)] * int(greedy.lengths.max())  # one call a step
        np.testing.assert_array_equal(greedy.tokens, plain_greedy.tokens)
        assert_close(greedy.log_probs, plain_greedy.log_probs, bound, "greedy log-probs")
        beam = torch_impl.beam_search(model, src, MAX_LEN, BEAM)
        np.testing.assert_array_equal(beam.tokens, plain_beam.tokens)
        assert_close(beam.scores, plain_beam.scores, bound, "beam scores")
    finally:
        handle.remove()


# -- quantized projections ------------------------------------------------------------------------
@pytest.mark.skipif(not HAVE_TORCH, reason="torch not installed")
@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_a_dynamically_quantized_torch_model_runs_its_quantized_layers():
    """``quantize_dynamic`` replaces every Linear with an int8 one (the generator's too). The
    forward pass runs them with and without gradients (the same values: both call the modules),
    and decodes run them: the first step, where a cached and a recomputing decode give every
    layer the same rows, agrees within float32 rounding. (Later steps differ by design: a dynamic
    quantization scales each call's input by its own range.)"""
    quantize_dynamic = getattr(getattr(torch, "ao", None), "quantization", None)
    quantize_dynamic = getattr(quantize_dynamic, "quantize_dynamic", None)
    if quantize_dynamic is None:
        pytest.skip("this torch has no torch.ao.quantization.quantize_dynamic")
    config = one_layer_config("tiny-pre-annotated")
    model = torch_build(config, random_weights(config, 0))
    src, tgt = _batch(config)
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)
    torch_impl.greedy_decode(model, src, MAX_LEN)  # kept weights of the float model
    quantized = quantize_dynamic(copy.deepcopy(model), {nn.Linear}, dtype=torch.qint8)
    with torch.no_grad():
        inferred, floating = quantized(s, t), model(s, t)
    assert torch.equal(inferred, quantized(s, t).detach())
    assert not torch.allclose(inferred, floating, atol=1e-4)  # the int8 layers ran
    cached = torch_impl.greedy_decode(quantized, src, MAX_LEN)
    recomputed = torch_impl.greedy_decode(quantized, src, MAX_LEN, use_cache=False)
    assert_close(cached.log_probs[:, 0], recomputed.log_probs[:, 0], bound_for("float32", "torch:reference"),
                 "first step's log-probs")
    assert np.isfinite(torch_impl.beam_search(quantized, src, MAX_LEN, BEAM).scores).all()


@pytest.mark.skipif(not HAVE_TF, reason="TensorFlow not installed")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("compiled", [True, False], ids=["tf-function", "tf-eager"])
def test_an_int8_keras_model_decodes_as_its_forward_pass(compiled):
    """Keras' ``Model.quantize("int8")`` makes each Dense's ``kernel`` its int8 values, which its
    call rescales: decoding calls the layers. Keras quantizes a Dense's input row by row, so a
    cached step and the full pass give a row the same products: the greedy log-probs (cached and
    recomputed) are the teacher-forced forward pass's to float64 rounding."""
    config = one_layer_config("tiny-pre-annotated", dtype="float64")
    model = tf_build(config, random_weights(config, 0))
    src, _ = _batch(config)
    mode = {"compiled": True, "jit_compile": False} if compiled else {"compiled": False}
    before = tf_impl.greedy_decode(model, src, MAX_LEN, **mode)
    keras_int8(model)
    bound = bound_for("float64", "tf:reference")
    for use_cache in (True, False):
        got = tf_impl.greedy_decode(model, src, MAX_LEN, use_cache=use_cache, **mode)
        prefix = np.concatenate([np.full((src.shape[0], 1), config.start_id), got.tokens[:, :-1]], axis=1)
        logits = model(src, prefix).numpy()  # teacher-forced on the decoded tokens
        forced = np.take_along_axis(log_softmax(logits), got.tokens[..., None], axis=-1)[..., 0]
        live = np.arange(MAX_LEN)[None] < got.lengths[:, None]  # 0 after EOS
        assert_close(np.where(live, forced, 0.0), got.log_probs, bound, f"log-probs, use_cache={use_cache}")
        assert not np.allclose(got.log_probs, before.log_probs, atol=1e-4)  # the int8 layers ran


# -- TF: a precision set after a compiled decode or prediction -----------------------------------
@pytest.mark.skipif(not HAVE_TF, reason="TensorFlow not installed")
def test_a_precision_set_after_tracing_applies_to_decoding_and_predict():
    """`tf_impl.precision.set_precision` after the compiled decoding loop and Keras' ``predict``
    were traced: the next decode and prediction run in the new precision, exactly as in a model
    given that precision before its first call (a kept trace would run float32). The training
    step follows the same key (`tf_impl.model._structure`): a layer frozen after it was traced,
    below."""
    config = one_layer_config("tiny-pre-annotated")
    weights = random_weights(config, 0)
    src, tgt = _batch(config)
    late, early = tf_build(config, weights), tf_build(config, weights)
    tf_set_precision(early, "bfloat16")
    float32_greedy = tf_impl.greedy_decode(late, src, MAX_LEN, jit_compile=False)
    float32_predicted = late.predict({"src": src, "tgt": tgt}, verbose=0)
    tf_set_precision(late, "bfloat16")
    predicted = late.predict({"src": src, "tgt": tgt}, verbose=0)
    np.testing.assert_array_equal(predicted, early.predict({"src": src, "tgt": tgt}, verbose=0))
    assert not np.array_equal(predicted, float32_predicted)
    greedy = tf_impl.greedy_decode(late, src, MAX_LEN, jit_compile=False)
    np.testing.assert_array_equal(greedy.log_probs,
                                  tf_impl.greedy_decode(early, src, MAX_LEN, jit_compile=False).log_probs)
    assert not np.array_equal(greedy.log_probs, float32_greedy.log_probs)


# -- layers frozen between training steps --------------------------------------------------------
def _freeze(framework: str, model) -> None:
    if framework == "torch":
        model.encoder.requires_grad_(False)
    else:
        model.encoder.trainable = False


@pytest.mark.parametrize("framework", [f for f, have in (("torch", HAVE_TORCH), ("tf", HAVE_TF)) if have])
def test_layers_frozen_between_training_steps_stay_frozen(framework):
    """The encoder frozen after a first training step (``requires_grad_(False)``; Keras'
    ``trainable = False``, which a traced step would not see: `tf_impl.model._structure`): the
    next step leaves every encoder weight as it was to the bit and trains the rest, as the
    unfrozen model's first step would have trained them both."""
    impl = torch_impl if framework == "torch" else tf_impl
    config = one_layer_config("tiny-pre-annotated", dropout=0.0)
    model = (torch_build if framework == "torch" else tf_build)(config, random_weights(config, 0))
    src, tgt = _batch(config)
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    optimizer = impl.training.make_optimizer(model, warmup=4)
    impl.training.train_step(model, optimizer, batch)  # traced (TF) with every variable trainable
    _freeze(framework, model)
    before = model.export_weights()
    impl.training.train_step(model, optimizer, batch)
    after = model.export_weights()
    encoder = [name for name in before if name.startswith("encoder.")]
    assert encoder and all(np.array_equal(after[name], before[name]) for name in encoder)
    assert all(not np.array_equal(after[name], before[name]) for name in before
               if name.startswith("decoder.") and not name.endswith(".key.bias"))  # key biases: no gradient


@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TF), reason="needs torch and TensorFlow")
def test_a_model_frozen_before_its_optimizer_gives_gradients_and_moments_alike():
    """The encoder frozen before `make_optimizer` (as LoRA freezes its kernels): torch_impl's
    `gradients` failed ("One of the differentiated Tensors does not require grad") where tf_impl's
    tape gives every weight's; tf_impl's `export_moments` and `import_moments` raised a bare
    KeyError for a weight its optimizer was not built with, the import after it had moved
    ``iterations``. Now both give every gradient (within float64's bound) and leave the encoder
    frozen, both export zeros for it, and tf_impl refuses moments it could not hold (not zero for
    such a weight) before it sets anything; torch_impl's optimizer holds every parameter and
    takes them."""
    config = one_layer_config("tiny-pre-annotated", dropout=0.0, dtype="float64")
    weights = random_weights(config, 0)
    src, tgt = _batch(config)
    batch = (src, tgt[:, :-1], tgt[:, 1:])
    models = {"torch": torch_build(config, weights), "tf": tf_build(config, weights)}
    impls = {"torch": torch_impl, "tf": tf_impl}
    for framework, model in models.items():
        _freeze(framework, model)
    grads = {f: impls[f].training.gradients(model, batch, training=False) for f, model in models.items()}
    assert not any(p.requires_grad for p in models["torch"].encoder.parameters())
    assert not models["tf"].encoder.trainable
    for name, grad in grads["torch"].items():
        assert_close(grad, grads["tf"][name], bound_for("float64", "torch:tf"), f"gradient of {name}")
    assert np.abs(grads["torch"]["encoder.layers.0.ffn.inner.kernel"]).max() > 0
    optimizers = {f: impls[f].training.make_optimizer(model, warmup=4) for f, model in models.items()}
    for framework, model in models.items():
        impls[framework].training.train_step(model, optimizers[framework], batch)
    moments = {f: impls[f].training.export_moments(model, optimizers[f]) for f, model in models.items()}
    for name, moment in moments["torch"].items():
        assert_close(moment, moments["tf"][name], bound_for("float64", "torch:tf"), name)
    assert not np.any(moments["tf"]["m.encoder.layers.0.ffn.inner.kernel"])
    moments["tf"]["m.encoder.layers.0.ffn.inner.kernel"][0, 0] = 1.0
    impls["torch"].training.import_moments(models["torch"], optimizers["torch"], moments["tf"], 5)
    with pytest.raises(ValueError, match=r"^moments: \['m.encoder.layers.0.ffn.inner.kernel'\] are not zero, "
                                         r"and the optimizer holds no moments for their weights"):
        tf_impl.training.import_moments(models["tf"], optimizers["tf"], moments["tf"], 5)
    assert int(optimizers["tf"].iterations.numpy()) == 1
    moments["tf"]["m.encoder.layers.0.ffn.inner.kernel"][0, 0] = 0.0
    tf_impl.training.import_moments(models["tf"], optimizers["tf"], moments["tf"], 5)
    assert int(optimizers["tf"].iterations.numpy()) == 5


# -- LoRA fine-tuning in both backends -----------------------------------------------------------
@pytest.mark.skipif(not (HAVE_TORCH and HAVE_TF), reason="needs torch and TensorFlow")
def test_lora_fine_tuning_agrees_between_backends():
    """The same LoRA fine-tuning (a wrapper on every projection in torch, ``enable_lora`` in
    Keras, kernels frozen, Adam + Noam, `parity_tests.adapters.lora_training_differences`) gives
    the same losses, LoRA factors and biases in both backends after every step, within the
    measured float32 bound: an adapter trained in one framework is the one the other trains."""
    bound = bound_for("float32", "lora-train:torch:tf")
    steps = list(lora_training_differences("tiny-pre-annotated", seed=0, steps=10))
    assert len(steps) == 10
    for step, worst in enumerate(steps, start=1):
        for what in ("loss", "factors", "biases"):
            assert worst[what] <= bound.rtol, (f"{what} after step {step}: {worst[what]:.2e} > "
                                               f"{bound.rtol:g} ({bound.reason})")
    assert steps[-1]["moved"] > 1e-3  # the factors did train
