"""Behaviour only tf_impl has: bad ids inside tf.function (InvalidArgumentError, same text) and under
XLA (NaN rows, never a wrong answer), ``keras.Model.predict`` (also compiled with XLA), arrays and
Python lists as ids, one trace for variable lengths, get_config / from_config, ``Model.export``
without a signature, and its training
pieces (the schedule in a graph and serialised, KingmaBaAdam as Algorithm 1). (One train-step
trace for every batch shape: test_training.test_train_step_learns_and_reports_the_rate_it_used.)
"""
import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import keras  # noqa: E402

import tf_impl  # noqa: E402
from parity_tests.backends import Backend  # noqa: E402
from parity_tests.matrix import case  # noqa: E402
from parity_tests.test_parity import MODE_CASES  # noqa: E402
from parity_tests.tf_support import DEVICES, build, run_logits  # noqa: E402
from shared import TransformerConfig, noam_lr  # noqa: E402
from shared import make_src_mask as np_src_mask, make_tgt_mask as np_tgt_mask  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.tolerances import FLOAT64, assert_close, bound_for  # noqa: E402
from shared.weights import random_weights  # noqa: E402
from tf_impl import training  # noqa: E402

TINY = TransformerConfig.preset("tiny")  # dropout 0.1
SRC, TGT = src_tgt(TINY, batch=2, src_len=5, tgt_len=4)
TF = Backend("tf", "eager", "/CPU:0")  # its cached models are the other test modules' too


def _with(ids, value, row=0):
    out = ids.copy()
    out[row, 1] = value
    return out


# -- bad ids in graph mode and under XLA ----------------------------------------------------------
def test_out_of_range_id_raises_in_tf_function():
    """Graph mode: the check is an Assert that guards the lookup; InvalidArgumentError, same text."""
    model = TF.cached(TINY)
    fn = tf.function(lambda s, t: model(s, t))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"):
        fn(tf.constant(_with(SRC, 13)), tf.constant(TGT))
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"tgt: expected token ids in \[0, 17\), got values in \[-5, 16\]"):
        fn(tf.constant(SRC), tf.constant(_with(TGT, -5)))
    assert np.isfinite(fn(tf.constant(SRC), tf.constant(TGT)).numpy()).all()  # the same trace, good ids


def test_length_over_max_len_raises_in_tf_function_with_unknown_length():
    model = TF.cached(TINY)
    fn = tf.function(lambda s, t: model(s, t), input_signature=[tf.TensorSpec([None, None], tf.int64)] * 2)
    with pytest.raises(tf.errors.InvalidArgumentError, match="src: expected at most max_len=64 tokens"):
        fn(np.full((2, 65), 3, np.int64), TGT)


def test_out_of_range_id_under_xla_gives_nan_rows_never_a_wrong_answer():
    """XLA compiles every Assert to a no-op and clamps gathers, so nothing can raise inside a
    jit_compile=True program: the rows with a bad id come out NaN, the others are unaffected."""
    model = TF.cached(TINY)
    fn = tf.function(lambda s, t: model(s, t), jit_compile=True)
    good = fn(tf.constant(SRC), tf.constant(TGT)).numpy()
    for src, tgt in [(_with(SRC, 13), TGT), (_with(SRC, -1), TGT), (SRC, _with(TGT, 1000))]:
        out = fn(tf.constant(src), tf.constant(tgt)).numpy()
        assert np.isnan(out[0]).all()
        np.testing.assert_array_equal(out[1], good[1])


def test_python_lists_and_arrays_are_accepted_as_ids():
    model = TF.cached(TINY)
    want = run_logits(model, SRC, TGT)
    np.testing.assert_array_equal(np.asarray(model(SRC.tolist(), TGT.tolist())), want)
    np.testing.assert_array_equal(np.asarray(model(SRC, TGT)), want)


def test_call_needs_tgt():
    with pytest.raises(ValueError, match="tgt: required"):
        TF.cached(TINY)(SRC)


