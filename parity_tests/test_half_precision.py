"""Half-precision inference (bfloat16, float16; `shared.precision`) in both backends: the forward
pass, every intermediate and the cached decoding steps against the float64 oracle within the
measured bounds of `shared.tolerances` (grown with the model's layer-norm conditioning,
`shared.conditioning`); decoding's search in float32 on the half logits, cached equal to
recompute, and the half precision really running (its weights cast once, its cache half). torch on
the CPU and, where present, CUDA; TF on the CPU. One tiny model, to stay fast, and two of the
convention-15 variants whose norms are ill-conditioned."""
import numpy as np
import pytest

from shared import TransformerConfig, reference
from shared.batches import src_tgt
from shared.conditioning import attention_scores, norm_conditioning
from shared.masks import padding_id
from shared.tolerances import assert_close, bound_for, max_rel_diff, trace_bounds
from shared.weights import random_weights

from . import variant_configs as VC
from .decoding_backends import ModelBackend

CONFIG = TransformerConfig.preset("tiny", dropout=0.0)
HALF = ("bfloat16", "float16")


@pytest.fixture(params=["torch", "torch-cuda", "tf-eager", "tf-xla"])
def be(request) -> ModelBackend:
    pytest.importorskip("torch" if request.param.startswith("torch") else "tensorflow")
    if request.param == "torch-cuda":
        import torch
        if not torch.cuda.is_available():
            pytest.skip("no CUDA device")
    return ModelBackend(request.param)


@pytest.fixture(scope="module")
def case():
    weights = random_weights(CONFIG, 0)
    src, tgt = src_tgt(CONFIG, batch=4, src_len=12, tgt_len=10, seed=0, src_lengths=[12, 9, 4, 0],
                       tgt_lengths=[10] * 4)  # targets without padding: cached steps = full pass
    f64 = CONFIG.replace(dtype="float64")
    logits, trace = reference.forward({k: v.astype(np.float64) for k, v in weights.items()}, f64, src, tgt,
                                      return_trace=True)
    return weights, src, tgt, logits, trace


def set_precision(be: ModelBackend, model, precision: str) -> str:
    import importlib
    return importlib.import_module(f"{be.framework}_impl.precision").set_precision(model, precision)


@pytest.fixture
def half_model():
    """``half_model(be, weights, precision[, config])``: the backend's model of CONFIG in ``precision``; its
    precision is restored after the test (the TF harness shares its models between tests)."""
    made = []

    def make(be: ModelBackend, weights, precision: str, config: TransformerConfig = CONFIG):
        model = be.build(config, weights)
        made.append((be, model, set_precision(be, model, precision)))
        return model
    yield make
    for be, model, previous in reversed(made):
        set_precision(be, model, previous)


def dtype_name(x) -> str:
    """``x``'s dtype as NumPy names it (``torch.bfloat16`` and TF's ``<dtype: 'bfloat16'>`` alike)."""
    return str(x.dtype).replace("torch.", "").replace("<dtype: '", "").rstrip("'>")


def as_f64(be: ModelBackend, x) -> np.ndarray:
    return be.numpy(x).astype(np.float64)  # bfloat16 widened exactly on the way


