"""The ONNX export (`shared.exporters.onnx`) served by ONNX Runtime (`twins.onnx_runtime`).

* the files: the three graphs in Optimum's layout, ``onnx.checker`` (full check), their inputs and
  outputs with dynamic batch and length axes, config.json read back, the crash-safe directory
  (an export replaced, anything else refused, a failed export leaving nothing), the refusal;
* logits of every convention-15 variant (and pad_id 3, with and without a pad start token) from
  the full pass (``decoder_model``) and the cached steps (``decoder_with_past``) within
  ``("float32" | "float64", "onnx:reference")`` of the float64 oracle, batches with padded and
  all-padding source rows; cached = uncached;
* greedy and beam tokens identical to torch_impl's and tf_impl's on random models and on a demo
  model trained here (a tie closer than the float32 decode margin would be reported, not hidden),
  and the logits within ``("float32", "onnx:torch" | "onnx:tf")`` of theirs;
* a process where torch, TensorFlow, Keras and onnx cannot be imported loads an export directory
  and decodes it, and refuses bad input (ids out of range, a float dtype, a mask whose shape
  disagrees with the ids, a missing file) with the project's errors, never tokens;
* Optimum's ``ORTModelForSeq2SeqLM``, where it is installed (it is not in the pinned environment:
  docs/formats/onnx.md says why);
* the float16 export (``precision="float16"``, `shared.precision`'s rule): float16 kernels, biases
  and cache, float32 embeddings, norms and memory in the files; logits of the full pass and the
  cached steps within ``("float16", "onnx:reference")`` of the oracle and ``("float16",
  "onnx:torch")`` of torch_impl float16; cached greedy tokens equal to a recomputing greedy's and
  to the float32 export's; bfloat16, a float64 model and an unknown name refused by name; ``twins
  convert --to onnx --precision fp16 --verify`` and ``twins decode --backend onnx`` on it.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from parity_tests import variant_configs as VC  # noqa: E402
from parity_tests.decoding_cases import BEAM, MAX_LEN, config64, sources, weights_for  # noqa: E402
from parity_tests.importable import ISOLATED_BLOCK  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared import reference as R  # noqa: E402
from shared.batches import src_tgt  # noqa: E402
from shared.checks import ids_range_message  # noqa: E402
from shared.divergence import first_divergence  # noqa: E402
from shared.exporters.common import ExportError  # noqa: E402
from shared.exporters.onnx import (CONFIG_FILE, DECODER, DECODER_WITH_PAST, ENCODER, GENERATION_FILE,  # noqa: E402
                                   GRAPHS, export_precision, read_onnx, source_mask, to_onnx)
from shared.loss import log_softmax  # noqa: E402
from shared.tolerances import assert_close, bound_for  # noqa: E402
from shared.weights import WeightsError, random_weights, save_checkpoint  # noqa: E402
from twins.onnx_runtime import OnnxRuntimeModel  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MARGIN = bound_for("float32", "decode-margin").rtol
MARGIN16 = bound_for("float16", "decode-margin").rtol
CONFIGS = {**{name: VC.config(name) for name in VC.VARIANTS},
           "pad3": VC.BASE.replace(pad_id=3, bos_id=1, eos_id=2),
           "pad3-start-pad": VC.BASE.replace(pad_id=3, bos_id=1, eos_id=2, decoder_start_id=3),
           # an eps float32 cannot hold: LayerNormalization's epsilon is a 32-bit attribute, which
           # put float64 graphs 1.8e-9 off the oracle at 0.1 (5.8e-11 at 1e-3, 3e-13 at 1e-5)
           "norm-eps-0.1": VC.BASE.replace(norm_eps=0.1)}


def batch(c: TransformerConfig):
    """Rows: full, padded, all padding (source and target)."""
    return src_tgt(c, batch=3, src_len=7, tgt_len=6, seed=1, src_lengths=[7, 3, 0], tgt_lengths=[6, 2, 0])


def decodable_rows(c: TransformerConfig, tgt: np.ndarray) -> list[int]:
    """The rows a decode could feed the cached step: no pad after column 0, column 0 real (the
    cached step attends every position, as the backends' cached steps do)."""
    first_real = c.start_id == c.pad_id or not c.mask_padding
    return [b for b in range(len(tgt)) if not (tgt[b, 1:] == c.pad_id).any()
            and (first_real or tgt[b, 0] != c.pad_id)]


# -- the files ------------------------------------------------------------------------------------
def test_files_checker_and_signatures(tmp_path):
    c = VC.config("all-sinusoidal", "float32")
    w = random_weights(c, 0)
    path = to_onnx(c, w, tmp_path / "model")
    assert sorted(os.listdir(path)) == sorted([*GRAPHS, CONFIG_FILE, GENERATION_FILE])
    head_dim, layers = c.head_dim, c.n_decoder_layers

    def signature(values):
        return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}

    graphs = {}
    for name in GRAPHS:
        onnx.checker.check_model(str(path / name), full_check=True)
        model = onnx.load(str(path / name))
        graphs[name] = signature(model.graph.input), signature(model.graph.output)
    assert graphs[ENCODER] == ({"input_ids": ["batch", "src_len"], "attention_mask": ["batch", "src_len"]},
                               {"last_hidden_state": ["batch", "src_len", c.d_model]})
    kv = lambda prefix, part, length: {f"{prefix}.{i}.{part}.{t}": ["batch", c.n_heads, length, head_dim]  # noqa: E731
                                       for i in range(layers) for t in ("key", "value")}
    inputs, outputs = graphs[DECODER]
    assert inputs == {"input_ids": ["batch", "tgt_len"], "encoder_hidden_states": ["batch", "src_len", c.d_model],
                      "encoder_attention_mask": ["batch", "src_len"]}
    assert outputs == {"logits": ["batch", "tgt_len", c.tgt_vocab], **kv("present", "decoder", "tgt_len"),
                       **kv("present", "encoder", "src_len")}
    inputs, outputs = graphs[DECODER_WITH_PAST]
    assert inputs == {"input_ids": ["batch", 1], "encoder_attention_mask": ["batch", "src_len"],
                      **kv("past_key_values", "decoder", "past_len"), **kv("past_key_values", "encoder", "src_len")}
    assert outputs == {"logits": ["batch", 1, c.tgt_vocab], **kv("present", "decoder", "past_len + 1")}
    config, files = read_onnx(path)
    assert config == c and set(files) == set(GRAPHS)
    # a path under a file was Python's NotADirectoryError, a neutral checkpoint "float32"
    elsewhere = tmp_path.parent / f"{tmp_path.name}-elsewhere"
    elsewhere.mkdir()
    (elsewhere / "file").write_text("mine")
    save_checkpoint(elsewhere / "neutral", c, w)
    for read in (read_onnx, export_precision):  # '' was the current directory, None Python's TypeError
        with pytest.raises(ValueError, match="^path: expected a path, got ''$"):
            read("")
        with pytest.raises(TypeError, match="^path: expected a str or os.PathLike path, got NoneType$"):
            read(None)
        for other in (elsewhere / "file", elsewhere / "file" / "x", elsewhere / "neutral"):
            with pytest.raises(FileNotFoundError, match=f"^{read.__name__}: (no ONNX export directory at|missing) "):
                read(other)
    generation = json.loads((path / GENERATION_FILE).read_text())
    assert (generation["decoder_start_token_id"], generation["eos_token_id"], generation["pad_token_id"]) == (
        c.start_id, c.eos_id, c.pad_id)
    # an export is replaced by the next one; anything else is refused; a failure leaves the old one
    to_onnx(c, random_weights(c, 1), path)
    assert not np.array_equal(OnnxRuntimeModel.load(path).encode(batch(c)[0]),
                              OnnxRuntimeModel.from_weights(c, w).encode(batch(c)[0]))
    # one written before config.json said its precision (read as float32) is replaced too
    header = json.loads((path / CONFIG_FILE).read_text())
    del header["precision"]
    (path / CONFIG_FILE).write_text(json.dumps(header))
    assert export_precision(path) == "float32"
    to_onnx(c, w, path)
    assert json.loads((path / CONFIG_FILE).read_text())["precision"] == "float32"
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not an ONNX export"):
        to_onnx(c, w, tmp_path / "other")
    # but a neutral checkpoint's config.json alone (format_version, no graphs) is not an export
    (tmp_path / "other" / "notes.txt").unlink()
    (tmp_path / "other" / CONFIG_FILE).write_text(json.dumps(header))
    with pytest.raises(FileExistsError, match="not an ONNX export"):
        to_onnx(c, w, tmp_path / "other")
    assert os.listdir(tmp_path / "other") == [CONFIG_FILE]
    before = (path / ENCODER).read_bytes()
    with pytest.raises(WeightsError, match="generator.bias"):
        to_onnx(c, {k: v for k, v in w.items() if k != "generator.bias"}, path)
    assert (path / ENCODER).read_bytes() == before and sorted(os.listdir(tmp_path)) == ["model", "other"]


