"""benchmarks/decoding.py's contenders, on the tiny preset in the form transformers' Marian computes:
transformers' ``generate`` on the project's Marian export decodes torch_impl's greedy tokens; the
first-round check refuses what it must; and without a GPU every CUDA contender is skipped with its
library's own reason. No timing is tested."""
import os
import sys
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import _decoding_contenders as C  # noqa: E402
import decoding  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.threads import RUNTIME_ENVIRONMENT  # noqa: E402
from shared.weights import random_weights  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]

# tiny, post-norm with torch's eps and Marian's [sin | cos] table: what `contender_config` is to base
CONFIG = TransformerConfig.preset("tiny", norm_first=False, norm_style="standard", norm_eps=1e-5,
                                  pe_layout="halves", dropout=0.0)
CPU = C.Settings(threads=1)
N = 12


@pytest.fixture(scope="module")
def weights():
    """Every tensor random (`init_weights`' zero biases decode one token everywhere in tiny), with
    `bench_weights`' EOS bias: every row decodes exactly the tokens asked."""
    weights = random_weights(CONFIG, 0)
    weights["generator.bias"][CONFIG.eos_id] = -1e9
    return weights


def run(decoder: C.Decoder, src: np.ndarray, n: int) -> np.ndarray:
    return decoder.tokens(decoder.decode(src, n))


def test_transformers_generate_decodes_torch_impls_tokens(weights):
    pytest.importorskip("transformers")
    src = decoding.sources(CONFIG, 4)  # rows of 32, 29, 26, 23 real tokens
    tokens = {name: run(C.CONTENDERS[name](CONFIG, weights, CPU), src, N) for name in ("torch", "transformers")}
    assert tokens["torch"].shape == (4, N)
    assert len({tuple(row) for row in tokens["torch"]}) > 1, "degenerate: every source decodes alike"
    np.testing.assert_array_equal(tokens["transformers"], tokens["torch"])
    line = decoding.check_first_round(tokens, N, CONFIG.pad_id, "float32")
    assert line == "tokens equal to torch_impl's: transformers 100.0%"


def test_beam_size_reaches_every_contender(weights):
    """``--beam-size``: each contender installed here decodes with beam search (every row exactly
    the tokens asked), and transformers' ``generate(num_beams=3)`` gives torch_impl's tokens."""
    beam = C.Settings(threads=1, beam_size=3)
    assert (beam.search, CPU.search) == ("beam 3", "greedy")
    src = decoding.sources(CONFIG, 3)
    tokens = {}
    for name, module in [("torch", "torch"), ("transformers", "transformers"), ("ct2-float32", "ctranslate2"),
                         ("onnx", "onnxruntime")]:
        try:
            __import__(module)
        except ImportError:
            continue
        if name == "transformers" and not C.marian_beam_search_works():  # CONFIG's vocabularies differ
            with pytest.raises(C.Skipped, match="the decoder's .*takes the scores' own width"):
                C.CONTENDERS[name](CONFIG, weights, beam)
            _marian_beam_search_fails(weights, src)
            continue
        decoder = C.CONTENDERS[name](CONFIG, weights, beam)
        assert "beam 3" in decoder.description, decoder.description
        tokens[name] = run(decoder, src, N)
    greedy = run(C.CONTENDERS["torch"](CONFIG, weights, CPU), src, N)
    assert not np.array_equal(tokens["torch"], greedy), "degenerate: beam search found greedy's tokens"
    decoding.check_first_round(tokens, N, CONFIG.pad_id, "float32", greedy=False)  # N tokens a row
    if "transformers" in tokens:
        np.testing.assert_array_equal(tokens["transformers"], tokens["torch"])


def _marian_beam_search_fails(weights, src) -> None:
    """What the transformers contender skips for: this transformers' beam search of a Marian whose
    vocabularies differ fails (`_decoding_contenders.MARIAN_BEAM_SEARCH_FIXED`)."""
    import tempfile

    import transformers

    from shared.exporters.marian import to_marian
    assert CONFIG.src_vocab != CONFIG.tgt_vocab
    with tempfile.TemporaryDirectory() as path:
        to_marian(path, CONFIG, weights)
        model = transformers.MarianMTModel.from_pretrained(path).eval()
    ids = torch.as_tensor(src)
    with pytest.raises(RuntimeError, match="is invalid for input of size"):
        model.generate(input_ids=ids, attention_mask=ids != CONFIG.pad_id, num_beams=3, max_new_tokens=2,
                       decoder_start_token_id=CONFIG.start_id)