def check_against_the_oracle(be: ModelBackend, model, config: TransformerConfig, weights, src, tgt,
                             precision: str) -> dict:
    """The forward pass (traced and not) and the cached steps of ``model`` against the oracle,
    each tensor within its bound grown by the conditioning of the norms and the scores of the
    attentions before it; the bounds."""
    ref_logits, ref_trace = reference.forward({k: v.astype(np.float64) for k, v in weights.items()},
                                              config.replace(dtype="float64"), src, tgt, return_trace=True)
    bounds = trace_bounds(bound_for(precision, f"{be.framework}:reference"),
                          norm_conditioning(config, weights, ref_trace), ref_trace,
                          attention_scores(config, weights, ref_trace))
    s, t = be.tensor(src), be.tensor(tgt)
    with be.no_grad():
        logits, trace = model(s, t, return_trace=True)
        assert dtype_name(logits) == precision  # the generator's product ran in half
        for name, expected in ref_trace.items():
            assert_close(as_f64(be, trace[name]), expected, bounds[name], name)
        # untraced (torch: on the kept half weights, test_inference_forward_torch_only.py)
        assert_close(as_f64(be, model(s, t)), ref_logits, bounds["logits"], "logits, untraced")
        cache = model.init_cache(model.encode(s), be.make_src_mask(src, padding_id(config)), tgt.shape[1])
        assert dtype_name(cache.layers[0].self_key) == precision  # the cache is half
        steps = []
        for i in range(tgt.shape[1]):
            out, cache = model.decode_step(t[:, i], cache)
            steps.append(as_f64(be, out))
    steps = np.stack(steps, axis=1)
    assert_close(steps, ref_logits, bounds["logits"], f"{precision} cached steps' logits")
    # Far from float32's agreement: half precision really ran (not a silent float32 pass).
    assert max_rel_diff(steps, ref_logits) > 10 * bound_for("float32", f"{be.framework}:reference").rtol
    return bounds


@pytest.mark.parametrize("precision", HALF)
def test_forward_and_cached_steps_against_the_oracle(be, precision, case, half_model):
    weights, src, tgt = case[:3]
    check_against_the_oracle(be, half_model(be, weights, precision), CONFIG, weights, src, tgt, precision)


@pytest.mark.parametrize("variant", ["no-pad-mask", "start-pad"])
@pytest.mark.parametrize("precision", HALF)
def test_ill_conditioned_models_within_the_grown_bounds(be, precision, variant, half_model):
    """Models of 8 features whose final norm sees rows of little spread (conditioning 6.9 and 5.2,
    seed 0): the half products' rounding comes out of that norm magnified, beyond the bounds as
    written (no-pad-mask: 4.8e-2 bfloat16 torch, 9.5e-3 float16 TF, benchmarks/half_precision.py
    parity) and within them grown by conditioning / 1.5 (`shared.tolerances.HALF_CONDITIONING`)."""
    if be.name == "tf-xla":
        pytest.skip("the eager pass covers TF's products; XLA compiles each variant for seconds")
    config = VC.config(variant, "float32")
    weights = random_weights(config, 0)
    src, tgt = src_tgt(config, batch=4, src_len=10, tgt_len=10, seed=0, src_lengths=[10, 7, 3, 0],
                       tgt_lengths=[10] * 4)
    model = half_model(be, weights, precision, config)
    bounds = check_against_the_oracle(be, model, config, weights, src, tgt, precision)
    written = bound_for(precision, f"{be.framework}:reference").rtol
    assert bounds["logits"].rtol > 3 * written  # the growth this test is about did happen


@pytest.mark.parametrize("layout", ["dense", "packed"])
def test_torch_bfloat16_decoding_in_either_kernel_layout(layout, case, half_model, monkeypatch):
    """torch_impl's bfloat16 decoding on the CPU multiplies oneDNN's packed bfloat16 kernels where
    the CPU has bfloat16 instructions, addmm's dense ones elsewhere (`torch_impl.cache.step_layout`):
    in each layout, decoding's encoder pass and cached steps agree with the oracle within the
    bfloat16 bound, and the layout asked for is the one that ran."""
    torch = pytest.importorskip("torch")
    import torch_impl.model
    from torch_impl.cache import DENSE, PACKED
    if layout == "packed" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        pytest.skip("this CPU has no bfloat16 instructions for oneDNN")
    monkeypatch.setattr(torch_impl.model, "step_layout",
                        lambda rows, device, dtype: PACKED if layout == "packed" else DENSE)
    weights, src, tgt, ref_logits, _ = case
    be = ModelBackend("torch")
    model = half_model(be, weights, "bfloat16")
    s, t = be.tensor(src), be.tensor(tgt)
    steps = []
    with torch.inference_mode(), torch_impl.precision.autocast(model):
        mask = model._src_mask(s, None)
        cache = model._init_cache(model._encode_for_decoding(s, mask), mask, tgt.shape[1], 1)
        assert cache.layers[0].weights.qkv_kernel.is_mkldnn == (layout == "packed")
        assert cache.layers[0].weights.qkv_kernel.dtype == torch.bfloat16
        for i in range(tgt.shape[1]):
            out, cache = model._decode_step(t[:, i], cache)
            steps.append(as_f64(be, out))
    assert_close(np.stack(steps, axis=1), ref_logits, bound_for("bfloat16", "torch:reference"),
                 f"bfloat16 cached steps, {layout} kernels")