def test_refused_by_name(tmp_path):
    c = VC.config("gelu", "float64")
    with pytest.raises(ExportError, match="activation='gelu' with dtype='float64'"):
        to_onnx(c, random_weights(c, 0), tmp_path / "model")
    assert not (tmp_path / "model").exists()


# -- logits against the oracle --------------------------------------------------------------------
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("variant", list(CONFIGS))
def test_logits_full_and_cached(variant, dtype):
    c = CONFIGS[variant].replace(dtype=dtype)
    if dtype == "float64" and c.activation == "gelu":
        pytest.skip("refused: ONNX Runtime has no float64 Erf (test_refused_by_name)")
    w = random_weights(c, seed=sorted(CONFIGS).index(variant))
    model = OnnxRuntimeModel.from_weights(c, w, threads=1)
    bound = bound_for(dtype, "onnx:reference")
    src, tgt = batch(c)
    expected = R.forward(w, c, src, tgt)
    full = model.logits(src, tgt)
    assert full.dtype == np.dtype(dtype)
    assert_close(full, expected, bound, f"{variant} decoder_model logits")
    step = model.step(src)
    state, steps = step.initial_state(), []
    for t in range(tgt.shape[1]):
        logits, state = step(tgt, t, state)
        steps.append(logits)
    rows = decodable_rows(c, tgt)
    assert rows, "no row to compare the cached steps on"
    cached = np.stack(steps, 1)[rows]
    assert_close(cached, expected[rows], bound, f"{variant} decoder_with_past logits")
    assert_close(cached, full[rows], bound, f"{variant} cached vs uncached")


def test_bad_ids_fail_inside_the_graph_too():
    """Straight to the session (no Python checks): an id past the table or a negative one is an
    error of ONNX Runtime, not a row of some other token (ONNX's Gather would wrap a negative)."""
    c = CONFIGS["pad3"].replace(dtype="float32")
    model = OnnxRuntimeModel.from_weights(c, random_weights(c, 0))
    for bad in (c.src_vocab, -1):
        ids = np.array([[4, bad, 5]], np.int64)
        with pytest.raises(Exception, match="out of data bounds|indices"):
            model.encoder.run(None, {"input_ids": ids, "attention_mask": np.ones_like(ids)})


# -- decoding against torch_impl and tf_impl -----------------------------------------------------
def _assert_same_tokens(c64, w64, src, want, got, what, margin=MARGIN):
    """Identical, or parted only at a near-tie of the oracle's within ``margin`` (float32's by
    default; none measured here)."""
    tgt = np.concatenate([np.full((len(src), 1), c64.start_id), want[:, :-1]], axis=1)
    lp = log_softmax(R.forward(w64, c64, src, tgt))
    lp[..., c64.pad_id] = -np.inf
    divergences = first_divergence(want, got, lp)
    assert not [d for d in divergences if not d.margin <= margin], f"{what}: {divergences}"
    assert not divergences, f"{what}: near-ties {divergences}"


@pytest.fixture(scope="module")
def frameworks():
    torch_impl = pytest.importorskip("torch_impl")
    tf_impl = pytest.importorskip("tf_impl")
    return torch_impl, tf_impl


def _decode_all(torch_impl, tf_impl, c32, w32, src, max_len):
    """{implementation: (greedy tokens, beam tokens, beam scores)} of ONNX, torch, TF (eager)."""
    from parity_tests.torch_support import build
    onnx_model = OnnxRuntimeModel.from_weights(c32, w32, threads=1)
    torch_model = build(c32, w32)
    tf_model = tf_impl.Transformer(c32)
    tf_model.import_weights(w32)
    out = {"onnx": (onnx_model.greedy(src, max_len), onnx_model.beam(src, max_len, BEAM, 0.6))}
    out["torch"] = (torch_impl.greedy_decode(torch_model, src, max_len),
                    torch_impl.beam_search(torch_model, src, max_len, BEAM, 0.6))
    out["tf"] = (tf_impl.greedy_decode(tf_model, src, max_len, compiled=False),
                 tf_impl.beam_search(tf_model, src, max_len, BEAM, 0.6, compiled=False))
    # teacher-forced along torch's greedy tokens: the logits for the onnx:torch and onnx:tf bounds
    from parity_tests.backends import Backend
    tgt = np.concatenate([np.full((len(src), 1), c32.start_id), out["torch"][0].tokens[:, :-1]], axis=1)
    out["logits"] = {"onnx": onnx_model.logits(src, tgt),
                     "torch": Backend("torch", "eager", "cpu").logits(torch_model, src, tgt),
                     "tf": Backend("tf", "eager", "/CPU:0").logits(tf_model, src, tgt)}
    return out