def test_the_generator_builds_a_functional_model_and_checks_its_input():
    """The generator's check (`shared.checks.check_hidden`, before Keras casts) reads a
    KerasTensor's shape too: ``keras.Input`` into it builds a model that computes as the layer;
    so does a graph traced for an input of unknown rank."""
    model = TF.cached(TINY)
    hidden = keras.Input(shape=(None, TINY.d_model))
    functional = keras.Model(hidden, model.generator(hidden))
    x = np.random.default_rng(0).standard_normal((2, 3, TINY.d_model)).astype(np.float32)
    np.testing.assert_array_equal(np.asarray(functional(x)), np.asarray(model.generator(x)))
    any_rank = tf.function(model.generator, input_signature=[tf.TensorSpec(None, tf.float32)])
    np.testing.assert_array_equal(np.asarray(any_rank(x)), np.asarray(model.generator(x)))
    with pytest.raises(ValueError, match=rf"^x: expected hidden states of shape \(\.\.\., {TINY.d_model}\), "
                                         rf"got \(None, None, {TINY.d_model + 1}\)$"):
        model.generator(keras.Input(shape=(None, TINY.d_model + 1)))


def test_training_is_a_flag_or_keras_own_values():
    """Before: ``training="no"`` (a true string) turned dropout on, in the model and its layers.
    Keras' own values stay: None (the calling context's) and a bool tensor."""
    model = TF.cached(TINY)
    x = tf.ones((2, 5, TINY.d_model))
    for call in (lambda t: model(SRC, TGT, training=t), lambda t: model.encode(SRC, training=t),
                 lambda t: model.encoder.layers[0](x, tf.ones((2, 1, 1, 5), bool), training=t),
                 lambda t: model.encoder.layers[0].ffn(x, training=t)):
        with pytest.raises(TypeError, match="training: expected True or False, got 'no' \\(str\\)"):
            call("no")
        for keras_value in (None, tf.constant(False), np.False_):
            call(keras_value)
    memory = model.encode(SRC)
    with pytest.raises(TypeError, match="training: expected True or False, got 1 \\(int\\)"):
        model.decode(TGT, memory, tf.constant(np_src_mask(SRC, TINY.pad_id)), training=1)
    want = np.asarray(model(SRC, TGT))
    np.testing.assert_array_equal(np.asarray(model(SRC, TGT, training=tf.constant(False))), want)


@pytest.mark.filterwarnings("ignore:Layer .* does not support masking:UserWarning")  # Keras', as it should
def test_a_keras_mask_on_the_input_is_not_the_encoder_s_mask():
    """The encoder's layers took their mask as ``mask``, which Keras fills from the input's own
    mask (an Embedding's ``mask_zero``) when it is None: the padding of that mask was attended
    away where None (all keys) was asked, and ``layer(x, None)`` failed with "got multiple values
    for argument 'mask'". Masks come from the arguments alone (docs/design.md, convention 2)."""
    model = TF.cached(TINY)
    ids = np.array([[3, 4, 5, 0, 0], [3, 4, 0, 0, 0]])
    masked = keras.layers.Embedding(TINY.src_vocab, TINY.d_model, mask_zero=True)(ids)
    plain = tf.constant(masked.numpy())  # the same values without the mask
    assert getattr(masked, "_keras_mask", None) is not None
    for layer in (model.encoder.layers[0], model.encoder):
        want = np.asarray(layer(plain, None))
        np.testing.assert_array_equal(np.asarray(layer(masked, None)), want)
        np.testing.assert_array_equal(np.asarray(layer(masked, src_mask=None)), want)


# -- predict --------------------------------------------------------------------------------------
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("variant, shape, dtype", MODE_CASES)
def test_predict_matches_reference_and_eager(variant, shape, dtype, device):
    config, src, tgt = case(variant, shape, dtype)
    ref = R.forward(random_weights(config, 0), config, src, tgt)
    model = TF.cached(config)
    bound = bound_for(dtype, "tf:reference")
    predicted = run_logits(model, src, tgt, device, "predict")
    assert predicted.dtype == config.dtype
    assert_close(predicted, ref, bound, "predict logits")
    assert_close(predicted, Backend("tf", "eager", device).logits(model, src, tgt), bound,
                 "predict vs eager logits")