@pytest.mark.parametrize("precision", HALF)
def test_half_decoding_searches_in_float32_and_cached_equals_recompute(be, precision, case, half_model):
    weights, src = case[0], case[1]
    model = half_model(be, weights, precision)
    if be.framework == "torch":
        src = be.tensor(src)
    cached = be.greedy_decode(model, src, 12)
    assert cached.log_probs.dtype == np.float32  # the search ran on widened logits
    beams = be.beam_search(model, src, 12, 3, 0.6)
    assert beams.scores.dtype == np.float32
    if be.name == "tf-xla":
        return  # use_cache=False is the same under XLA's compiled step; eager covers it
    recomputed = be.greedy_decode(model, src, 12, use_cache=False)
    np.testing.assert_array_equal(cached.tokens, recomputed.tokens)
    np.testing.assert_allclose(cached.log_probs, recomputed.log_probs,
                               atol=bound_for(precision, f"{be.framework}:reference").rtol)


@pytest.mark.parametrize("precision", HALF)
def test_torch_and_tf_agree_in_half_precision(precision, case, half_model):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    weights, src, tgt = case[:3]
    t_be, f_be = ModelBackend("torch"), ModelBackend("tf-eager")
    t_model, f_model = half_model(t_be, weights, precision), half_model(f_be, weights, precision)
    with t_be.no_grad():
        t_logits = as_f64(t_be, t_model(t_be.tensor(src), t_be.tensor(tgt)))
    f_logits = as_f64(f_be, f_model(src, tgt))
    assert_close(t_logits, f_logits, bound_for(precision, "torch:tf"), f"{precision} logits torch vs tf")


@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_the_step_weights_are_cast_once_and_float32_comes_back(framework, case):
    """Switching precision changes what a decode computes, in both directions, and the model's own
    weights never leave float32."""
    be = ModelBackend("torch" if framework == "torch" else "tf-eager")
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    weights, src = case[0], case[1]
    model = be.build(CONFIG, weights)
    first = be.greedy_decode(model, be.src(src), 12).log_probs
    previous = set_precision(be, model, "bfloat16")
    try:
        half = be.greedy_decode(model, be.src(src), 12).log_probs
    finally:
        set_precision(be, model, previous)
    again = be.greedy_decode(model, be.src(src), 12).log_probs
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, half)
    assert {w.dtype for w in model.export_weights().values()} == {np.dtype("float32")}