def _check_decodes(c32, w32, src, max_len, decodes):
    c64 = c32.replace(dtype="float64")
    w64 = {k: v.astype(np.float64) for k, v in w32.items()}
    greedy, beam = decodes["onnx"]
    logits = decodes["logits"]
    for name in ("torch", "tf"):
        assert_close(logits["onnx"], logits[name], bound_for("float32", f"onnx:{name}"), f"logits onnx vs {name}")
        other_greedy, other_beam = decodes[name]
        _assert_same_tokens(c64, w64, src, other_greedy.tokens, greedy.tokens, f"greedy onnx vs {name}")
        np.testing.assert_array_equal(greedy.lengths, other_greedy.lengths)
        _assert_same_tokens(c64, w64, src, other_beam.tokens, beam.tokens, f"beam onnx vs {name}")
        np.testing.assert_allclose(beam.scores, other_beam.scores, rtol=0, atol=MARGIN * max_len)


@pytest.mark.parametrize("variant", ["tiny-post-standard", "tiny-shared-tied-post"])
def test_decodes_equal_torch_and_tf_random(frameworks, variant):
    c64 = config64(variant)
    w32 = {k: v.astype(np.float32) for k, v in weights_for(c64, 0).items()}
    c32 = c64.replace(dtype="float32")
    src = sources(c64, 0)  # the last row is all padding
    _check_decodes(c32, w32, src, MAX_LEN, _decode_all(*frameworks, c32, w32, src, MAX_LEN))


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """A copy-task model trained here (torch, 60 steps, tiny preset) and its export directory."""
    pytest.importorskip("torch")
    from twins import demo_tasks
    from twins.cli import main
    from shared.weights import load_checkpoint
    root = tmp_path_factory.mktemp("demo")
    (root / "tiny.json").write_text(demo_tasks.task_config("copy", preset="tiny").replace(dropout=0.0).to_json())
    assert main(["train", "--task", "copy", "--backend", "torch", "--steps", "60", "--seed", "3",
                 "--checkpoint", str(root / "run"), "--eval-every", "60", "--heldout", "8", "--factor", "3",
                 "--config", str(root / "tiny.json"), "--no-progress", "--threads", "1"]) == 0
    config, weights = load_checkpoint(root / "run")
    to_onnx(config, weights, root / "onnx")
    return config, weights, root / "onnx"


def test_decodes_equal_torch_and_tf_demo(frameworks, demo, capsys):
    capsys.readouterr()
    from twins import demo_tasks
    config, weights, _ = demo
    src = demo_tasks.pad(demo_tasks.heldout("copy", 16).sources)
    src[-1] = config.pad_id  # and an all-padding row
    _check_decodes(config, weights, src, config.max_len, _decode_all(*frameworks, config, weights, src,
                                                                      config.max_len))


# -- served where neither framework can be imported -----------------------------------------------
SERVER = ISOLATED_BLOCK + textwrap.dedent("""
    import json
    sys.path.insert(0, sys.argv[3])
    import numpy as np
    from twins.onnx_runtime import OnnxRuntimeModel
    work, out = sys.argv[1], {}
    model = OnnxRuntimeModel.load(f"{work}/onnx", threads=1)
    src = np.load(f"{work}/src.npy")
    greedy, beam = model.greedy(src, int(sys.argv[4])), model.beam(src, int(sys.argv[4]), 3, 0.6)
    np.savez(f"{work}/results.npz", greedy=greedy.tokens, beam=beam.tokens, scores=beam.scores)
    errors = {}
    bad = {"out-of-range": (np.full_like(src, model.config.src_vocab), None),
           "float": (src.astype(np.float32), None),
           "mask-shape": (src, np.ones((len(src), 1, 1, src.shape[1] + 1), bool)),
           "missing": None}
    for case, given in bad.items():
        try:
            if given is None:
                OnnxRuntimeModel.load(f"{work}/missing")
            else:
                model.greedy(given[0], 4, src_mask=given[1])
            errors[case] = "no error"
        except (TypeError, ValueError, FileNotFoundError) as err:
            errors[case] = f"{type(err).__name__}: {err}"
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    json.dump({"errors": errors, "loaded": loaded}, open(f"{work}/info.json", "w"))
""")
BLOCKED = ("torch", "tensorflow", "keras", "torch_impl", "tf_impl", "onnx", "parity_tests")