def test_predict_accepts_tuple_dict_and_batches():
    config = TINY.replace(dtype="float64")
    model = TF.cached(config)
    src, tgt = src_tgt(config, batch=5, src_len=6, tgt_len=4)
    want = run_logits(model, src, tgt)
    bound = bound_for("float64", "tf:reference")
    assert_close(model.predict((src, tgt), verbose=0), want, bound, "tuple")
    assert_close(model.predict({"src": src, "tgt": tgt}, batch_size=2, verbose=0), want, bound, "dict")
    masks = {"src": src, "tgt": tgt, "src_mask": np_src_mask(src, 0), "tgt_mask": np_tgt_mask(tgt, 0)}
    assert_close(model.predict(masks, batch_size=2, verbose=0), want, bound, "dict with masks")
    # a mask packed in x and given as a keyword too: the keyword was dropped without a word
    keyword = np_src_mask(src, 0)
    assert_close(model((src, tgt), src_mask=keyword).numpy(), want, bound, "tuple, keyword mask")
    for x in ((src, tgt, masks["src_mask"]), masks):
        with pytest.raises(ValueError, match="src_mask: given twice, in x and as a keyword; give one"):
            model(x, src_mask=keyword)
    with pytest.raises(ValueError, match="tgt_mask: given twice"):
        model(masks, tgt_mask=masks["tgt_mask"])