@pytest.mark.parametrize("framework", ["torch", "tf"])
@pytest.mark.parametrize("precision", HALF)
def test_the_pass_in_parts_is_the_forward_pass_and_traces_score_in_float32(framework, precision, case,
                                                                           half_model):
    """``generator(decode(encode(src)))`` is the forward pass to the bit (docs/design.md): torch_impl's
    generator called on its own computed in float32 (1.5e-2 of bfloat16's logits away). A trace's
    attention weights are float32 (scores from the half query and key): torch_impl's float16
    traces computed them in float16, where large scores overflowed and the untraced pass's did not."""
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    weights, src, tgt = case[:3]
    be = ModelBackend("torch" if framework == "torch" else "tf-eager")
    model = half_model(be, weights, precision)
    s, t = be.tensor(src), be.tensor(tgt)
    mask = be.tensor(reference.make_src_mask(src, CONFIG.pad_id))
    with be.no_grad():
        whole = model(s, t)
        parts = model.generator(model.decode(t, model.encode(s), mask))
        _, trace = model(s, t, return_trace=True)
    assert dtype_name(parts) == dtype_name(whole) == precision
    np.testing.assert_array_equal(as_f64(be, parts), as_f64(be, whole))
    assert dtype_name(trace["encoder.layers.0.self_attn.weights"]) == "float32"


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # the quantizers'
@pytest.mark.parametrize("framework", ["torch", "tf"])
def test_a_quantized_model_keeps_its_precision(framework, case):
    """Before: Keras' policy set over a quantized Dense dropped the quantization, its int8 values
    read as the weights (the logits 1.46 of their scale from the oracle's); torch's quantized
    modules failed in autocast ("expected scalar type Float but found BFloat16")."""
    pytest.importorskip("torch" if framework == "torch" else "tensorflow")
    be = ModelBackend("torch" if framework == "torch" else "tf-eager")
    if framework == "torch":
        import torch
        model = torch.ao.quantization.quantize_dynamic(be.build(CONFIG, case[0]), {torch.nn.Linear},
                                                       dtype=torch.qint8)
    else:  # a model of its own: the harness's one model of CONFIG is shared, and this one stays int8
        import tf_impl
        from .adapters import keras_int8
        model = tf_impl.Transformer(CONFIG)
        model.import_weights({name: value.astype(CONFIG.dtype) for name, value in case[0].items()})
        keras_int8(model)
    for precision in HALF + ("float32",):
        with pytest.raises(ValueError, match=r"^model: expected no quantized projection, got "
                                             r"encoder.layers.0.self_attn.query, .* \(3\d in all\): a "
                                             r"quantized kernel computes in the dtype it was quantized for"):
            set_precision(be, model, precision)
    assert getattr(model, "precision", "float32") == "float32"


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")  # the quantizers'
def test_torch_names_a_half_precision_set_before_its_projections_were_quantized(case):
    """The other order than the test above's: ``set_precision``, then ``quantize_dynamic`` (which
    copies the model, its precision too). torch's quantized modules take float32 alone: the
    forward pass and decoding failed in autocast ("expected scalar type Float but found
    BFloat16"). They now name the cause and the way out, which works. (Keras computes int8 kernels
    in a mixed policy, so tf_impl runs such a model.)"""
    torch = pytest.importorskip("torch")
    import torch_impl
    be = ModelBackend("torch")
    weights, src, tgt = case[:3]
    src, tgt = torch.as_tensor(src), torch.as_tensor(tgt)
    model = be.build(CONFIG, weights)
    try:
        for precision in HALF:
            set_precision(be, model, precision)
            quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
            refusal = (rf"^model: expected precision 'float32' for quantized projections, got '{precision}' "
                       r"with encoder.layers.0.self_attn.query, .* \(3\d in all\) quantized: torch's quantized "
                       r"modules compute in float32 alone; quantize a float32 model")
            for call in (lambda: quantized(src, tgt), lambda: quantized.encode(src),
                         lambda: torch_impl.greedy_decode(quantized, src, 4),
                         lambda: torch_impl.beam_search(quantized, src, 4, 2)):
                with pytest.raises(ValueError, match=refusal), torch.no_grad():
                    call()
        set_precision(be, model, "float32")  # the way out the message names
        quantized = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8)
        with torch.no_grad():
            logits = quantized(src, tgt)
        assert logits.dtype == torch.float32 and bool(torch.isfinite(logits).all())
    finally:
        set_precision(be, model, "float32")


