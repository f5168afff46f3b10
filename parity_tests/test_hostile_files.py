"""Files that are not what they seem, and arguments that would overflow: a FIFO or a device where a
file is read or written, symbolic links, JSON nested or numbered past what Python parses, a
config asking for more layers than its weights hold, tensors NumPy cannot load, fields of a .pt
that are not the plain values they must be, and a length penalty that overflows float32. Each is
refused before anything is read or written, naming the argument, the same in every backend; a
destination that is refused is left as it was.
"""
from __future__ import annotations

import json
import os
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from shared import TransformerConfig
from shared import reference as R
from shared.decoding_args import check_length_penalty
from shared.paths import check_source, read_json
from shared.saving import replace_directory, write_atomically
from shared.tolerances import assert_close, bound_for
from shared.weights import WeightsError, check_weights, init_weights, load_checkpoint, save_checkpoint
from twins.cli import main

TINY = TransformerConfig.preset("tiny", dropout=0.0)
NO_FIFO = not hasattr(os, "mkfifo")


def _write(text: str):
    return lambda tmp: Path(tmp).write_text(text)


@pytest.mark.skipif(NO_FIFO, reason="no FIFOs on this OS")
def test_a_save_refuses_what_it_would_not_make_and_follows_links(tmp_path):
    """A FIFO (or a device) at a destination is refused by a file save and a directory save, and
    stays a FIFO; a directory save refuses a regular file; a link is followed: its target is
    replaced, the link stays; a loop of links is named."""
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    with pytest.raises(FileExistsError, match=r"'.*fifo': is a FIFO; refusing to replace it with a file"):
        write_atomically(fifo, _write("x"))
    with pytest.raises(FileExistsError, match="is a FIFO; refusing to replace it with a directory"):
        replace_directory(fifo, lambda staging: None)
    assert fifo.is_fifo()
    plain = tmp_path / "plain"
    plain.write_text("mine")
    with pytest.raises(FileExistsError, match="is a regular file; refusing to replace it with a directory"):
        replace_directory(plain, lambda staging: None)
    assert plain.read_text() == "mine"
    (tmp_path / "link").symlink_to(plain)
    write_atomically(tmp_path / "link", _write("new"))
    assert (tmp_path / "link").is_symlink() and plain.read_text() == "new"
    (tmp_path / "dir").mkdir()
    (tmp_path / "dir_link").symlink_to(tmp_path / "dir")
    replace_directory(tmp_path / "dir_link", lambda staging: (staging / "a").write_text("1"))
    assert (tmp_path / "dir_link").is_symlink() and os.listdir(tmp_path / "dir") == ["a"]
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    with pytest.raises(OSError, match="a loop of symbolic links"):
        write_atomically(tmp_path / "loop1", _write("x"))


@pytest.mark.skipif(NO_FIFO or not os.path.exists("/dev/zero"), reason="no FIFOs or /dev/zero here")
def test_a_source_that_never_ends_or_blocks_is_refused_before_it_is_read(tmp_path):
    """/dev/zero would fill the memory of a reader that takes it for a file, a FIFO block it: both
    are refused by the format registry, each backend's reader and the JSON reader, without
    opening them (a FIFO nobody writes to would hang the open)."""
    from shared import formats
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    readers = [formats.read, lambda p: formats.read(p, "torch"), lambda p: read_json(p, "--config")]
    for module in ("torch_impl.checkpoints", "tf_impl.checkpoints"):
        try:
            checkpoints = __import__(module, fromlist=["read_checkpoint"])
        except ImportError:  # one framework installed: the other backend's reader is not there
            continue
        # read_native too, each backend's own file alone: torch_impl's read /dev/zero without end
        readers += [checkpoints.read_checkpoint, checkpoints.read_native]
    for read in readers:
        with pytest.raises(ValueError, match=r"'/dev/zero': expected a regular file.*got a character device"):
            read("/dev/zero")
        with pytest.raises(ValueError, match="got a FIFO"):
            read(fifo)
    with pytest.raises(ValueError, match=r"^--src-file '/dev/null': expected a regular file, got a character device$"):
        check_source("/dev/null", "--src-file", directory=False)
    check_source(tmp_path / "absent")  # the reader says "no such file" in its own words