def test_served_without_torch_or_tensorflow(demo, tmp_path, frameworks):
    """`twins.onnx_runtime` in ``python -I`` with torch, TensorFlow, Keras, onnx (the builder) and
    the backends blocked: the demo export's greedy and beam tokens equal torch_impl's; bad input
    gets the project's errors."""
    from twins import demo_tasks
    torch_impl, _ = frameworks
    config, weights, export = demo
    (tmp_path / "onnx").symlink_to(export)
    src = demo_tasks.pad(demo_tasks.heldout("copy", 6).sources)
    src[2] = config.pad_id
    np.save(tmp_path / "src.npy", src)
    max_len = config.max_len
    done = subprocess.run([sys.executable, "-I", "-c", SERVER, str(tmp_path), ",".join(BLOCKED), str(ROOT),
                           str(max_len)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((tmp_path / "info.json").read_text())
    assert info["loaded"] == []
    results = np.load(tmp_path / "results.npz")
    from parity_tests.torch_support import build
    model = build(config, weights)
    np.testing.assert_array_equal(results["greedy"], torch_impl.greedy_decode(model, src, max_len).tokens)
    np.testing.assert_array_equal(results["beam"], torch_impl.beam_search(model, src, max_len, 3, 0.6).tokens)
    errors = info["errors"]
    v = config.src_vocab
    assert errors["out-of-range"] == f"ValueError: {ids_range_message('src', v, v, v)}"
    assert errors["float"] == "TypeError: src: expected integer token ids, got dtype float32"
    assert errors["mask-shape"].startswith("ValueError: src_mask: expected a mask broadcastable to")
    assert errors["missing"].startswith("FileNotFoundError: read_onnx: no ONNX export directory at")
    assert "missing" in errors["missing"]


def test_bad_input_in_process(demo, tmp_path):
    config, _, export = demo
    model = OnnxRuntimeModel.load(export)
    src = np.array([[4, 5, 6, 2]])
    with pytest.raises(ValueError, match=r"src: expected token ids in \[0, \d+\), got values in \[-1, 6\]"):
        model.greedy(src * 0 + np.array([[4, -1, 6, 2]]), 4)
    with pytest.raises(TypeError, match="src_mask: expected a bool mask"):
        model.greedy(src, 4, src_mask=np.ones((1, 1, 1, 4), np.int64))
    with pytest.raises(ValueError, match="src_mask: expected one mask for every head"):
        model.greedy(src, 4, src_mask=np.ones((1, config.n_heads, 1, 4), bool))
    with pytest.raises(ValueError, match="max_len"):
        model.greedy(src, config.max_len + 1)
    with pytest.raises(TypeError, match="beam_size: expected an int >= 1, got None"):
        model.beam(src, 4, None)
    with pytest.raises(ValueError, match="tgt: expected batch size 1"):
        model.logits(src, np.ones((2, 3), np.int64))
    # a config.json that is not its graphs' (it may claim 10**9 layers): refused naming the field
    import shutil
    for field, value, message in (("n_decoder_layers", 10**9, "the config says 1000000000, the graphs hold"),
                                  ("tgt_vocab", config.tgt_vocab + 1, "the graphs' logits are")):
        shutil.copytree(export, tmp_path / field)
        header = json.loads((tmp_path / field / "config.json").read_text())
        header["config"][field] = value
        (tmp_path / field / "config.json").write_text(json.dumps(header))
        with pytest.raises(ValueError, match=rf"config.json': {field}: .*{re.escape(message)}"):
            OnnxRuntimeModel.load(tmp_path / field)
    (tmp_path / "partial").mkdir()
    (tmp_path / "partial" / ENCODER).write_bytes((export / ENCODER).read_bytes())
    with pytest.raises(FileNotFoundError, match=f"missing .*{DECODER}"):
        OnnxRuntimeModel.load(tmp_path / "partial")
    # a given mask is the source mask: masking the padding explicitly changes nothing
    padded = np.array([[4, 5, 6, 2, config.pad_id]])
    np.testing.assert_array_equal(model.greedy(padded, 5).tokens,
                                  model.greedy(padded, 5, src_mask=(padded != config.pad_id)[:, None, None]).tokens)


# -- Optimum --------------------------------------------------------------------------------------
MARIAN_LIKE = TransformerConfig.preset("tiny", dropout=0.0, norm_first=False, norm_style="standard", norm_eps=1e-5,
                                       pe_layout="halves", activation="swish", decoder_start_id=0, final_norm=False)


def test_config_json_carries_marian_keys_when_marian_describes_the_model(tmp_path):
    from shared.exporters.marian import marian_config
    c, other = MARIAN_LIKE, VC.config("all-sinusoidal", "float32")
    for config, marian in ((c, True), (other, False)):
        path = to_onnx(config, random_weights(config, 0), tmp_path / str(marian))
        stored = json.loads((path / CONFIG_FILE).read_text())
        assert read_onnx(path)[0] == config
        assert (stored.get("model_type") == "marian") is marian
        if marian:
            assert {k: stored[k] for k in marian_config(c)} == marian_config(c)


def test_optimum_generates_the_same_tokens(tmp_path):
    """A Marian-compatible export (post-norm, standard norm with torch's eps, [sin | cos]
    positions, swish, decoder start = pad) loads as it is in Optimum's ``ORTModelForSeq2SeqLM``
    and its greedy ``generate`` returns `twins.onnx_runtime`'s tokens. Optimum's ONNX Runtime
    integration (optimum-onnx 0.1.0) requires transformers < 4.58, so the pinned environment skips
    this; it passed with optimum 2.1.0, optimum-onnx 0.1.0, transformers 4.57.6, onnxruntime 1.32."""
    optimum = pytest.importorskip("optimum.onnxruntime")
    torch = pytest.importorskip("torch")
    c = MARIAN_LIKE
    w = random_weights(c, 0)
    w["generator.bias"][c.eos_id] += 1.5
    path = to_onnx(c, w, tmp_path / "export")
    src = sources(c, 0)  # the last row is all padding
    ours = OnnxRuntimeModel.load(path).greedy(src, MAX_LEN)
    model = optimum.ORTModelForSeq2SeqLM.from_pretrained(str(path), use_cache=True)
    out = model.generate(input_ids=torch.tensor(src), attention_mask=torch.tensor(source_mask(c, src)),
                         max_new_tokens=MAX_LEN, num_beams=1, do_sample=False).numpy()
    theirs = np.full_like(ours.tokens, c.pad_id)
    theirs[:, : out.shape[1] - 1] = out[:, 1:]
    np.testing.assert_array_equal(theirs, ours.tokens)


def test_verify_of_a_short_model_and_of_logits_that_overflow(capsys, tmp_path):
    """Before: a model of max_len 2 failed ``--verify`` as an error naming src_lengths (its batch
    held a row of 3), and float16 logits that overflow ended it with exit 2 half-way through its
    table instead of a FAIL line and exit 1."""
    from twins.onnx_runtime import verify
    short = TransformerConfig.preset("tiny", max_len=2)
    weights = random_weights(short, 0)
    assert verify(short, weights, to_onnx(short, weights, tmp_path / "short")) == 0
    config = TransformerConfig.preset("tiny")
    weights = random_weights(config, 0)
    weights["generator.kernel"][:] = 6e4  # fits float16; the logits do not
    weights["generator.kernel"][:, 5] = -6e4
    weights["decoder.final_norm.beta"][:] = 1
    capsys.readouterr()
    assert verify(config, weights, to_onnx(config, weights, tmp_path / "wide", precision="float16")) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[-2].split() == ["greedy", "tokens", "(8", "new)", "NaN", "or", "+inf", "logits", "FAIL"]
    assert out[-1] == "FAIL"


def test_decode_finishes_an_interrupted_export_first(tmp_path, capsys):
    """An export replaced by a process killed between the two renames (the marker protocol):
    ``twins decode`` judged the path before anything recovered it, took it for no export, and the
    reader, which recovered it, then refused it as "an ONNX export, which is written, never read
    back"."""
    from parity_tests.importable import project_environ
    from twins.cli import main
    config = TransformerConfig.preset("tiny")
    path = to_onnx(config, random_weights(config, 0), tmp_path / "export")
    code = ("import sys; from shared import TransformerConfig; from shared.weights import random_weights; "
            "from shared.exporters.onnx import to_onnx; c = TransformerConfig.preset('tiny'); "
            "to_onnx(c, random_weights(c, 1), sys.argv[1])")
    env = project_environ(ROOT, TWINS_FAULT_AT="moved-old", TWINS_NO_EXCHANGE="1")
    killed = subprocess.run([sys.executable, "-c", code, str(path)], env=env, capture_output=True, timeout=120)
    assert killed.returncode == -9 and not path.exists(), killed.stderr[-2000:]
    capsys.readouterr()
    assert main(["decode", "--checkpoint", str(path), "--backend", "onnx", "--src", "3 4"]) == 0
    assert capsys.readouterr().err == ""


def test_the_runtime_model_checks_its_own_arguments(demo):
    """`OnnxRuntimeModel`'s arguments, named: before, threads 0 or "2" were taken and 10**12
    failed in pybind's words, options={} and graphs without a file failed as an AttributeError or
    a KeyError, step(beams=0) was taken and beams=-1 failed in NumPy's words, and
    return_all="no" returned every hypothesis."""
    config, _, export = demo
    graphs = {name: str(Path(export) / name) for name in (ENCODER, DECODER, DECODER_WITH_PAST)}
    for kwargs, error, message in (
            (dict(threads=0), ValueError, "threads: expected an int >= 1, got 0"),
            (dict(threads="2"), TypeError, "threads: expected an int >= 1, got '2'"),
            (dict(threads=10**12), ValueError, "threads 1000000000000: expected at most"),
            (dict(options={}), TypeError, "options: expected an onnxruntime.SessionOptions or None, got dict"),
            (dict(graphs={ENCODER: graphs[ENCODER]}), ValueError, f"graphs: expected a mapping of {ENCODER}, "),
            (dict(config=None), TypeError, "config: expected a TransformerConfig, got NoneType")):
        with pytest.raises(error, match=f"^{re.escape(message)}"):
            OnnxRuntimeModel(**{"config": config, "graphs": graphs, **kwargs})
    model = OnnxRuntimeModel(config, graphs)
    src = np.array([[4, 5, 6]])
    for beams, error in ((0, ValueError), (-1, ValueError), (2.0, TypeError)):
        with pytest.raises(error, match=f"^beams: expected an int >= 1, got {beams!r}$"):
            model.step(src, beams)
    with pytest.raises(TypeError, match="^return_all: expected True or False, got 'no' \\(str\\)$"):
        model.beam(src, 4, 2, return_all="no")
    # The full pass checks src, tgt, then the mask, in the reference's order and words (it checked
    # the mask before tgt, and named a batch that differed in words of its own).
    weights, bad_mask = demo[1], np.ones((1, 3), np.float32)
    for tgt, error, message in ((None, TypeError, "tgt: expected a tensor or array, got NoneType"),
                                ([[1, 2], [1]], ValueError, "tgt: expected token ids of shape (batch, seq), every "
                                 "row of one length, got rows of lengths [2, 1]; pad the rows to one length "
                                 "(with pad_id)"),
                                (np.array([[1, 2], [1, 3]]), ValueError, "tgt: expected batch size 1 (as src), got 2")):
        for full_pass in (lambda: model.logits(src, tgt, src_mask=bad_mask),
                          lambda: R.forward(weights, config, src, tgt, src_mask=bad_mask)):
            with pytest.raises(error, match=f"^{re.escape(message)}$"):
                full_pass()


def test_verify_reports_pass_and_fail(demo, capsys, tmp_path):
    """`twins.onnx_runtime.verify` (``twins convert --to onnx --verify``) passes on the export of
    the weights it is given, and fails when the export holds other weights."""
    from twins.onnx_runtime import verify
    config, weights, export = demo
    capsys.readouterr()
    assert verify(config, weights, export) == 0
    out = capsys.readouterr().out
    assert out.rstrip().endswith("PASS") and "FAIL" not in out
    other = {k: v + np.float32(0.01) for k, v in weights.items()}
    assert verify(config, other, export) == 1
    assert capsys.readouterr().out.rstrip().endswith("FAIL")


# -- the command line: twins convert --to onnx, twins decode --backend onnx ------------------------
def test_twins_convert_to_onnx_verifies_and_decode_serves_it_without_the_frameworks(demo, tmp_path,
                                                                                   capsys):
    """`twins convert --to onnx --verify` from a neutral checkpoint (the registry's record), then
    `python -m twins decode --backend onnx` on the export in a process with torch, TensorFlow and
    Keras blocked (parity_tests/importable.py): the tokens `twins decode --backend torch` gives on
    the source checkpoint, greedy and beam."""
    pytest.importorskip("torch")
    from parity_tests import importable
    from twins.cli import main
    config, weights, _ = demo
    save_checkpoint(tmp_path / "model", config, weights)
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "onnx"), "--to", "onnx",
                 "--verify"]) == 0
    out = capsys.readouterr().out
    assert "(neutral) -> " in out and "(onnx)" in out and out.rstrip().endswith("PASS")
    ids = ["--src", "4 5 6 7 8 9 10 11", "--src", "9 8 7", "--max-new", "12"]
    for beam in ("1", "3"):
        assert main(["decode", "--checkpoint", str(tmp_path / "model"), "--backend", "torch",
                     "--beam-size", beam, *ids]) == 0
        want = capsys.readouterr().out
        served = subprocess.run(
            [sys.executable, "-m", "twins", "decode", "--checkpoint", str(tmp_path / "onnx"),
             "--backend", "onnx", "--beam-size", beam, *ids], capture_output=True, text=True,
            timeout=300, cwd=ROOT, env=importable.environ(("torch", "tensorflow", "keras")))
        assert served.returncode == 0, served.stderr[-2000:]
        assert served.stdout == want