def test_first_round_check():
    pad, n = CONFIG.pad_id, 4
    reference = np.arange(3, 3 + 2 * n).reshape(2, n)
    other = reference.copy()
    other[1, 2] += 1
    differ = (r"transformers: tokens differ from torch_impl's \(87.5% equal\) where no near-tie .*: "
              r"item 1: first differs at step 2: token 9 vs 10, margin nan")  # no oracle: refused
    with pytest.raises(AssertionError, match=differ):
        decoding.check_first_round({"torch": reference, "transformers": other}, n, pad, "float32")
    # reported, not refused: another library's float32 (tested in the suite), a half precision
    line = decoding.check_first_round({"torch": reference, "ct2-float32": other}, n, pad, "float32")
    assert line == "tokens equal to torch_impl's: ct2-float32 87.5%"
    line = decoding.check_first_round({"torch": reference, "transformers": other}, n, pad, "bfloat16")
    assert line == "tokens equal to torch_impl's: transformers 87.5%"
    line = decoding.check_first_round({"torch": reference, "transformers": other}, n, pad, "float32",
                                      greedy=False)  # beam search: near-ties of summed scores
    assert line == "tokens equal to torch_impl's: transformers 87.5%"
    assert decoding.check_first_round({"onnx": other}, n, pad, "float32").startswith("tokens not compared")
    short = reference.copy()
    short[0, 3] = pad  # a row that ended early: unequal work
    with pytest.raises(AssertionError, match=r"onnx: expected 4 tokens per row, got lengths \[3 4\]"):
        decoding.check_first_round({"torch": reference, "onnx": short}, n, pad, "float32")
    with pytest.raises(AssertionError, match="expected 4 tokens per row"):
        decoding.check_first_round({"torch": reference[:, :3]}, n, pad, "float32")
    assert decoding.reference_contender(["torch", "ct2-float32", "onnx"]) == "ct2-float32"
    assert decoding.reference_contender(["transformers", "torch"]) == "transformers"


@pytest.mark.parametrize("margin, near_tie", [(4e-6, True), (-4e-6, True), (2e-5, False), (-2e-5, False)])
def test_first_round_check_asks_the_oracle_where_tokens_differ(margin, near_tie):
    """A difference is a near-tie when the oracle's margin between the two tokens is within the
    float32 bound (1e-5) either way (torch_impl's token the better or the worse), asked only for
    the rows that differ, along torch_impl's tokens."""
    n, pad = 4, CONFIG.pad_id
    reference = np.arange(3, 3 + 3 * n).reshape(3, n)
    other = reference.copy()
    other[2, 1] = 5
    asked = []

    def log_probs(rows, tokens):
        asked.append((rows.tolist(), tokens.tolist()))
        out = np.full((len(rows), n, 17), -10.0)
        out[0, 1, reference[2, 1]], out[0, 1, 5] = -1.0, -1.0 - margin
        return out

    tokens = {"torch": reference, "transformers": other}
    if near_tie:
        line = decoding.check_first_round(tokens, n, pad, "float32", log_probs)
        assert line == ("tokens equal to torch_impl's: transformers 91.7% (near-ties: item 2: first "
                        f"differs at step 1: token 12 vs 5, margin {margin:.3g})")
    else:
        with pytest.raises(AssertionError, match=f"item 2: first differs at step 1: token 12 vs 5, margin {margin:.3g}"):
            decoding.check_first_round(tokens, n, pad, "float32", log_probs)
    assert asked == [([2], [reference[2].tolist()])]


def test_oracle_log_probs_follow_the_tokens_given():
    """On the contenders' own model (`contender_config` through `bench_weights`), tiny here: the
    oracle's log-probs along torch_impl's greedy tokens pick those tokens; pad is impossible."""
    src = decoding.sources(CONFIG, 3)
    tokens = run(C.CONTENDERS["torch"](CONFIG, C.bench_weights(CONFIG), CPU), src, 6)
    rows = np.array([0, 2])
    log_probs = decoding.oracle_log_probs(CONFIG, src)(rows, tokens[rows])
    assert log_probs.shape == (2, 6, CONFIG.tgt_vocab) and log_probs.dtype == np.float64
    np.testing.assert_array_equal(log_probs.argmax(axis=-1), tokens[rows])
    assert (log_probs[..., CONFIG.pad_id] == -np.inf).all()


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is present: the contenders run there")
@pytest.mark.parametrize("name, library", [("torch", "torch"), ("transformers", "transformers"),
                                           ("ct2-float32", "ctranslate2"), ("onnx", "onnxruntime")])
def test_without_a_gpu_cuda_contenders_are_skipped(weights, name, library):
    pytest.importorskip(library)
    with pytest.raises(C.Skipped, match=f"^{library} "):
        C.CONTENDERS[name](CONFIG, weights, C.Settings(threads=1, device="cuda"))


def test_device_cuda_without_a_gpu_is_one_clear_error(capsys, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    for name, value in RUNTIME_ENVIRONMENT.items():  # what main sets, undone after the test
        monkeypatch.setenv(name, os.environ.get(name, value))
    assert decoding.main(["--parts", "contenders", "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("decoding.py: --device cuda: no CUDA device (torch ") and err.count("\n") == 1