def test_torch_half_precision_needs_float32_parameters(case):
    """A model made ``.half()`` or ``.double()`` (torch's idiom for computing in the parameters'
    dtype): a half precision over it failed in autocast ("Unexpected floating ScalarType"), or
    computed in float64 while `compute_dtype` said bfloat16."""
    pytest.importorskip("torch")
    be = ModelBackend("torch")
    for convert, got in (("half", "float16"), ("double", "float64")):
        model = getattr(be.build(CONFIG, case[0]), convert)()
        with pytest.raises(TypeError, match=f"^model: expected float32 parameters for bfloat16 .*, got {got} "):
            set_precision(be, model, "bfloat16")
        assert getattr(model, "precision", "float32") == "float32"
        set_precision(be, model, "float32")  # computing in the parameters' dtype stays possible


# -- the command line: twins compare --dtype and twins decode --precision -------------------------
@pytest.mark.parametrize("precision", HALF)
def test_twins_compare_runs_each_half_precision_against_its_bounds(precision, capsys):
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    from twins.cli import main
    args = ["compare", "--preset", "tiny", "--batch", "2", "--src-len", "6", "--tgt-len", "5",
            "--dtype", precision, "--decode", "--max-new", "4"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"({precision} mixed precision)" in out and "PASS: all" in out
    assert "decode: torch vs reference" in out and "decode: tf vs reference" in out


def test_twins_compare_grows_the_bounds_of_an_ill_conditioned_model(tmp_path, capsys):
    """A model of 8 features (no-pad-mask, seed 0): float16 TF's logits part from the oracle's by
    8.8e-3 of their scale here, over the 4e-3 written, which reported FAIL for two correct
    backends. The bounds now grow with the conditioning of the norms each tensor passed, and the
    table says so."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    import json

    from twins.cli import main
    (tmp_path / "config.json").write_text(json.dumps(VC.config("no-pad-mask", "float32").to_dict()))
    assert main(["compare", "--config", str(tmp_path / "config.json"), "--dtype", "float16", "--batch", "4",
                 "--src-len", "10", "--tgt-len", "10", "--decode", "--max-new", "6",
                 "--json", str(tmp_path / "out.json")]) == 0
    out = capsys.readouterr().out
    assert "bounds grown with the model (shared/conditioning.py): from " in out and "a layer norm's conditioning" in out
    assert "PASS: all" in out
    result = json.loads((tmp_path / "out.json").read_text())
    kappa = max(result["norm_conditioning"].values())
    logits = next(r for r in result["rows"] if r["name"] == "logits")
    for pair, row in logits["pairs"].items():
        written = bound_for("float16", pair)
        assert row["bound"] == pytest.approx(written.rtol * kappa / written.conditioning)
        assert row["bound"] > 3 * written.rtol


@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_twins_decode_takes_the_precision(backend, tmp_path, capsys):
    pytest.importorskip("torch" if backend == "torch" else "tensorflow")
    import json

    from shared.weights import save_checkpoint
    from twins.cli import main
    save_checkpoint(tmp_path / "model", CONFIG, random_weights(CONFIG, 0))
    runs = {}
    for precision in ("float32", "bfloat16"):
        assert main(["decode", "--checkpoint", str(tmp_path / "model"), "--backend", backend,
                     "--src", "5 6 7 8", "--src", "9 4", "--max-new", "6", "--precision", precision,
                     "--json", "-"]) == 0
        runs[precision] = json.loads(capsys.readouterr().out)
    assert runs["bfloat16"]["precision"] == "bfloat16"
    # random weights: the scores move with the precision (the tokens may or may not)
    assert ([r["score"] for r in runs["float32"]["results"]]
            != [r["score"] for r in runs["bfloat16"]["results"]])
    save_checkpoint(tmp_path / "f64", CONFIG.replace(dtype="float64"),
                    random_weights(CONFIG.replace(dtype="float64"), 0))
    assert main(["decode", "--checkpoint", str(tmp_path / "f64"), "--src", "5 6", "--precision",
                 "float16", "--backend", backend]) == 2
    err = capsys.readouterr().err
    assert "--precision: float16 mixed precision needs a float32 model, got dtype=float64" in err