@pytest.mark.parametrize("text, why", [
    ("[" * 100_000 + "]" * 100_000, "nested too deeply to read"),
    ('{"d_model": ' + "9" * 5000 + "}", "Exceeds the limit"),
    ('{"d_model": ', "Expecting value"),
])
def test_json_python_cannot_parse_is_a_value_error_naming_the_file(tmp_path, text, why):
    path = tmp_path / "config.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=rf"^--config '.*config.json': not valid JSON \(.*{why}"):
        read_json(path, "--config")
    path.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ValueError, match="expected UTF-8 text, got byte 0xff at offset 7"):
        read_json(path)


def test_a_key_given_twice_is_refused_naming_it(tmp_path):
    """Python's JSON reader keeps a repeated key's last value, others its first: a config.json with
    d_model twice built a model of the second without a word. Every config, log and header the
    project reads as JSON (`read_json`, `TransformerConfig.from_json`, a .keras file's config) goes
    through `shared.config.parse_json`, which names the key (in nested objects too)."""
    from shared import TransformerConfig
    path = tmp_path / "config.json"
    for text, key in [('{"d_model": 16, "n_heads": 4, "d_model": 32}', "d_model"),
                      ('{"settings": {"batch": 8, "batch": 9}}', "batch")]:
        path.write_text(text)
        with pytest.raises(ValueError, match=rf"^--config '.*config.json': the key '{key}' appears twice "
                                             r"in one object \(which value is meant is ambiguous"):
            read_json(path, "--config")
    with pytest.raises(ValueError, match="^TransformerConfig.from_json: the key 'd_model' appears twice"):
        TransformerConfig.from_json(TINY.to_json()[:-1] + ', "d_model": 32}')
    path.write_text('[{"a": 1}, {"a": 2}]')  # one key each: fine
    assert read_json(path) == [{"a": 1}, {"a": 2}]


def test_a_config_asking_far_more_than_the_weights_hold_is_refused_from_their_counts(monkeypatch):
    """A config asking for 10**9 layers (a config.json may) against a tiny model's weights: one line
    from the counts, no schema of that size built; a config one layer past them still has every
    missing tensor named."""
    weights = init_weights(TINY, 0)
    import shared.weights as neutral
    schema = neutral.weight_schema
    monkeypatch.setattr(neutral, "weight_schema", lambda config: pytest.fail("a schema was built")
                        if config.n_encoder_layers > 2 else schema(config))
    with pytest.raises(WeightsError) as err:
        check_weights(TINY.replace(n_encoder_layers=10**9), weights)
    assert [p.split(" (")[0] for p in err.value.problems] == [
        "the config needs 16,000,000,060 tensors, these weights hold 92",
        "the config needs 2,224,000,007,521 values, these weights hold 11,969"]
    with pytest.raises(WeightsError, match=r"missing: \['decoder.layers.2.self_attn.query.kernel'"):
        check_weights(TINY.replace(n_decoder_layers=3), weights)


