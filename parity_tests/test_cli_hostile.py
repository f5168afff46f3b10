"""Command lines a probe found hostile: an option the help documents but the command ignored, an
empty path read as "not given", a comparison of nothing that passed, a batch the OOM killer ended,
a learning rate of exactly 0, integers in other scripts' digits, messages naming no option.

Each runs `twins.cli.main` in this process (a usage error that argparse reports is returned as its
exit status, like the others) on tiny presets; docs/design.md's error rule: one line naming the
option as typed, what was expected and what was got, exit 2, nothing written.
"""
from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from parity_tests.cli_runs import cli
from shared import TransformerConfig
from shared.checks import int_argument
from shared.config import FLOAT32_TINY
from shared.schedule import noam_lr
from shared.weights import random_weights, save_checkpoint
from twins import arguments

TINY = TransformerConfig.preset("tiny")
# The training backend of the CLI tests below (none of them gets as far as building a model).
BACKEND = "torch" if importable.present("torch") else "tf"
SMALL = ["--src-len", "3", "--tgt-len", "2"]


def refused(capsys, command: str, expected: str, *argv) -> str:
    """``twins COMMAND ARGV`` fails as a usage error: exit 2, one line (argparse's own errors too)
    ``twins COMMAND: error: ...`` containing ``expected``."""
    code, out, err = cli(capsys, command, *argv)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert code == 2, (code, out, err)
    assert len(err.strip().splitlines()) == 1 and last.startswith(f"twins {command}: error: "), err
    assert expected in last, last
    return last