def test_twins_decode_refuses_what_onnx_cannot_serve(demo, tmp_path, capsys):
    from twins.cli import main
    config, weights, export = demo
    assert main(["decode", "--checkpoint", str(export), "--backend", "torch", "--src", "4 5"]) == 2
    err = capsys.readouterr().err
    assert "is an ONNX export: decode it with --backend onnx (got --backend torch)" in err
    assert main(["decode", "--checkpoint", str(export), "--backend", "onnx", "--src", "4 5",
                 "--precision", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert "--precision: ONNX Runtime runs the export's float32 graphs, got 'bfloat16'" in err


def test_twins_compare_includes_onnx_runtime_on_the_logits(capsys):
    """`twins compare --backends torch,tf,onnx`: ONNX Runtime's logits against the reference and
    both backends within their bounds (its graphs name no other intermediate: those cells are
    '-', not failures), and its greedy tokens against the oracle's."""
    pytest.importorskip("torch")
    pytest.importorskip("tensorflow")
    import json

    from twins.cli import main
    assert main(["compare", "--preset", "tiny", "--batch", "2", "--src-len", "6", "--tgt-len", "5",
                 "--backends", "torch,tf,onnx", "--decode", "--max-new", "4", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    logits = next(r for r in result["rows"] if r["name"] == "logits")
    for pair in ("onnx:reference", "onnx:torch", "onnx:tf"):
        assert logits["pairs"][pair]["pass"] and 0 < logits["pairs"][pair]["max_rel"]
        assert logits["pairs"][pair]["bound"] == bound_for("float32", pair).rtol
    assert all(r["pairs"]["onnx:reference"].get("absent") for r in result["rows"] if r["name"] != "logits")
    assert result["decoding"]["onnx"]["pass"] and result["pass"]


def test_session_options_are_used_as_given_and_never_changed():
    """Before: a caller's ``SessionOptions`` for a float64 model were switched to
    ORT_ENABLE_BASIC in place (the caller's object changed). Now a float64 model gets the basic
    rewrites from the module's own options, and a caller's options are used as given, or refused
    by name when their level is above basic for float64 (`twins.onnx_runtime.check_options`)."""
    from shared.exporters.onnx import build_models
    from twins.onnx_runtime import session_options
    levels = ort.GraphOptimizationLevel

    def graphs(c):
        return {name: m.SerializeToString() for name, m in build_models(c, random_weights(c, 0)).items()}

    def used(model):
        return [s.get_session_options().graph_optimization_level
                for s in (model.encoder, model.decoder, model.decoder_with_past)]

    c64 = CONFIGS["swish"].replace(dtype="float64")  # swish: what ORT 1.30 fused into float32-only QuickGelu
    g64 = graphs(c64)
    assert used(OnnxRuntimeModel(c64, g64)) == [levels.ORT_ENABLE_BASIC] * 3
    for level in (levels.ORT_ENABLE_BASIC, levels.ORT_DISABLE_ALL):
        options = session_options(1)
        options.graph_optimization_level = level
        assert used(OnnxRuntimeModel(c64, g64, options=options)) == [level] * 3
        assert options.graph_optimization_level == level
    for level in (levels.ORT_ENABLE_EXTENDED, levels.ORT_ENABLE_ALL):
        options = session_options(1)
        options.graph_optimization_level = level
        with pytest.raises(ValueError, match=rf"^options\.graph_optimization_level: expected ORT_DISABLE_ALL "
                                             rf"or ORT_ENABLE_BASIC for a float64 model .*, got {level.name};"):
            OnnxRuntimeModel(c64, g64, options=options)
        assert options.graph_optimization_level == level
    c32 = c64.replace(dtype="float32")
    assert used(OnnxRuntimeModel(c32, graphs(c32))) == [levels.ORT_ENABLE_ALL] * 3
    options = session_options(1)
    assert used(OnnxRuntimeModel(c32, graphs(c32), options=options)) == [levels.ORT_ENABLE_ALL] * 3
    assert options.graph_optimization_level == levels.ORT_ENABLE_ALL


# -- float16 exports ---------------------------------------------------------------------------------
def _steps(model, src, tgt) -> np.ndarray:
    """The cached steps' logits (B, T, V) along ``tgt`` (teacher forcing through `OnnxStep`)."""
    step, state, steps = model.step(src), None, []
    for t in range(tgt.shape[1]):
        logits, state = step(tgt, t, state)
        steps.append(logits)
    return np.stack(steps, 1)


@pytest.mark.parametrize("variant", ["start-pad", "gelu", "learned"])
def test_float16_logits_full_and_cached(variant):
    """start-pad: the largest measured difference; gelu: the activation computed in float32
    between Casts; learned: positions as weights (float32 in the file)."""
    c = CONFIGS[variant].replace(dtype="float32")
    w = random_weights(c, seed=sorted(CONFIGS).index(variant))
    model = OnnxRuntimeModel.from_weights(c, w, threads=1, precision="fp16")
    assert model.precision == "float16"
    bound = bound_for("float16", "onnx:reference")
    src, tgt = batch(c)
    expected = R.forward(w, c, src, tgt)
    full = model.logits(src, tgt)
    assert full.dtype == np.float16 and model.encode(src).dtype == np.float32
    assert_close(full, expected, bound, f"{variant} float16 decoder_model logits")
    steps = _steps(model, src, tgt)
    assert steps.dtype == np.float32  # widened for the search
    rows = decodable_rows(c, tgt)
    assert_close(steps[rows], expected[rows], bound, f"{variant} float16 decoder_with_past logits")
    assert_close(steps[rows], full[rows], bound, f"{variant} float16 cached vs uncached")
    # not the float32 export under another name: it parts from the oracle as float16 does
    assert np.max(np.abs(full - expected)) > 100 * bound_for("float32", "onnx:reference").rtol


@pytest.fixture(scope="module")
def demo16(demo, tmp_path_factory):
    """The demo model's float16 export (``twins convert``'s path: `to_onnx`, precision fp16)."""
    config, weights, _ = demo
    return to_onnx(config, weights, tmp_path_factory.mktemp("demo16") / "onnx", precision="fp16")


def test_a_damaged_export_is_named_by_its_file(demo, demo16, tmp_path):
    """A truncated graph, a graph of the other precision copied in, and a config.json whose
    precision is not the graphs': each was onnxruntime's own error (InvalidProtobuf, or a type
    mismatch at the first step) or blamed on a --precision never given."""
    import shutil
    from twins.onnx_runtime import OnnxRuntimeModel
    export = demo[2]
    cases = {"truncated": r"decoder_with_past_model.onnx': not a graph ONNX Runtime can open \(.*INVALID_PROTOBUF",
             "mixed": r"'.*mixed': graphs: expected one precision, got decoder_model.onnx computing in "
                      r"tensor\(float\), decoder_with_past_model.onnx computing in tensor\(float16\)",
             "mislabelled": r"mislabelled/config.json': precision: the config says 'float16', the graphs "
                            r"compute in float32",
             # a field each graph's doc string holds otherwise: before, an edited pad_id decoded
             # other tokens without a word, a graph of another config failed in the search
             "src_vocab": r"src_vocab/config.json': src_vocab: the config says 1000, encoder_model.onnx "
                          r"was exported with \d+$",
             "pad_id": r"pad_id/config.json': pad_id: the config says \d+, encoder_model.onnx was "
                       r"exported with \d+$",
             "swapped": r"'.*swapped': graphs: decoder_with_past_model.onnx holds decoder_model.onnx$",
             # graphs without that doc string (not this project's) and sizes no session declares:
             # failed at the first input using them, or sliced the positional table short and
             # raised IndexError in the search
             "max_len": r"max_len/config.json': .*max_len=1000: expected sizes the graphs' tables hold"}
    for name, needle in cases.items():
        shutil.copytree(export, tmp_path / name)
    os.truncate(tmp_path / "truncated" / "decoder_with_past_model.onnx", 1000)
    shutil.copy(Path(demo16) / "decoder_with_past_model.onnx", tmp_path / "mixed")
    shutil.copy(Path(export) / "decoder_model.onnx", tmp_path / "swapped" / "decoder_with_past_model.onnx")
    header = json.loads((tmp_path / "mislabelled" / "config.json").read_text())
    (tmp_path / "mislabelled" / "config.json").write_text(json.dumps({**header, "precision": "float16"}))
    config = header["config"]
    edits = {"src_vocab": 1000, "max_len": 1000,
             "pad_id": next(i for i in range(config["tgt_vocab"]) if i not in (config["pad_id"], config["bos_id"],
                                                                             config["eos_id"]))}
    for field, value in edits.items():
        (tmp_path / field / "config.json").write_text(json.dumps({**header, "config": {**config, field: value}}))
    for graph in (tmp_path / "max_len").glob("*.onnx"):
        model = onnx.load(graph)
        model.doc_string = ""
        onnx.save(model, graph)
    for name, needle in cases.items():
        with pytest.raises(ValueError, match=needle):
            OnnxRuntimeModel.load(tmp_path / name)


def test_float16_files_hold_float16_kernels_and_cache(demo, demo16):
    config, _, export = demo
    types = onnx.TensorProto
    for name in GRAPHS:
        model = onnx.load(str(demo16 / name))
        kinds = {t.name: t.data_type for t in model.graph.initializer}
        products = [n for n in kinds if n.endswith((".kernel", ".bias"))]
        assert products and all(kinds[n] == types.FLOAT16 for n in products), name
        nbytes = lambda m: sum(len(t.raw_data) for t in m.graph.initializer if t.name in products)  # noqa: E731
        assert 2 * nbytes(model) == nbytes(onnx.load(str(export / name))), name  # the products' weights halve
        assert all(kinds[n] == types.FLOAT for n in kinds if n.endswith((".gamma", ".beta", ".embeddings"))), name
        io = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.input, *model.graph.output)}
        for key, kind in io.items():
            want = (types.INT64 if key in ("input_ids", "attention_mask", "encoder_attention_mask")
                    else types.FLOAT if key in ("last_hidden_state", "encoder_hidden_states")
                    else types.FLOAT16)  # logits, present.*, past_key_values.*
            assert kind == want, (name, key)
    size = lambda path: sum(f.stat().st_size for f in path.iterdir())  # noqa: E731
    assert size(demo16) < 0.8 * size(export)  # embeddings, norms and the graphs' nodes stay as they were
    assert read_onnx(demo16)[0] == config and export_precision(demo16) == "float16"
    assert export_precision(export) == "float32"


def test_float16_decodes_cached_as_full_and_as_float32(frameworks, demo, demo16):
    """Greedy through the cache (`OnnxStep`) equals greedy recomputing the full pass every step
    (the same search over ``decoder_model``), and the float32 export's tokens; its logits are
    within ``("float16", "onnx:torch")`` of torch_impl float16 and its tokens equal torch's."""
    from shared import decoding as search
    from twins import demo_tasks
    from torch_impl.precision import set_precision
    from parity_tests.torch_support import build
    torch_impl, _ = frameworks
    config, weights, export = demo
    model = OnnxRuntimeModel.load(demo16, threads=1)
    src = demo_tasks.pad(demo_tasks.heldout("copy", 12).sources)
    src[-1] = config.pad_id
    max_len = config.max_len

    class Recomputing:
        vocab = config.tgt_vocab

        def initial_state(self):
            return None

        def __call__(self, prefixes, t, state):
            return model.logits(src, prefixes[:, : t + 1])[:, -1].astype(np.float32), None

        def reorder(self, state, rows):
            return state

    cached = model.greedy(src, max_len)
    full = search.greedy_search(Recomputing(), len(src), max_len, config.start_id, config.eos_id, config.pad_id)
    np.testing.assert_array_equal(cached.tokens, full.tokens)
    np.testing.assert_array_equal(cached.lengths, full.lengths)
    c64 = config.replace(dtype="float64")
    w64 = {k: v.astype(np.float64) for k, v in weights.items()}
    float32 = OnnxRuntimeModel.load(export, threads=1).greedy(src, max_len)
    _assert_same_tokens(c64, w64, src, float32.tokens, cached.tokens, "float16 vs float32 export", MARGIN16)
    torch_model = build(config, weights)
    set_precision(torch_model, "float16")
    theirs = torch_impl.greedy_decode(torch_model, src, max_len)
    _assert_same_tokens(c64, w64, src, theirs.tokens, cached.tokens, "float16 onnx vs torch", MARGIN16)
    from parity_tests.backends import Backend
    tgt = np.concatenate([np.full((len(src), 1), config.start_id), theirs.tokens[:, :-1]], axis=1)
    assert_close(model.logits(src, tgt), Backend("torch", "eager", "cpu").logits(torch_model, src, tgt),
                 bound_for("float16", "onnx:torch"), "float16 logits onnx vs torch")


def test_float16_refusals_by_name(tmp_path):
    """bfloat16 (either name), a float64 model, an unknown name and a kernel float16 cannot hold
    are refused before anything is written."""
    c = VC.config("all-sinusoidal", "float32")
    w = random_weights(c, 0)
    for name in ("bfloat16", "bf16"):
        with pytest.raises(ExportError, match=r"precision='bfloat16': ONNX Runtime's CPU execution provider "
                                              r"has no bfloat16 kernel"):
            to_onnx(c, w, tmp_path / "model", precision=name)
    c64 = c.replace(dtype="float64")
    with pytest.raises(ValueError, match=r"^precision: float16 mixed precision needs a float32 model, "
                                         r"got dtype=float64$"):
        to_onnx(c64, {k: v.astype(np.float64) for k, v in w.items()}, tmp_path / "model", precision="float16")
    with pytest.raises(ValueError, match=r"^precision: expected one of \[.*'fp16'.*\], got 'half'$"):
        to_onnx(c, w, tmp_path / "model", precision="half")
    big = {**w, "decoder.layers.0.ffn.inner.kernel": w["decoder.layers.0.ffn.inner.kernel"] * np.float32(1e6)}
    with pytest.raises(ExportError, match=r"decoder\.layers\.0\.ffn\.inner\.kernel: values up to .* exceed "
                                          r"float16's largest finite value 65504"):
        to_onnx(c, big, tmp_path / "model", precision="float16")
    tied = VC.BASE.replace(dtype="float32", tie_output=True)
    wt = random_weights(tied, 0)
    table = "tgt_embed.embeddings" if "tgt_embed.embeddings" in wt else "src_embed.embeddings"
    with pytest.raises(ExportError, match=rf"{table}: values up to .* exceed float16's"):
        to_onnx(tied, {**wt, table: wt[table] * np.float32(1e6)}, tmp_path / "model", precision="float16")
    assert not (tmp_path / "model").exists()


def test_float16_overflowing_logits_are_refused_not_decoded():
    """A logit past 65504 is inf in the float16 graph (the kernel itself within range): the
    search refuses the step, as it refuses any non-finite logits."""
    c = TransformerConfig.preset("tiny", dropout=0.0)
    w = random_weights(c, 0)
    w["generator.kernel"] = w["generator.kernel"] / np.abs(w["generator.kernel"]).max() * np.float32(6e4)
    model = OnnxRuntimeModel.from_weights(c, w, threads=1, precision="float16")
    src = np.array([[4, 5, 6, 7]])
    assert not np.isfinite(model.logits(src, np.array([[c.start_id]]))).all()
    with pytest.raises(ValueError, match=r"^step: expected logits without NaN or \+inf"):
        model.greedy(src, 4)


def test_twins_compare_runs_the_float16_export(capsys):
    """``twins compare --dtype float16 --backends onnx``: the in-memory export rebuilt in float16,
    its logits against the oracle under the float16 bound."""
    import json

    from twins.cli import main
    assert main(["compare", "--preset", "tiny", "--batch", "2", "--src-len", "6", "--tgt-len", "5",
                 "--backends", "onnx", "--dtype", "float16", "--decode", "--max-new", "4", "--json", "-"]) == 0
    result = json.loads(capsys.readouterr().out)
    logits = next(r for r in result["rows"] if r["name"] == "logits")["pairs"]["onnx:reference"]
    assert logits["pass"] and logits["bound"] == bound_for("float16", "onnx:reference").rtol
    assert logits["max_rel"] > 100 * bound_for("float32", "onnx:reference").rtol  # float16 ran, not float32
    assert result["decoding"]["onnx"]["pass"] and result["pass"]


def test_twins_convert_float16_verifies_and_decode_serves_it(demo, tmp_path, capsys):
    """``twins convert --to onnx --precision fp16 --verify`` passes against the float16 bound;
    ``twins decode --backend onnx`` decodes the export in float16 by default (the torch tokens of
    ``--precision float16``), refuses another precision and the export as a source, by name."""
    pytest.importorskip("torch")
    from shared.weights import save_checkpoint
    from twins.cli import main
    config, weights, _ = demo
    save_checkpoint(tmp_path / "model", config, weights)
    capsys.readouterr()
    assert main(["convert", str(tmp_path / "model"), str(tmp_path / "onnx"), "--to", "onnx",
                 "--precision", "fp16", "--verify"]) == 0
    out = capsys.readouterr().out
    assert "float16 mixed-precision graphs" in out and "(float16) in onnxruntime" in out
    assert f"{bound_for('float16', 'onnx:reference').rtol:>7.1e}  pass" in out and out.rstrip().endswith("PASS")
    ids = ["--src", "4 5 6 7 8 9 10 11", "--src", "9 8 7", "--max-new", "12"]
    assert main(["decode", "--checkpoint", str(tmp_path / "model"), "--backend", "torch",
                 "--precision", "float16", *ids]) == 0
    want = capsys.readouterr().out
    assert main(["decode", "--checkpoint", str(tmp_path / "onnx"), "--backend", "onnx", *ids]) == 0
    assert capsys.readouterr().out == want
    assert main(["decode", "--checkpoint", str(tmp_path / "onnx"), "--backend", "onnx",
                 "--precision", "float32", *ids]) == 2
    assert "--precision: ONNX Runtime runs the export's float16 graphs, got 'float32'" in capsys.readouterr().err
    assert main(["convert", str(tmp_path / "onnx"), str(tmp_path / "back")]) == 2
    assert "is an ONNX export, which is written, never read back" in capsys.readouterr().err
    assert not (tmp_path / "back").exists()
    import torch_impl
    from shared.weights import load_checkpoint
    for load in (load_checkpoint, torch_impl.load_checkpoint):  # the library, not only the commands
        with pytest.raises(ValueError, match="is an ONNX export, which is written, never read back"):
            load(tmp_path / "onnx")


@pytest.mark.parametrize("export, margin, verdict", [
    ("float16", 0.5 * MARGIN16, "near-ties"), ("float16", -0.5 * MARGIN16, "near-ties"),
    ("float16", 3 * MARGIN16, "DIFFER"), ("float32", 0.5 * MARGIN16, "DIFFER")])
def test_verify_lets_a_float16_export_part_from_the_oracle_only_at_a_near_tie(
        export, margin, verdict, demo, demo16, monkeypatch, capsys):
    """`twins.onnx_runtime.verify`'s token check: tokens that part from the oracle's pass only for
    a float16 export, and only where the oracle's margin there is within the float16 decode margin
    (either sign); a float32 export's tokens must be identical. The parting is staged (the real
    exports part nowhere on this batch), so that each verdict is reached, and so is the margin
    (its value on a model is `shared.divergence.decode_margin`'s, tested in test_conditioning)."""
    from shared import divergence
    from twins.onnx_runtime import verify
    config, weights, export32 = demo
    parted = divergence.Divergence(item=1, step=2, token_a=5, token_b=6, margin=margin)
    asked = []
    monkeypatch.setattr(divergence, "first_divergence", lambda *args: [parted])
    monkeypatch.setattr(divergence, "decode_margin", lambda precision, *args: asked.append(precision) or MARGIN16)
    status = verify(config, weights, demo16 if export == "float16" else export32)
    out = capsys.readouterr().out
    assert (status == 0) == (verdict == "near-ties"), out
    assert f"{verdict:>31}" in out and str(parted) in out, out
    assert asked == (["float16"] if export == "float16" else [])