@pytest.mark.parametrize("backend", ["torch", "tf"])
def test_a_native_file_whose_config_asks_far_more_than_it_holds_is_refused_unbuilt(tmp_path, backend,
                                                                                   monkeypatch):
    """A .pt or .weights.h5 whose stored config asks for 10**6 decoder layers: refused from the
    file's own counts before the reader builds the config's layout (a model of that size, which
    took minutes)."""
    weights = init_weights(TINY, 0)
    if backend == "torch":
        torch = pytest.importorskip("torch")
        from torch_impl import checkpoints as native
        native.write_checkpoint(tmp_path / "m.pt", TINY, weights)
        obj = torch.load(tmp_path / "m.pt", weights_only=True)
        huge = json.loads(obj["config"]) | {"n_decoder_layers": 10**6}
        torch.save({**obj, "config": json.dumps(huge)}, tmp_path / "huge.pt")
        path, what = tmp_path / "huge.pt", "keys"
    else:
        pytest.importorskip("tensorflow")
        import h5py
        from tf_impl import checkpoints as native
        native.write_checkpoint(tmp_path / "m.weights.h5", TINY, weights)
        with h5py.File(tmp_path / "m.weights.h5", "r+") as f:
            huge = json.loads(f.attrs[native.ATTR_CONFIG]) | {"n_decoder_layers": 10**6}
            f.attrs[native.ATTR_CONFIG] = json.dumps(huge)
        path, what = tmp_path / "m.weights.h5", "datasets"
    monkeypatch.setattr(native, "native_layout", lambda config: pytest.fail("a layout was built"))
    with pytest.raises(WeightsError, match=rf"the config needs 26,000,\d+ {what}, these weights hold 92 "
                                           r"\(n_encoder_layers=2, n_decoder_layers=1000000, d_model=16\)"):
        native.read_checkpoint(path)
    # A file short of a tensor or a layer still has each missing one named (test_shared_checkpoints).


def _safetensors(path: Path, tensors: dict[str, tuple[str, tuple, bytes]]) -> None:
    """A safetensors file written by hand: ``{name: (dtype code, shape, raw bytes)}``."""
    header, offset = {}, 0
    for name, (dtype, shape, data) in tensors.items():
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + b"".join(d for _, _, d in tensors.values()))


def test_a_tensor_numpy_cannot_load_is_named_with_its_dtype(tmp_path):
    """bfloat16 or float8 in a neutral checkpoint: refused naming the file, the tensor and the dtype
    (safetensors' NumPy loader names neither)."""
    weights = init_weights(TINY, 0)
    save_checkpoint(tmp_path / "ck", TINY, weights)
    name = "generator.bias"
    tensors = {k: ("F32", v.shape, v.astype("<f4").tobytes()) for k, v in weights.items()}
    tensors[name] = ("BF16", weights[name].shape, (weights[name].astype("<f4").view("<u4") >> 16)
                     .astype("<u2").tobytes())
    _safetensors(tmp_path / "ck" / "model.safetensors", tensors)
    with pytest.raises(WeightsError, match=rf"(?s)model.safetensors.*{name}: expected dtype float32, got BF16"):
        load_checkpoint(tmp_path / "ck")


def test_fields_of_a_pt_that_are_not_plain_values_are_named(tmp_path):
    """A .pt whose format_version is a tensor (compared element-wise it would raise torch's own
    error), or whose state dict holds a tensor without values (the meta device)."""
    torch = pytest.importorskip("torch")
    from torch_impl.checkpoints import read_checkpoint, write_checkpoint
    write_checkpoint(tmp_path / "ok.pt", TINY, init_weights(TINY, 0))
    obj = torch.load(tmp_path / "ok.pt", weights_only=True)
    torch.save({**obj, "format_version": torch.tensor([1, 2])}, tmp_path / "version.pt")
    with pytest.raises(ValueError, match=r"version.pt': unknown format_version a Tensor, this version reads"):
        read_checkpoint(tmp_path / "version.pt")
    state = dict(obj["state_dict"])
    key = next(iter(state))
    state[key] = torch.empty(state[key].shape, device="meta")
    torch.save({**obj, "state_dict": state}, tmp_path / "meta.pt")
    with pytest.raises(ValueError, match="expected a tensor with values, got one on the meta device"):
        read_checkpoint(tmp_path / "meta.pt")