def test_predict_compiled_with_xla_and_checks_ids_eagerly():
    model = build(TINY)  # compile() changes the model: a fresh one
    src, tgt = src_tgt(TINY, batch=3, src_len=6, tgt_len=5)
    want = run_logits(model, src, tgt)
    model.compile(jit_compile=True)
    assert_close(model.predict((src, tgt), verbose=0), want, bound_for("float32", "tf:reference"),
                 "xla predict")
    with pytest.raises(ValueError, match=r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"):
        model.predict((_with(SRC, 13), TGT), verbose=0)
    with pytest.raises(ValueError, match=r"tgt: expected token ids in \[0, 17\)"):
        model.predict({"src": SRC, "tgt": _with(TGT, 17)}, verbose=0)


def test_keras_training_and_evaluation_check_ids_before_an_xla_step():
    """Before: ``fit`` compiled with XLA (Keras' ``jit_compile="auto"`` wherever it sees a GPU)
    took an id out of range as a NaN embedding, and one step on the NaN loss made every weight
    NaN, without a word; ``evaluate`` returned a NaN loss. Each of Keras' functions now refuses
    the batch first (as `predict`), and the model and its optimizer are untouched."""
    model = build(TINY)
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    before = [v.numpy() for v in model.variables]
    bad = (_with(SRC, 13), TGT)
    calls = {"fit": lambda: model.fit(bad, TGT, verbose=0),
             "fit, validation_data": lambda: model.fit((SRC, TGT), TGT, validation_data=(bad, TGT), verbose=0),
             "evaluate": lambda: model.evaluate(bad, TGT, verbose=0),
             "train_on_batch": lambda: model.train_on_batch(bad, TGT),
             "test_on_batch": lambda: model.test_on_batch(bad, TGT),
             "predict_on_batch": lambda: model.predict_on_batch(bad)}
    for name, call in calls.items():
        with pytest.raises(ValueError, match=r"^src: expected token ids in \[0, 13\), got values in \[0, 13\]$"):
            call()
    for want, variable in zip(before, model.variables):
        np.testing.assert_array_equal(variable.numpy(), want, variable.path)
    assert int(model.optimizer.iterations) == 0


class _Batches(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` of the given batches."""

    def __init__(self, batches, **kwargs):
        super().__init__(**kwargs)
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, index):
        return self.batches[index]


def test_keras_functions_check_every_batch_of_a_pipeline_before_an_xla_step():
    """Keras' input pipelines cannot be checked before Keras iterates them, so each batch is
    checked before a step takes it: a ``tf.data.Dataset`` in its own pipeline (graph mode, never
    XLA), raising ``InvalidArgumentError`` with the eager message when it yields a batch that
    would embed as NaN under XLA (an id out of range; a source over ``max_len`` where the length is
    known only at run time); a Python generator's and a ``PyDataset``'s batches with NumPy as they
    are made, raising the eager ``ValueError`` (a generator's batch after Keras' first few, in
    TensorFlow's ``InvalidArgumentError``). Before: ``fit`` trained on the NaN loss and made every
    weight NaN without a word; ``evaluate`` and ``predict`` returned NaN. A good dataset's batches
    reach the model unchanged, structure and values. Masks are checked too: a dataset's mask of
    another batch is named as eagerly (XLA said "Incompatible shapes"), and arrays' masks are
    checked before anything runs."""
    model = build(TINY.replace(n_encoder_layers=1, n_decoder_layers=1))  # one layer: half the tracing
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=True)
    before = [v.numpy() for v in model.variables]
    ids = tf.TensorSpec([None, None], tf.int64)  # sizes known only at run time
    too_long = np.ones((2, TINY.max_len + 1), np.int64)
    bad_id = r"src: expected token ids in \[0, 13\), got values in \[0, 13\]"
    long = rf"src: expected at most max_len={TINY.max_len} tokens, got {TINY.max_len + 1}"
    bad, good = ((_with(SRC, 13), TGT), TGT), ((SRC, TGT), TGT)
    unknown = tf.data.Dataset.from_generator(lambda: iter([((too_long, TGT), TGT)]), output_signature=((ids, ids), ids))
    slices = tf.data.Dataset.from_tensor_slices(bad).batch(2)
    masked = tf.data.Dataset.from_tensor_slices(({"src": SRC, "tgt": TGT}, TGT)).batch(2).map(
        lambda x, y: ({**x, "src_mask": tf.ones((3, 1, 1, 5), tf.bool)}, y))  # batch 3 against 2

    def fit(*args):
        return model.fit(*args, shuffle=False, verbose=0)

    def evaluate(*args):
        return model.evaluate(*args, verbose=0)

    def predict(x, *_):
        return model.predict(x, verbose=0)

    pipelines = {  # name: (error, message, the arguments of fit and evaluate: (x,) or (x, y), the calls)
        "dataset": (tf.errors.InvalidArgumentError, bad_id, lambda: (slices,), (fit, evaluate, predict)),
        "dataset of unknown sizes": (tf.errors.InvalidArgumentError, long, lambda: (unknown,), (evaluate, predict)),
        "dataset with a mask": (tf.errors.InvalidArgumentError, r"src_mask: expected a mask broadcastable to "
                                r"\(batch\|1, .* got shape \(3, 1, 1, 5\)", lambda: (masked,), (evaluate,)),
        "generator": (ValueError, bad_id, lambda: ((batch for batch in [bad, good]),), (fit, evaluate, predict)),
        "PyDataset": (ValueError, bad_id, lambda: (_Batches([bad, good]),), (fit, evaluate, predict)),
        "PyDataset, 2 workers": (ValueError, long, lambda: (_Batches([((too_long, TGT), TGT)], workers=2),), (fit,)),
        "arrays with a mask": (ValueError, r"src_mask: expected a mask broadcastable to",
                               lambda: ({"src": SRC, "tgt": TGT, "src_mask": np.ones((2, 1, 1, 4), bool)}, TGT),
                               (fit, evaluate, predict))}
    # fit takes the same path as evaluate (`_checked`), and a traced fit costs seconds: one a kind
    for error, message, arguments, calls in pipelines.values():
        for call in calls:
            with pytest.raises(error, match=message):
                call(*arguments())
    for want, variable in zip(before, model.variables):
        np.testing.assert_array_equal(variable.numpy(), want, variable.path)
    assert int(model.optimizer.iterations) == 0
    later = (batch for batch in [((SRC, TGT),)] * 3 + [((_with(SRC, 13), TGT),)])  # past Keras' first reads
    with pytest.raises(tf.errors.InvalidArgumentError, match=bad_id):
        model.predict(later, verbose=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=bad_id):  # after an epoch's steps
        model.fit((SRC, TGT), TGT, validation_data=slices, verbose=0)
    assert all(np.isfinite(variable.numpy()).all() for variable in model.variables)
    want = model.predict((SRC, TGT), verbose=0)
    for x in ((SRC, TGT), {"src": SRC, "tgt": TGT}):  # x alone: a dict, or a tuple in a 1-tuple
        dataset = tf.data.Dataset.from_tensor_slices(x if isinstance(x, dict) else (x,)).batch(2)
        np.testing.assert_array_equal(model.predict(dataset, verbose=0), want, type(x).__name__)


def test_keras_sparse_cross_entropy_targets_are_checked_before_an_xla_step():
    """Keras' sparse cross-entropy gathers each target's logit, and under XLA a label out of range
    comes out NaN, as an id does: `fit` on torch's ``-100`` labels (its cross-entropy's default
    ignore_index) made every weight NaN without a word. Where the compiled loss is that one (the
    class, its function or its name), the targets are checked with the ids, in every path Keras
    takes them (arrays, positional or keyword, validation data, a dataset, a generator): values
    in ``[0, tgt_vocab)`` or the loss's ``ignore_class``. Another loss's labels are its own."""
    config = TINY.replace(n_encoder_layers=1, n_decoder_layers=1)
    src, tgt = src_tgt(config, batch=4, src_len=5, tgt_len=4)
    y = np.where(tgt == config.pad_id, -100, tgt)  # as a torch pipeline labels padding
    message = (r"y: expected target ids in \[0, 17\) for the loss \(SparseCategoricalCrossentropy with "
               r"ignore_class={}\), got values in \[{}, {}\]")
    none = message.format("None", -100, int(tgt.max()))
    sparse = keras.losses.SparseCategoricalCrossentropy
    for loss in (sparse(from_logits=True), "sparse_categorical_crossentropy",
                 keras.losses.sparse_categorical_crossentropy):
        model = build(config)
        model.compile(optimizer="adam", loss=loss, jit_compile=True)
        before = [v.numpy() for v in model.variables]
        for call in (lambda: model.fit((src, tgt), y, verbose=0), lambda: model.fit(x=(src, tgt), y=y, verbose=0),
                     lambda: model.evaluate((src, tgt), y, verbose=0), lambda: model.train_on_batch((src, tgt), y),
                     lambda: model.test_on_batch((src, tgt), y=y),
                     lambda: model.fit((src, tgt), tgt, validation_data=((src, tgt), y), verbose=0),
                     lambda: model.fit((batch for batch in [((src, tgt), y)]), shuffle=False, verbose=0)):
            with pytest.raises(ValueError, match=none):
                call()
        assert int(model.optimizer.iterations) == 0
        for want, variable in zip(before, model.variables):
            np.testing.assert_array_equal(variable.numpy(), want, variable.path)
    dataset = tf.data.Dataset.from_tensor_slices(((src, tgt), np.where(tgt > 15, 99, tgt))).batch(4)
    with pytest.raises(tf.errors.InvalidArgumentError, match=message.format("None", 0, 99)):
        model.evaluate(dataset, verbose=0)  # checked in the dataset's own graph, before the XLA step
    # The loss told to ignore -100 takes it, and another loss gets it as given: without XLA, whose
    # compile is most of this test's time, and nothing to show about what passes a check.
    model.compile(loss=sparse(from_logits=True, ignore_class=-100), jit_compile=False)
    bad = y.copy()
    bad[0, 1] = 99
    with pytest.raises(ValueError, match=message.format(-100, bad[bad != -100].min(), 99)):
        model.evaluate((src, tgt), bad, verbose=0)
    assert np.isfinite(model.evaluate((src, tgt), y, verbose=0))
    model.compile(loss=lambda t, z: tf.reduce_mean(z), jit_compile=False)  # its labels are its own
    assert np.isfinite(model.evaluate((src, tgt), y, verbose=0))


# -- tf.function and Keras serialisation ----------------------------------------------------------
def test_variable_lengths_in_one_function_need_no_retrace_per_batch():
    config = TINY.replace(dtype="float64")
    model = TF.cached(config)
    fn = tf.function(lambda s, t: model(s, t), input_signature=[tf.TensorSpec([None, None], tf.int64)] * 2)
    for b, s, t in [(1, 3, 2), (3, 7, 5)]:
        src, tgt = src_tgt(config, batch=b, src_len=s, tgt_len=t)
        assert_close(fn(src, tgt).numpy(), R.forward(random_weights(config, 0), config, src, tgt),
                     bound_for("float64", "tf:reference"), f"{(b, s, t)}")
    assert fn.experimental_get_tracing_count() == 1


@pytest.mark.parametrize("style", ["annotated", "standard"])
def test_a_graph_computes_the_same_whatever_sizes_it_was_traced_for(style):
    """A tf.function traced for the batch's sizes and one traced for unknown sizes (as Keras'
    predict and a ``reduce_retracing`` function trace after a few shapes) compute every traced
    tensor of the forward pass bit for bit alike, and so ``predict`` gives a batch the same logits
    whatever it predicted before. Before: the annotated norm took ``d_model - 1`` from the tensor's
    shape, a constant in a graph of known sizes and a division in one of unknown sizes, so one batch
    predicted after others of other shapes got other logits (1.1e-6 apart, tiny)."""
    config = TINY.replace(dropout=0.0, norm_style=style)
    model = build(config)
    fn = tf.function(lambda s, t: model(s, t, return_trace=True))
    known = fn.get_concrete_function(tf.TensorSpec(SRC.shape, tf.int64), tf.TensorSpec(TGT.shape, tf.int64))
    unknown = fn.get_concrete_function(*[tf.TensorSpec([None, None], tf.int64)] * 2)
    (logits, trace), (logits_, trace_) = (f(tf.constant(SRC), tf.constant(TGT)) for f in (known, unknown))
    np.testing.assert_array_equal(logits.numpy(), logits_.numpy())
    for name, value in trace.items():
        np.testing.assert_array_equal(value.numpy(), trace_[name].numpy(), err_msg=name)
    first = model.predict((SRC, TGT), verbose=0)
    for b, s, t in [(3, 7, 5), (1, 2, 6)]:  # other shapes: Keras' predict function relaxes its sizes
        model.predict(src_tgt(config, batch=b, src_len=s, tgt_len=t), verbose=0)
    np.testing.assert_array_equal(model.predict((SRC, TGT), verbose=0), first)


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
    # Keras' dtype was taken and ignored (float32 variables under a float64 policy); a dict that is
    # no get_config() a bare KeyError or TypeError
    with pytest.raises(TypeError, match=r"^dtype: the model's is config.dtype \('float64'\), .* got dtype='float32'$"):
        tf_impl.Transformer(config, dtype="float32")
    for bad, got in ((None, "NoneType"), ({"name": "twin"}, r"dict with keys \['name'\]")):
        with pytest.raises(ValueError, match=rf"^config: expected the dict of get_config\(\), .* got {got}$"):
            tf_impl.Transformer.from_config(bad)


def test_copies_and_keras_files_keep_the_precision(tmp_path):
    """Before: a copy, a pickle, a ``.keras`` file and ``clone_model`` of a bfloat16 model were
    float32 models (torch_impl's copies keep it); get_config holds it now."""
    import copy
    import pickle
    from tf_impl.precision import set_precision
    model = tf_impl.Transformer(TINY.replace(dropout=0.0))
    model.import_weights(random_weights(TINY, 0))
    set_precision(model, "bfloat16")
    want = model(SRC, TGT).numpy()
    model.save(tmp_path / "m.keras")
    for copied in (copy.deepcopy(model), pickle.loads(pickle.dumps(model)),
                   keras.models.load_model(tmp_path / "m.keras")):
        assert copied.precision == "bfloat16"
        np.testing.assert_array_equal(copied(SRC, TGT).numpy(), want)
    assert keras.models.clone_model(model).precision == "bfloat16"  # the same model, new weights
    older = {"name": "old", "config": TINY.to_dict()}  # a get_config() of before: float32
    assert getattr(tf_impl.Transformer.from_config(older), "precision", "float32") == "float32"


def test_keras_export_serves_the_forward_pass_of_any_shape(tmp_path):
    """``model.export(path)`` needs no ``input_signature`` (Keras would infer one from a first
    call's shapes, which a model built at construction never records): the artifact's
    ``serve(src, tgt)`` gives the eager logits, for batches and lengths other than any seen."""
    config = TINY.replace(dtype="float64", n_encoder_layers=1, n_decoder_layers=1)  # a cheaper trace
    model = build(config)
    model.export(str(tmp_path / "served"), verbose=False)
    served = tf.saved_model.load(str(tmp_path / "served"))
    for batch, src_len, tgt_len in ((2, 5, 4), (3, 9, 1)):
        src, tgt = src_tgt(config, batch=batch, src_len=src_len, tgt_len=tgt_len, seed=batch)
        got = served.serve(tf.constant(src, tf.int64), tf.constant(tgt, tf.int64)).numpy()
        assert_close(got, model(src, tgt).numpy(), FLOAT64, f"served logits {src.shape} {tgt.shape}")


# -- training: Keras' schedule, optimizer and compiled step ---------------------------------------
def test_schedule_is_exact_in_a_graph_and_serialises():
    schedule = training.noam_schedule(512, 4000, 1.0)
    steps = np.arange(0, 20000)
    rates = tf.function(schedule)(tf.constant(steps)).numpy()
    assert rates.dtype == np.float64 and (rates == noam_lr(steps + 1, 512, 4000)).all()  # bit for bit
    again = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(again) is training.NoamSchedule and again.get_config() == schedule.get_config()
    for start_step in (-1, 2**53, 10**5000):  # the next step, start_step + 1, past noam_lr's 2**53
        with pytest.raises(ValueError, match=r"^start_step: expected an int in \[0, 2\*\*53 - 1\]"):
            training.noam_schedule(16, 10, start_step=start_step)
    assert training.noam_schedule(16, 10, start_step=2**53 - 1).start_step == 2**53 - 1


def test_kingma_ba_adam_refuses_amsgrad():
    with pytest.raises(ValueError, match="amsgrad: not supported"):
        training.KingmaBaAdam(amsgrad=True)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_adam_update_is_algorithm_1(dtype):
    """KingmaBaAdam against Kingma & Ba's Algorithm 1 written out in float64 NumPy (eps added to
    the bias-corrected sqrt(v_hat)), over gradients from large to near eps and zero."""
    rng = np.random.default_rng(0)
    start = rng.normal(size=(4, 5))
    grads = [rng.normal(size=(4, 5)) * 10.0 ** rng.integers(-12, 1, size=(4, 5)) for _ in range(30)]
    grads[3][0] = 0.0
    variable = keras.Variable(start.astype(dtype))
    optimizer = training.KingmaBaAdam(learning_rate=training.noam_schedule(16, 10, 0.1),
                                      beta_1=0.9, beta_2=0.98, epsilon=1e-9)
    w, m, v = start.copy(), np.zeros_like(start), np.zeros_like(start)
    for t, g in enumerate(grads, start=1):
        optimizer.apply_gradients([(tf.constant(g.astype(dtype)), variable)])
        m = 0.9 * m + 0.1 * g
        v = 0.98 * v + 0.02 * g * g
        lr = noam_lr(t, 16, 10, 0.1)
        w = w - lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.98 ** t)) + 1e-9)
    bound = FLOAT64 if dtype == "float64" else bound_for(dtype, "tf:reference")
    assert_close(variable.numpy(), w, bound, "variable after 30 Adam steps")
