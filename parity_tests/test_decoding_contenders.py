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


def test_first_round_check():
    pad, n = CONFIG.pad_id, 4
    reference = np.arange(3, 3 + 2 * n).reshape(2, n)
    other = reference.copy()
    other[1, 2] += 1
    differ = r"transformers: tokens differ .* at 1 of 8 positions, first row 1, step 2"
    with pytest.raises(AssertionError, match=differ):
        decoding.check_first_round({"torch": reference, "transformers": other}, n, pad, "float32")
    # reported, not refused: another library's float32 (tested in the suite), a half precision
    line = decoding.check_first_round({"torch": reference, "ct2-float32": other}, n, pad, "float32")
    assert line == "tokens equal to torch_impl's: ct2-float32 87.5%"
    line = decoding.check_first_round({"torch": reference, "transformers": other}, n, pad, "bfloat16")
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