@pytest.fixture(scope="module")
def tiny_checkpoint(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("hostile") / "ck"
    save_checkpoint(path, TINY, random_weights(TINY, 1))
    return path


# -- 1. --config for a file that holds none: decode read it never; compare could not take it --------
@pytest.fixture(scope="module")
def bare_state_dict(tiny_checkpoint) -> tuple[Path, Path]:
    """A .pt holding a bare torch_impl state dict, and its config as JSON."""
    torch = pytest.importorskip("torch")
    import torch_impl
    root = tiny_checkpoint.parent
    torch.save(torch_impl.load_checkpoint(tiny_checkpoint).state_dict(), root / "bare.pt")
    (root / "cfg.json").write_text(TINY.to_json())
    return root / "bare.pt", root / "cfg.json"


@pytest.mark.torch
def test_decode_reads_the_config_of_a_bare_state_dict(bare_state_dict, tiny_checkpoint, capsys):
    """Before: "'bare.pt': holds a bare state dict and no config: pass the config (config=...,
    --config FILE.json)" though --config was passed (`loading.config_of` dropped it whenever
    --checkpoint was set)."""
    bare, config = bare_state_dict
    code, out, err = cli(capsys, "decode", "--checkpoint", bare, "--config", config, "--src", "4 5",
                         "--max-new", "5")
    assert code == 0, err
    assert out == cli(capsys, "decode", "--checkpoint", tiny_checkpoint, "--src", "4 5", "--max-new", "5")[1]
    # without it, the advice names --config, now true for compare as for decode and convert
    refused(capsys, "decode", "--config FILE.json", "--checkpoint", bare, "--src", "4 5")
    refused(capsys, "compare", "--config FILE.json", "--checkpoint", bare, "--backends", "torch", *SMALL)


@pytest.mark.torch
def test_compare_takes_config_with_a_checkpoint_that_holds_none(bare_state_dict, tiny_checkpoint, capsys):
    """Before: --config and --checkpoint were mutually exclusive, while the error for a bare state
    dict told the user to pass --config."""
    bare, config = bare_state_dict
    code, out, err = cli(capsys, "compare", "--checkpoint", bare, "--config", config, "--backends",
                         "torch", *SMALL)
    assert code == 0, err
    assert "PASS: all" in out and "torch vs reference" in out
    # a file that holds its config refuses another by name; --preset and --config are one source
    refused(capsys, "compare", "--config: --from neutral holds its config; do not pass one",
            "--checkpoint", tiny_checkpoint, "--config", config, "--backends", "")
    refused(capsys, "compare", f"--config {str(config)!r} with --preset tiny: give one of them",
            "--preset", "tiny", "--config", config, "--backends", "")


# -- 2. an empty path is no path -------------------------------------------------------------------
@pytest.mark.parametrize("argv", [
    # Before: the random "small" preset ran, PASS, exit 0.
    ["compare", "--checkpoint", ""],
    ["compare", "--config", ""],
    ["decode", "--checkpoint", "ck", "--config", "", "--src", "4 5"],
    ["convert", "a", "b", "--config", ""],
], ids=["compare --checkpoint", "compare --config", "decode --config", "convert --config"])
def test_an_empty_path_is_refused_not_replaced_by_a_default(argv, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    flag = argv[argv.index("") - 1]
    refused(capsys, argv[0], f"argument {flag}: expected a path, got ''", *argv[1:])
    assert not list(tmp_path.iterdir())


def test_the_shared_path_and_preset_types():
    """`twins.arguments.path` / `preset`: the argparse types every command's path and preset
    options share (``train --preset ''`` and ``--config ''`` ran the task's default model)."""
    assert arguments.path("x.json") == "x.json" and arguments.preset("tiny") == "tiny"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected a path, got ''$"):
        arguments.path("")
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"^expected a path without a NUL character, got 'a\\x00b'$"):
        arguments.path("a\0b")  # Python's "embedded null byte" named nothing
    for bad in ("", "foo"):
        with pytest.raises(argparse.ArgumentTypeError,
                           match=rf"^expected one of base, big, small, tiny, got {bad!r}$"):
            arguments.preset(bad)


# -- 3. a comparison of nothing fails -----------------------------------------------------------------
@pytest.mark.parametrize("decode", [[], ["--decode"]], ids=["forward", "decode"])
def test_onnx_with_bfloat16_is_refused_up_front(decode, capsys, tmp_path):
    """Before: "skipped onnx ...", "nothing to compare", "pass": true, exit 0."""
    out = tmp_path / "r.json"
    refused(capsys, "compare", "--backends onnx with --dtype bfloat16: the ONNX export computes in "
                               "float32, float64 or float16, not bfloat16",
            "--preset", "tiny", "--dtype", "bfloat16", "--backends", "onnx", *decode, "--json", out)
    assert not out.exists()


@pytest.mark.parametrize("backends", ["torch,tf", ""], ids=["all-skipped", "none-named"])
def test_a_comparison_that_compared_nothing_fails(backends, monkeypatch, capsys, tmp_path):
    """Every backend skipped at run time (not installed) or none named: the table says FAIL, the
    JSON "pass": false, exit 1 (a failed check, not a usage error: it is known only once run)."""
    from twins import backends as adapters
    from twins import compare
    make = adapters.make_adapter

    def missing(name, *args, **kwargs):
        if name != "reference":
            raise adapters.Unavailable(name, ImportError("planted"))
        return make(name, *args, **kwargs)
    monkeypatch.setattr(compare, "make_adapter", missing)
    out = tmp_path / "r.json"
    code, text, err = cli(capsys, "compare", "--preset", "tiny", "--backends", backends, *SMALL,
                          "--decode", "--max-new", "2", "--json", out)
    assert code == 1, err
    assert "FAIL: nothing was compared" in text and "PASS" not in text
    assert json.loads(out.read_text())["pass"] is False


# -- 4. --batch bounded by the memory, before anything is built --------------------------------------
def test_a_batch_past_the_memory_is_refused_before_anything_is_built(monkeypatch, capsys):
    """Before: ``--batch 100000000`` was killed by the kernel's OOM killer (exit 137, no message)."""
    from twins import compare
    made = lambda *args, **kwargs: pytest.fail("built")  # noqa: E731
    monkeypatch.setattr(compare, "random_weights", made)
    monkeypatch.setattr(compare, "src_tgt", made)
    monkeypatch.setattr(compare, "total_memory", lambda: 2**30)
    last = refused(capsys, "compare", "--batch 100000000: at --src-len 16 and --tgt-len 12 the traces of "
                   "reference (held at once) need at least 9,", "--preset", "tiny", "--backends", "",
                   "--batch", "100000000")
    assert last.endswith("more than this machine's 1.0 GiB; give a smaller --batch"), last
    # each backend that can run here holds its trace too (in the model's dtype)
    present = [b for b in ("torch", "tf") if importable.present(b)]
    last = refused(capsys, "compare", f"the traces of {', '.join(['reference', *present])} (held at once)",
                   "--preset", "tiny", "--batch", "100000000")


def test_the_batch_bound_counts_the_traces_exactly():
    """`twins.compare.trace_bytes` is the size of the traces themselves (the reference's, float64,
    here measured), so the bound refuses no batch whose traces fit."""
    from shared import reference as R
    from shared.batches import src_tgt
    from twins.compare import trace_bytes
    for config in (TINY, TINY.replace(norm_first=False, final_norm=False)):
        weights = random_weights(config, 0)
        src, tgt = src_tgt(config, 3, 5, 4, seed=0)
        _, trace = R.forward(weights, config, src, tgt, return_trace=True)
        assert trace_bytes(config, 3, 5, 4, []) == sum(np.asarray(v).nbytes for v in trace.values())
        assert trace_bytes(config, 3, 5, 4, ["torch"]) == 3 * trace_bytes(config, 3, 5, 4, []) // 2


# -- 5. a learning rate that float32 rounds to 0 ------------------------------------------------------
def test_noam_refuses_a_peak_rate_below_float32s_normals():
    """The optimizers' rate is float32: a peak below its smallest normal is a subnormal or 0 there.
    Before: ``--factor 1e-320`` trained at a rate of exactly 0 (exit 0, no weight changed)."""
    for factor in (1e-320, 1e-37):
        with pytest.raises(ValueError, match=r"^noam_lr: factor expected a peak rate factor \* "
                                             r"d_model\*\*-0\.5 \* warmup\*\*-0\.5 that float32 holds "
                                             r"as a normal number \(>= 1\.175e-38\), got factor="):
            noam_lr(1, 512, 4000, factor)
    lowest = FLOAT32_TINY * (512 * 4000) ** 0.5 * (1 + 1e-12)  # a peak just above the bound
    assert np.float32(noam_lr(4000, 512, 4000, lowest)) >= FLOAT32_TINY


def test_train_refuses_a_factor_whose_rate_is_zero(tmp_path, capsys):
    run = tmp_path / "run"
    refused(capsys, "train", "--factor 1e-320 with --warmup 400 and d_model 64: factor expected a peak "
                             "rate factor * d_model**-0.5 * warmup**-0.5 that float32 holds as a "
                             "normal number (>= 1.175e-38), got factor=1e-320",
            "--task", "copy", "--backend", BACKEND, "--steps", "1", "--checkpoint", run,
            "--factor", "1e-320", "--no-progress")
    assert not run.exists()


# -- 6. integers: an optional sign and ASCII digits --------------------------------------------------
@pytest.mark.parametrize("text", ["\u0663", "1_0", " 3", "3 ", "\uff13", "0x10", "", "+", "1e3"])
def test_int_argument_takes_ascii_digits_only(text):
    """int() takes "1_0" (10), Arabic-Indic and fullwidth digits, spaces: each ran as a count."""
    expected = rf"^expected an int in \[0, 99\] \(ASCII digits\), got {re.escape(repr(text))}$"
    with pytest.raises(argparse.ArgumentTypeError, match=expected):
        int_argument(text, 0, 99)


def test_int_argument_keeps_signs_ranges_and_huge_values():
    assert int_argument("+7", 0) == 7 and int_argument("-3") == -3 and int_argument("007", 0, 9) == 7
    with pytest.raises(argparse.ArgumentTypeError, match=r"^expected an int >= 0, got -1$"):
        int_argument("-1", 0)
    with pytest.raises(argparse.ArgumentTypeError,
                       match=r"^expected an int, got '9{80}'\.\.\. \(5,000 characters\)$"):
        int_argument("9" * 5000)  # past Python's 4300-digit conversion limit


@pytest.mark.parametrize("argv, expected", [
    (["decode", "--checkpoint", "ck", "--heldout", "1_0"],
     "argument --heldout: expected an int in [1, 100000] (ASCII digits), got '1_0'"),
    (["figures", "--out", "figs", "--dpi", "\u0661\u0662\u0660"],
     "argument --dpi: expected an int in [20, 600] (ASCII digits), got '\u0661\u0662\u0660'"),
    (["compare", "--preset", "tiny", "--batch", "\u0663"],
     "argument --batch: expected an int (ASCII digits), got '\u0663'"),
    (["compare", "--preset", "tiny", "--src-len", "1_6"],
     "argument --src-len: expected an int (ASCII digits), got '1_6'"),
    (["compare", "--preset", "tiny", "--threads", "\u0661"],
     "argument --threads: expected an int (ASCII digits), got '\u0661'"),
    (["convert", "a.pt", "b", "--n-heads", "\u0664"],  # a format's own int option
     "argument --n-heads: expected an int (ASCII digits), got '\u0664'"),
    (["compare", "--seed", "\u0663"], "argument --seed: expected an int in [0, 2147483647] (ASCII digits)"),
])
def test_integer_options_refuse_other_digits(argv, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    refused(capsys, argv[0], expected, *argv[1:])
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("value", ["-inf", "-nan", "-1e3"])
def test_a_number_argparse_reads_as_an_option_reaches_the_options_own_check(value, capsys, tiny_checkpoint):
    """Before: ``--length-penalty -inf`` got argparse's "expected one argument" (it takes ``-1``
    and ``-0.5`` for numbers, not ``-inf``, ``-nan`` or ``-1e3``) while ``--length-penalty=-inf``
    got the option's own message; now both spellings get the latter, and a flag that takes no
    value still refuses the token."""
    expected = refused(capsys, "decode", "--length-penalty: expected a finite float >= 0", "--checkpoint",
                       str(tiny_checkpoint), "--heldout", "1", "--beam", "2", f"--length-penalty={value}")
    assert refused(capsys, "decode", "", "--checkpoint", str(tiny_checkpoint), "--heldout", "1", "--beam",
                   "2", "--length-penalty", value) == expected
    refused(capsys, "compare", f"unrecognized arguments: {value}", "--preset", "tiny", "--decode", value)
    refused(capsys, "compare", f"argument --src-len: expected an int (ASCII digits), got '{value}'",
            "--preset", "tiny", "--src-len", value)


# -- 7. the option as typed -------------------------------------------------------------------------
def test_a_directory_that_is_no_checkpoint_names_the_option(tmp_path, capsys, monkeypatch):
    """Before: "load_checkpoint: missing 'config.json'" (a function's name, no option, no path)."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, "compare", "--checkpoint '.': not a neutral checkpoint (missing 'config.json')",
            "--checkpoint", ".")
    (tmp_path / "empty").mkdir()
    refused(capsys, "compare", "--checkpoint 'empty': not a neutral checkpoint (missing "
                               "'empty/config.json')", "--checkpoint", "empty")
    refused(capsys, "convert", "SRC 'empty': not a neutral checkpoint", "empty", "out.pt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty"]


@pytest.mark.parametrize("argv", [
    ["compare", "--config", "nonexist.json"],
    ["train", "--task", "copy", "--backend", BACKEND, "--steps", "1", "--checkpoint", "run",
     "--config", "nonexist.json", "--no-progress"],
], ids=["compare", "train"])
def test_a_missing_config_file_names_the_option(argv, tmp_path, capsys, monkeypatch):
    """Before: "'nonexist.json': No such file or directory" (no option)."""
    monkeypatch.chdir(tmp_path)
    refused(capsys, argv[0], "--config 'nonexist.json': no such file or directory", *argv[1:])
    assert not list(tmp_path.iterdir())


def test_decode_and_convert_take_paths_and_integers_as_typed(capsys, tiny_checkpoint, tmp_path,
                                                              monkeypatch):
    """decode's counts are ASCII digits like its ids (``int`` took "١" and "1_0"); an empty
    --src-file read as "not given" ("nothing to decode"); ``convert CK ''`` and ``convert CK .``
    tried to replace the current directory and failed after reading ('.': Device or resource
    busy), which would leave a shell in a deleted directory where the rename succeeds."""
    ck = str(tiny_checkpoint)
    for option, value in (("--max-new", "\u0663"), ("--beam-size", "1_0"), ("--threads", " 1")):
        refused(capsys, "decode", f"argument {option}: expected an int (ASCII digits), got {value!r}",
                "--checkpoint", ck, "--src", "4 5", option, value)
    refused(capsys, "decode", "argument --src-file: expected a path, got ''", "--checkpoint", ck,
            "--src-file", "")
    refused(capsys, "convert", "argument DST: expected a path, got ''", ck, "")
    (tmp_path / "a" / "b").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "a" / "b")
    for here in (".", str(tmp_path / "a")):
        refused(capsys, "convert", "is the current directory or holds it, which a save would replace",
                ck, here)
    assert [p.name for p in tmp_path.rglob("*")] == ["a", "b"]


def test_decode_refuses_a_config_for_an_onnx_export(capsys, tiny_checkpoint, tmp_path):
    """An ONNX export computes the config in its config.json: a --config beside it was ignored."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnx")
    export = tmp_path / "export"
    assert cli(capsys, "convert", str(tiny_checkpoint), str(export), "--to", "onnx")[0] == 0
    other = tmp_path / "other.json"
    other.write_text(TINY.replace(n_heads=2).to_json())
    refused(capsys, "decode", "--config: --checkpoint", "--checkpoint", str(export), "--backend", "onnx",
            "--config", str(other), "--src", "4 5")


def test_options_that_would_be_ignored_are_refused(capsys, tiny_checkpoint, tmp_path):
    """``train --stop-at`` with ``--eval-every 0`` (evaluated only at the end: nothing to stop at)
    and ``decode --task`` with ids (decoded whatever the task) were accepted and ignored."""
    refused(capsys, "train", "--stop-at: stops at an evaluation during training, and --eval-every 0",
            "--task", "copy", "--backend", BACKEND, "--steps", "1", "--checkpoint", tmp_path / "run",
            "--eval-every", "0", "--stop-at", "0.5")
    assert not (tmp_path / "run").exists()
    refused(capsys, "decode", "--task: only with INPUT arguments or --heldout, not --src / --src-file",
            "--checkpoint", tiny_checkpoint, "--task", "copy", "--src", "4 5")


def test_options_of_work_not_asked_for_are_refused(capsys, tiny_checkpoint, tmp_path):
    """A probe of random option values found four more options read nowhere: ``compare`` without
    ``--checkpoint`` took ``--from`` and every format option (``--n-heads 3``, ``--pad-id 8``) and
    compared its random model as if none were given, and ``--max-new`` without ``--decode``;
    ``convert --seed`` without ``--verify``; ``train --timeout`` without torch's ``--workers``."""
    for drawn, source in (("--preset tiny", ["--preset", "tiny"]), ("--preset small", [])):
        refused(capsys, "compare", f"--from, --n-heads, --pad-id: only with --checkpoint (they describe the "
                f"file read), not {drawn}, whose weights are drawn at random", *source, "--n-heads", "3",
                "--pad-id", "8", "--from", "nn-transformer")
    config = tmp_path / "tiny.json"
    config.write_text(TINY.to_json())
    refused(capsys, "compare", f"--allow-nonfinite: only with --checkpoint (they describe the file read), "
            f"not --config {str(config)!r}", "--config", config, "--allow-nonfinite", "true")
    refused(capsys, "compare", "--max-new: the tokens --decode decodes, and --decode is not given",
            "--preset", "tiny", "--max-new", "4")
    refused(capsys, "convert", "--seed: seeds the batch of --verify, and --verify is not given",
            tiny_checkpoint, tmp_path / "out", "--to", "neutral", "--seed", "3")
    assert not (tmp_path / "out").exists()
    train = ["--task", "copy", "--steps", "1", "--checkpoint", tmp_path / "run", "--timeout", "60"]
    refused(capsys, "train", "--timeout: how long a collective of torch's --workers waits, and --workers is "
            "not given", "--backend", "torch", *train)
    refused(capsys, "train", "--timeout: how long a collective of torch's --workers waits, and --backend tf "
            "runs its workers in one process", "--backend", "tf", *train, "--workers", "2")
    assert not (tmp_path / "run").exists()
    # with what they serve, each is taken: --checkpoint with its format's options (here none);
    # --max-new with --decode, --seed with --verify and --timeout with torch's --workers elsewhere
    # (test_cli_compare.py, test_hostile_files.py, test_train_hostile.py)
    code, out, err = cli(capsys, "compare", "--checkpoint", tiny_checkpoint, "--from", "neutral",
                         *SMALL, "--backends", "")
    assert "only with --checkpoint" not in err and code == 1, err  # it compared nothing: exit 1