def test_a_length_penalty_past_float32_is_refused_the_same_everywhere():
    """The largest penalty ((5 + max_len) / 6) ** alpha must be finite in float32: at the bound it
    is, past it every implementation refuses with one message (torch's float64 power used to raise
    OverflowError where TF's float32 one gave inf and ranked every finished hypothesis equal)."""
    check_length_penalty(36.32, 64)
    assert np.isfinite(np.float32((5 + 64) / 6) ** np.float32(36.32))
    message = (r"^length_penalty: expected at most 36.32 at max_len=64 \(the penalty \(\(5 \+ max_len\) "
               r"/ 6\) \*\* alpha must stay finite in float32\), got 1000.0$")
    src = np.array([[3, 4, 5]])
    oracle = R.Model(init_weights(TINY, 0), TINY)
    searches = [lambda: R.beam_search(oracle, src, 64, 2, 1000.0)]
    for module, name in (("torch_impl", "Transformer"), ("tf_impl", "Transformer")):
        try:
            backend = __import__(module)
        except ImportError:
            continue
        model = getattr(backend, name)(TINY)
        searches.append(lambda b=backend, m=model: b.beam_search(m, src, 64, 2, 1000.0))
    for search in searches:
        with pytest.raises(ValueError, match=message):
            search()
    with pytest.raises(ValueError, match=r"^length_penalty: expected a finite float >= 0 .*, got an int of "
                                         r"about 401 digits$"):
        check_length_penalty(10**400)  # past float64: NumPy's isfinite raised TypeError
    from shared.schedule import noam_lr
    with pytest.raises(ValueError, match=r"^noam_lr: d_model expected a positive int \(at most 2\*\*53"):
        noam_lr(1, 10**400, 4000)  # an OverflowError from the power


