"""bfloat16 mixed precision in both backends (torch.autocast / Keras mixed_bfloat16): float32 weights
and loss, bfloat16 products; against the float64 reference and against each other, within the
measured bounds of `shared.tolerances` ("bfloat16" entries; the full table is
benchmarks/bf16_parity.py's, in docs/demos.md). One tiny model, seed 0, to stay fast."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("tensorflow")

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import bf16_parity as measure  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.tolerances import bound_for  # noqa: E402
from shared.weights import random_weights  # noqa: E402

CONFIG = TransformerConfig.preset("tiny", dropout=0.0)
PAIRS = ("torch:reference", "tf:reference", "torch:tf")


@pytest.fixture(scope="module")
def case():
    weights = random_weights(CONFIG, 0)
    return weights, measure.batch(CONFIG, 0)


def check(row: dict, prefix: str) -> None:
    for pair in PAIRS:
        limit = bound_for("bfloat16", f"{prefix}{pair}").rtol
        assert 0.0 < row[pair] <= limit, (pair, row[pair], limit)  # > 0: bfloat16 really ran


def test_forward_every_intermediate(case):
    row = measure.forward_row(CONFIG, *case)
    check(row, "")
    check({p: row[f"trace {p}"] for p in PAIRS}, "")
    # Much further from the oracle than float32 (3e-6): the bfloat16 products did run.
    assert row["torch:reference"] > 10 * bound_for("float32", "torch:reference").rtol


def test_gradients(case):
    check(measure.gradient_row(CONFIG, *case), "grad:")


def test_training_steps(case):
    row = measure.training_row(CONFIG, case[0], 5, 0)
    check(row, "train:")


def test_weights_stay_float32_and_logits_are_bfloat16(case):
    from tf_impl import precision as tf_precision
    from torch_impl import precision as torch_precision
    weights, (src, tgt_in, _) = case
    t, f = measure.models(CONFIG, weights, "bf16")
    with torch.no_grad():
        assert t(torch.from_numpy(src), torch.from_numpy(tgt_in)).dtype == torch.bfloat16
    assert f(src, tgt_in).dtype.name == "bfloat16"
    assert {v.dtype for v in t.export_weights().values()} == {np.dtype("float32")}
    assert {v.dtype for v in f.export_weights().values()} == {np.dtype("float32")}
    for module in (torch_precision, tf_precision):
        assert module.set_precision(t if module is torch_precision else f, "float32") == "bfloat16"
    with torch.no_grad():
        assert t(torch.from_numpy(src), torch.from_numpy(tgt_in)).dtype == torch.float32


@pytest.mark.parametrize("precision, dtype, needle", [
    ("bf16", "float64", "bfloat16 mixed precision needs a float32 model, got dtype=float64"),
    ("half", "float32", "precision: expected one of"),
])
def test_bad_precision(precision, dtype, needle):
    from tf_impl import Transformer as TFTransformer
    from tf_impl.precision import set_precision as tf_set
    from torch_impl import Transformer as TorchTransformer
    from torch_impl.precision import set_precision as torch_set
    config = CONFIG.replace(dtype=dtype)
    for build, set_precision in ((TorchTransformer, torch_set), (TFTransformer, tf_set)):
        with pytest.raises(ValueError, match=needle):
            set_precision(build(config), precision)


def test_the_precision_api_names_a_model_that_is_none_alike():
    """`compute_dtype(None)` raised an AttributeError naming ``config`` in both backends, where
    `set_precision` named the model."""
    from tf_impl import precision as tf_precision
    from torch_impl import precision as torch_precision
    for module, framework in ((torch_precision, "torch_impl"), (tf_precision, "tf_impl")):
        for call in (module.compute_dtype, lambda model: module.set_precision(model, "bf16")):
            for model in (None, CONFIG):
                with pytest.raises(TypeError, match=rf"^model: expected a {framework}.Transformer, got "):
                    call(model)


def test_cli_compare_and_train_in_bfloat16(tmp_path, capsys):
    import json
    from twins.cli import main
    assert main(["compare", "--preset", "tiny", "--dtype", "bfloat16", "--backends", "torch"]) == 0
    assert "bfloat16 mixed precision" in capsys.readouterr().out
    run = tmp_path / "run"
    assert main(["train", "--task", "copy", "--backend", "torch", "--steps", "2", "--batch", "8",
                 "--eval-every", "0", "--heldout", "4", "--no-progress", "--precision", "bf16",
                 "--checkpoint", str(run)]) == 0
    log = json.loads((run / "train_log.json").read_text())
    assert log["settings"]["precision"] == "bfloat16" and np.isfinite(log["history"]["loss"]).all()


def test_every_command_spells_a_precision_alike(tmp_path, capsys):
    """`twins train --precision` took fp32 / bf16 only, `twins decode --precision` float32 /
    bfloat16 / float16 only: each refused the other's spelling of the same precision. Every command
    now takes `shared.precision`'s names and its short ones, and keeps the canonical name (a log
    from before, which says bf16, resumes and is written bfloat16); float16 training is refused
    with its reason (no loss scaling) while the command line is parsed."""
    import json
    from twins.cli import main
    from twins.runs import LOG_FILE
    run = tmp_path / "run"
    train = ["train", "--task", "copy", "--backend", "torch", "--steps", "1", "--batch", "4",
             "--eval-every", "0", "--heldout", "2", "--no-progress", "--checkpoint", str(run)]
    assert main(train + ["--precision", "bfloat16"]) == 0
    log = json.loads((run / LOG_FILE).read_text())
    assert log["settings"]["precision"] == "bfloat16"
    log["settings"]["precision"] = "bf16"  # as a run from before the canonical names says it
    (run / LOG_FILE).write_text(json.dumps(log))
    assert main(train) == 0
    assert "precision=bfloat16" in capsys.readouterr().out
    assert json.loads((run / LOG_FILE).read_text())["settings"]["precision"] == "bfloat16"
    for name in ("float16", "fp16"):
        with pytest.raises(SystemExit) as exit:
            main(train + ["--precision", name])
        assert exit.value.code == 2
        assert (f"argument --precision: expected one of float32, bfloat16, got {name!r} (float16 "
                "training needs loss scaling") in capsys.readouterr().err
    assert json.loads((run / LOG_FILE).read_text())["step"] == 2  # nothing ran
    for name, canonical in (("bf16", "bfloat16"), ("fp16", "float16"), ("fp32", "float32")):
        assert main(["decode", "--checkpoint", str(run), "--src", "5 6 7", "--max-new", "3",
                     "--precision", name, "--json", "-"]) == 0
        assert json.loads(capsys.readouterr().out)["precision"] == canonical
    with pytest.raises(SystemExit):
        main(["decode", "--checkpoint", str(run), "--src", "5", "--precision", "half"])
    assert "argument --precision: expected one of float32, bfloat16, float16, got 'half'" in \
        capsys.readouterr().err