@pytest.mark.skipif(NO_FIFO, reason="no FIFOs on this OS")
def test_the_command_line_names_the_flag_and_leaves_the_destination(tmp_path, capsys):
    """Through `twins`: one error line (exit 2) naming the flag, before anything is written."""
    save_checkpoint(tmp_path / "ck", TINY, init_weights(TINY, 0))
    ck = str(tmp_path / "ck")
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    (tmp_path / "empty.txt").write_text("\n\n")
    (tmp_path / "latin1.txt").write_bytes(b"3 4 \xe9")
    (tmp_path / "ids.txt").write_text("3 4\n")
    cases = [
        (["convert", ck, str(fifo), "--to", "neutral"], "out.fifo' exists and is not a checkpoint; refusing"),
        (["convert", ck, str(tmp_path / "o.pt"), "--verify", "--seed", "-1"],
         r"argument --seed: expected an int in \[0, 2147483647\], got -1"),
        (["decode", "--checkpoint", ck, "--src-file", str(tmp_path / "empty.txt")],
         "--src-file '.*empty.txt': expected lines of token ids, got none"),
        (["decode", "--checkpoint", ck, "--src-file", str(tmp_path / "latin1.txt")],
         "--src-file '.*latin1.txt': expected UTF-8 text, got byte 0xe9 at offset 4"),
        (["decode", "--checkpoint", ck, "--src", "3_4"],
         r"--src '3_4': expected token ids separated by spaces \(ASCII digits\), got '3_4'"),
        (["decode", "--checkpoint", ck, "--src", "3 4", "--beam-size", "2", "--length-penalty", "1000"],
         r"--length-penalty: expected at most 85.19 at --max-new=12"),
        (["decode", "--checkpoint", "", "--src", "3 4"], "--checkpoint: expected a path, got ''"),
        (["compare", "--config", str(tmp_path / "ck" / "config.json")],
         "--config '.*config.json': a checkpoint's config.json, not a TransformerConfig"),
        (["compare", "--backends", "torch,torch"], r"--backends: expected each of .* at most once, got"),
        (["compare", "--json", str(fifo)], "out.fifo': is a FIFO; refusing to replace it with a file"),
        # a result written over the model it came from (or its input) destroyed it, after the work
        (["decode", "--checkpoint", ck, "--src", "3 4", "--json", f"{ck}/model.safetensors"],
         r"--json '.*model.safetensors': would overwrite a file in --checkpoint '.*ck'; write elsewhere"),
        (["decode", "--checkpoint", ck, "--src-file", str(tmp_path / "ids.txt"), "--json",
          str(tmp_path / "ids.txt")], r"--json '.*ids.txt': would overwrite --src-file"),
        (["decode", "--checkpoint", ck, "--src", "3 4", "--json", ""], r"--json: expected a file path"),
        (["compare", "--checkpoint", ck, "--json", f"{ck}/config.json"], "would overwrite a file in --checkpoint"),
        (["train", "--task", "copy", "--backend", "torch", "--steps", "1", "--factor", "1e308",
          "--checkpoint", str(tmp_path / "run")], r"--factor 1e\+308 with --warmup 400 and d_model \d+: factor "
                                                   r"expected a peak rate .* that float32 holds"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse's usage errors
            code = exit_.code
        err = capsys.readouterr().err
        last = err.splitlines()[-1] if err else ""
        assert code == 2 and err.count("\n") == 1 and last.startswith(f"twins {argv[0]}: error: "), (argv, code, err)
        assert re.search(message, last), (argv, err)
    assert fifo.is_fifo() and not (tmp_path / "o.pt").exists() and not (tmp_path / "run").exists()
    assert load_checkpoint(ck)[0] == TINY and (tmp_path / "ids.txt").read_text() == "3 4\n"


def test_a_config_alone_that_cannot_fit_the_memory_is_refused_before_it_is_built(tmp_path, capsys,
                                                                                  monkeypatch):
    """A config without weights to bound it (a new `train` run's, `compare`'s): refused when the
    floor of what its model needs (`shared.memory.memory_floor`) exceeds the memory, naming the
    option, before its weights are made; the floor's bound is exact at its edge."""
    import shared.memory as memory
    import shared.weights as neutral
    import twins.compare
    floor = memory.memory_floor(1000, 10**6, 4, "train")
    memory.check_memory(1000, 10**6, 4, "train", "--config x", limit=floor)
    with pytest.raises(ValueError, match=r"--config x: 1,000 tensors of 1,000,000 values need at least "
                                         r"0.0 GiB to train, more than this machine's 0.0 GiB"):
        memory.check_memory(1000, 10**6, 4, "train", "--config x", limit=floor - 1)

    monkeypatch.setattr(memory, "total_memory", lambda: 2**30)
    made = lambda *args: pytest.fail("weights were made")  # noqa: E731
    monkeypatch.setattr(neutral, "init_weights", made)
    monkeypatch.setattr(twins.compare, "random_weights", made)
    config = tmp_path / "deep.json"  # the copy task's vocabulary, 10**4 + 10**4 layers
    config.write_text(TINY.replace(src_vocab=14, tgt_vocab=14, max_len=40, n_encoder_layers=10**4,
                                   n_decoder_layers=10**4).to_json())
    for argv, use in [(["train", "--task", "copy", "--backend", "torch", "--steps", "1", "--config",
                        str(config), "--checkpoint", str(tmp_path / "run")], "to train"),
                      (["compare", "--config", str(config), "--backends", ""], "for inference")]:
        capsys.readouterr()
        assert main(argv) == 2, argv
        last = capsys.readouterr().err.splitlines()[-1]
        assert re.search(rf"--config '.*deep.json': 4[\d,]+ tensors of [\d,]+ values need at least "
                         rf"[\d.]+ GiB {use}, more than this machine's 1.0 GiB", last), last
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("package", ["torch_impl", "tf_impl"])
def test_a_model_no_machine_can_hold_is_refused_by_its_constructor(package):
    """Before: ``Transformer(config)`` of such a config failed in the framework's own words
    (torch's "DefaultCPUAllocator: can't allocate memory", TF's ResourceExhaustedError), or
    allocated for minutes; now one ValueError naming ``config``, the same in both backends."""
    impl = pytest.importorskip(package)
    for config in (TINY.replace(d_ff=2**40), TINY.replace(n_encoder_layers=10**8)):
        with pytest.raises(ValueError, match=r"^config: [\d,]+ tensors of [\d,]+ values need at least "
                                             r"[\d.]+ GiB for inference, more than this machine's"):
            impl.Transformer(config)


def test_an_importers_problem_with_an_option_names_the_flag(tmp_path, capsys):
    """An importer checks the options it is given (``n_heads``, the config's ``max_len``); on the
    command line each is named as typed, ``--n-heads`` and ``--max-len``, and only when given."""
    torch = pytest.importorskip("torch")
    from parity_tests.source_models import Seq2SeqTransformer
    torch.save(Seq2SeqTransformer(1, 1, 8, 2, 11, 13, 16, dropout=0.0).state_dict(), tmp_path / "nnt.pt")
    common = ["convert", "--from", "nn-transformer", "--pad-id", "1", "--bos-id", "2", "--eos-id", "3",
              "--norm-first", "false", str(tmp_path / "nnt.pt"), str(tmp_path / "out")]
    for extra, message in ((["--n-heads", "0"], "--n-heads: expected a positive int, got 0"),
                           (["--n-heads", "2", "--max-len", "-1"], "--max-len: expected a positive int, got -1")):
        capsys.readouterr()
        assert main(common + extra) == 2
        assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_a_tampered_train_log_is_refused_when_read_naming_the_field(tmp_path):
    """A resumed run read its log's fields as it went: a missing "evals" failed after the steps had
    run, a batch of "abc" deep in the data pipeline, a seed past TensorFlow's range in one backend
    only. Every field `twins train` and `twins figures` use is checked when the log is read."""
    from twins.runs import LOG_FILE, LOG_FORMAT, LOG_VERSION, read_log_file
    log = {"format": LOG_FORMAT, "version": LOG_VERSION, "task": "copy", "seed": 0, "step": 2,
           "settings": {"batch": 8, "warmup": 400, "factor": 0.5, "smoothing": 0.1}, "config": {},
           "segments": [{"backend": "torch"}], "history": {"step": [1, 2], "loss": [2.5, 2.4],
                                                           "lr": [1e-5, 2e-5]},
           "evals": [{"step": 2, "backend": "torch", "accuracy": 0.0}]}
    file = tmp_path / LOG_FILE
    file.write_text(json.dumps(log))
    assert read_log_file(file) == log
    for precision in ("float32", "bfloat16", "fp32", "bf16"):  # fp32, bf16: logs from before the names
        file.write_text(json.dumps(dict(log, settings=dict(log["settings"], precision=precision))))
        assert read_log_file(file)["settings"]["precision"] == precision
    for change, problem in [
        (lambda d: d.pop("evals"), "evals: missing"),
        (lambda d: d["settings"].update(batch="abc"), "settings.batch: expected an int >= 1, got 'abc'"),
        (lambda d: d["settings"].update(batch=True), "settings.batch: expected an int >= 1, got True"),
        (lambda d: d.update(seed=10**30), "seed: expected an int in [0, 2147483647], got 10000000000"),
        (lambda d: d["history"].update(loss=[2.5]), "history: expected step, loss and lr of one length"),
        (lambda d: d.update(evals=[{}]), "evals[0]: expected an object with step, backend and accuracy"),
        (lambda d: d["settings"].update(precision="float16"),
         "settings.precision: expected one of float32, bfloat16, got 'float16'"),
        (lambda d: d["settings"].update(precision=["bf16"]),
         "settings.precision: expected one of float32, bfloat16, got ['bf16']"),
    ]:
        bad = json.loads(json.dumps(log))
        change(bad)
        file.write_text(json.dumps(bad))
        with pytest.raises(ValueError, match=f"train_log.json': not a usable train log: {re.escape(problem)}"):
            read_log_file(file)


def test_adam_moments_that_are_not_finite_restart_with_a_note(tmp_path, capsys):
    """A run's optimizer.safetensors holding a NaN (or a negative second moment) was taken, and the
    first step's loss was then blamed: it restarts from zero with a note, as a file that does not
    fit the model does."""
    from safetensors.numpy import save_file

    from shared.weights import weight_schema
    from twins.runs import OPTIMIZER_FILE, read_moments
    moments = {f"{k}.{n}": np.zeros(shape, np.float32) for k in ("m", "v")
               for n, shape in weight_schema(TINY).items()}
    save_file(moments, str(tmp_path / OPTIMIZER_FILE))
    assert read_moments(tmp_path, TINY) is not None
    for name, value in (("m.generator.bias", np.nan), ("v.generator.bias", -1.0)):
        bad = dict(moments)
        bad[name] = np.full_like(moments[name], value)
        save_file(bad, str(tmp_path / OPTIMIZER_FILE))
        capsys.readouterr()
        assert read_moments(tmp_path, TINY) is None
        why = "expected finite values, got NaN or inf" if value != -1 else "expected second moments >= 0, got -1.0"
        assert f"does not fit the model: {name}: {why}; Adam's moments restart from zero" in \
            capsys.readouterr().err


def test_numpy_ints_are_taken_as_ints_by_both_backends():
    """``max_len=np.int64(3)`` and ``beam_size=np.int64(2)`` pass the shared checks; tf_impl's
    compiled loop then raised TensorFlow's own dtype error where torch_impl decoded."""
    src = np.array([[3, 4, 5]])
    decoded = []
    for module in ("torch_impl", "tf_impl"):
        try:
            backend = __import__(module)
        except ImportError:
            continue
        model = backend.Transformer(TINY)
        model.import_weights(init_weights(TINY, 0))
        extra = {} if module == "torch_impl" else {"jit_compile": False}  # traced, as users run it
        got = (backend.greedy_decode(model, src, np.int64(3), **extra),
               backend.beam_search(model, src, np.int64(3), beam_size=np.int64(2), **extra))
        want = (backend.greedy_decode(model, src, 3, **extra),
                backend.beam_search(model, src, 3, beam_size=2, **extra))
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.tokens, w.tokens)
        decoded.append(got[1].tokens)
    assert decoded and all(np.array_equal(d, decoded[0]) for d in decoded)


@pytest.mark.parametrize("marker, what", [("saved_model.pb", "a TensorFlow SavedModel"),
                                          ("variables", "a TensorFlow SavedModel"),  # its .pb lost
                                          ("decoder_model.onnx", "an ONNX export"),  # its encoder lost
                                          ("model.bin", "a CTranslate2 model")])
def test_an_export_given_as_a_checkpoint_is_named(tmp_path, marker, what):
    """A SavedModel or CTranslate2 directory given where a checkpoint is read said "missing
    config.json" (or model.safetensors), as if a file of it were lost; it is named, as an ONNX
    export already was."""
    (tmp_path / "export").mkdir()
    if marker == "variables":
        (tmp_path / "export" / marker).mkdir()
    else:
        (tmp_path / "export" / marker).write_bytes(b"")
    with pytest.raises(ValueError, match=rf"'.*export' is {what}, which is written, never read back: .*"
                                         "read the checkpoint it was exported from$"):
        load_checkpoint(tmp_path / "export")


def test_source_lines_end_at_newlines_alone_and_copy_inputs_take_ascii_digits(tmp_path, capsys):
    """--src-file split lines as str.splitlines does (at U+0085, U+2028, form feed...): one line
    became two rows and later line numbers shifted; a UTF-8 BOM was read as part of an id. The copy
    demo's INPUT took what int() takes ("1_0", "+5", Arabic digits), which --src refuses."""
    from twins.demo_tasks import parse_input
    try:  # either framework decodes it (each CI leg has one)
        import torch  # noqa: F401
        backend = "torch"
    except ImportError:
        backend = "tf"
    save_checkpoint(tmp_path / "ck", TINY, init_weights(TINY, 0))
    (tmp_path / "ids.txt").write_bytes("\ufeff3 4\u00855 6\r\n\n7 99\n".encode())
    decode = ["decode", "--checkpoint", str(tmp_path / "ck"), "--backend", backend, "--src-file",
              str(tmp_path / "ids.txt")]
    assert main(decode) == 2
    assert re.search(r"ids.txt' line 3: expected ids in \[0, \d+\) .*got \[99\]", capsys.readouterr().err)
    (tmp_path / "ids.txt").write_bytes("\ufeff3 4\u00855 6\r\n".encode())
    assert main(decode) == 0
    assert len(capsys.readouterr().out.splitlines()) == 1  # one line, one row
    assert parse_input("copy", "4 5 13") == [4, 5, 13]
    for text in ("1_0 5", "+5 6", "5 6 \u0664"):
        with pytest.raises(ValueError, match=r"symbol ids 4..13 \(ASCII digits\)"):
            parse_input("copy", text)


def test_an_onnx_export_missing_its_encoder_is_still_named_as_one(tmp_path, capsys):
    """With encoder_model.onnx lost, `decode --backend onnx` took the export for a neutral
    checkpoint ("missing model.safetensors") and `compare` for a Marian save (an export's
    config.json carries Marian's keys beside the project's): the export and the lost file are named."""
    pytest.importorskip("onnx")
    marian_like = TINY.replace(norm_first=False, norm_style="standard", norm_eps=1e-5, pe_layout="halves")
    save_checkpoint(tmp_path / "ck", marian_like, init_weights(marian_like, 0))
    assert main(["convert", str(tmp_path / "ck"), str(tmp_path / "x"), "--to", "onnx"]) == 0
    assert json.loads((tmp_path / "x" / "config.json").read_text())["model_type"] == "marian"
    (tmp_path / "x" / "encoder_model.onnx").unlink()
    capsys.readouterr()
    assert main(["decode", "--checkpoint", str(tmp_path / "x"), "--backend", "onnx", "--src", "3 4"]) == 2
    assert re.search(r"missing '.*x/encoder_model.onnx'", capsys.readouterr().err)
    assert main(["compare", "--checkpoint", str(tmp_path / "x")]) == 2
    assert "x' is an ONNX export, which is written, never read back" in capsys.readouterr().err


def test_decode_runs_a_long_file_in_chunks_and_bounds_heldout(tmp_path, capsys, monkeypatch):
    """A --src-file of 10**5 lines was one batch and ran out of memory with each backend's own
    allocator error; it is decoded CHUNK_ROWS rows at a time, to the same tokens, and scores within
    float32's bound (here chunks of 2 against one batch of 5, greedy and beam: a row's search never
    reads another row's, but a chunk of one row folds its cross-attention into its source,
    `torch_impl.cache.CrossFold`, which rounds otherwise). --heldout is bounded while parsed."""
    pytest.importorskip("torch")
    from twins import decode
    save_checkpoint(tmp_path / "ck", TINY, init_weights(TINY, 3))
    (tmp_path / "ids.txt").write_text("3 4 5\n6 7\n8\n9 10 11 12\n4 4\n")
    outputs = []
    for rows in (decode.CHUNK_ROWS, 2):
        monkeypatch.setattr(decode, "CHUNK_ROWS", rows)
        for search in ([], ["--beam-size", "3"]):
            assert main(["decode", "--checkpoint", str(tmp_path / "ck"), "--src-file", str(tmp_path / "ids.txt"),
                         "--json", "-", *search]) == 0
            outputs.append(json.loads(capsys.readouterr().out)["results"])
    assert len(outputs[0]) == 5
    for whole, chunked in zip(outputs[:2], outputs[2:]):
        assert [{k: v for k, v in row.items() if k != "score"} for row in whole] == [
            {k: v for k, v in row.items() if k != "score"} for row in chunked]
        assert_close(np.array([row["score"] for row in chunked]), np.array([row["score"] for row in whole]),
                     bound_for("float32", "torch:reference"), "scores, chunked against one batch")
    try:
        main(["decode", "--checkpoint", str(tmp_path / "ck"), "--heldout", str(10**8)])
    except SystemExit as exit_:
        assert exit_.code == 2
    assert "argument --heldout: expected an int in [1, 100000], got 100000000" in capsys.readouterr().err
