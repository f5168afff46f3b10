"""Issue 26: nothing silently wrong, nothing that takes the machine down, under hostile input.

Resource bounds (`shared.threads`): ``--threads`` and ``--workers`` far past the machine are refused
by the parent, as a usage error naming the flag, the bound and why, before any framework starts or
any worker is launched; a dead data-parallel worker is one line naming its rank and signal.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from parity_tests import importable
from shared.threads import check_threads, check_worker_limit, machine_cpus, max_threads, max_workers

ROOT = Path(__file__).resolve().parents[1]
HUGE = "1000000"
TRAIN = ["train", "--task", "copy", "--backend", "torch", "--steps", "1"]


def _run_in_fresh_python(code: str, tmp_path: Path) -> tuple[list[dict], list[str]]:
    """Run ``code`` in a new interpreter (so "no framework imported" means something); it prints one
    JSON line per case. TMPDIR is ``tmp_path``: a launcher would leave its entries there."""
    env = importable.project_environ(ROOT, TMPDIR=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in proc.stdout.splitlines()], proc.stderr.splitlines()


def _run_cli_cases(cases: list[list[str]], tmp_path: Path) -> tuple[list[dict], list[str]]:
    """Each ``twins`` argv of ``cases`` through `twins.cli.main` in one fresh interpreter: per case
    its exit status, seconds, and which frameworks were imported by then; and stderr's lines."""
    return _run_in_fresh_python(f"""
        import json, sys, time
        from twins.cli import main
        for argv in {cases!r}:
            start = time.perf_counter()
            rc = main(argv)
            print(json.dumps({{"rc": rc, "seconds": time.perf_counter() - start,
                              "frameworks": sorted({{"torch", "tensorflow"}} & set(sys.modules))}}))
    """, tmp_path)


def test_huge_threads_and_workers_are_refused_at_once_with_nothing_started(tmp_path):
    cases = [
        ["decode", "--checkpoint", "nowhere", "--threads", HUGE, "1 2"],
        ["compare", "--threads", HUGE],
        [*TRAIN, "--checkpoint", "run", "--threads", HUGE],
        [*TRAIN, "--checkpoint", "run", "--workers", HUGE],  # no --batch: the task's (128)
        [*TRAIN, "--checkpoint", "run", "--workers", HUGE, "--batch", HUGE],
        [*TRAIN[:4], "tf", *TRAIN[5:], "--checkpoint", "run", "--workers", HUGE],
    ]
    results, errors = _run_cli_cases(cases, tmp_path)
    assert len(results) == len(errors) == len(cases), errors
    for argv, result, error in zip(cases, results, errors):
        flag = "--threads" if "--threads" in argv else "--workers"
        assert result["rc"] == 2 and result["seconds"] < 5 and result["frameworks"] == [], (argv, result)
        assert error.startswith(f"twins {argv[0]}: error: {flag} {HUGE}: expected at most "), error
        assert "logical CPU" in error and error.endswith(f"got {HUGE}"), error
    assert "global batch (128;" in errors[3] and f"global batch ({HUGE};" in errors[4]
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no run directory, no torchelastic_* entries


def test_the_bounds_come_from_the_machine_and_the_batch():
    cpus = machine_cpus()
    assert cpus >= len(os.sched_getaffinity(0)) and cpus >= (os.cpu_count() or 1)
    assert max_threads() == cpus and check_threads(cpus) == cpus and check_threads(None) is None
    assert max_workers(10**6) == cpus and max_workers(1) == 1
    assert check_worker_limit(1, 1) == 1
    with pytest.raises(ValueError, match=r"^--workers 2: expected at most 1: .*global batch \(1;"):
        check_worker_limit(2, 1)
    with pytest.raises(ValueError, match=rf"^--nproc {cpus + 1}: expected at most {cpus}: one worker per "
                                         rf"logical CPU of this machine \({cpus};"):
        check_worker_limit(cpus + 1, 10**6, "--nproc")
    for bad, error in ((0, ValueError), (-3, ValueError), (True, TypeError), (2.0, TypeError), ("2", TypeError)):
        with pytest.raises(error, match=r"^--threads: expected an int >= 1, got "):
            check_threads(bad)
    assert type(check_threads(np.int64(2))) is int  # a NumPy int is an int, as everywhere


def test_a_benchmark_refuses_huge_threads_as_a_usage_error():
    proc = subprocess.run([sys.executable, "benchmarks/step_layouts.py", "--threads", HUGE], cwd=ROOT,
                          env=importable.project_environ(ROOT), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2
    assert f"argument --threads: expected at most {max_threads()}, the logical CPUs" in proc.stderr


def test_a_dead_worker_is_named_with_its_rank_and_signal():
    from twins.parallel import failure_message
    killed = {0: -signal.SIGTERM, 1: -signal.SIGKILL}
    assert failure_message(killed) == ("worker rank 1 killed by SIGKILL (the launcher then stopped "
                                       "rank 0 with SIGTERM)")
    assert failure_message({0: -signal.SIGTERM}) == "worker rank 0 killed by SIGTERM"
    assert failure_message({2: 1, 0: -15, 1: -15}) == ("worker rank 2 exited with status 1 (the "
                                                        "launcher then stopped ranks 0, 1 with SIGTERM)")
    assert failure_message({0: -200}) == "worker rank 0 killed by signal 200"


def test_a_killed_worker_is_one_line_and_exit_1(monkeypatch, capsys):
    """The launcher's report of a worker killed by SIGKILL (the other stopped by it): `twins train`
    says which rank died and how, on one line, with exit status 1 (not an unexpected error)."""
    pytest.importorskip("torch")
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, ProcessFailure
    import torch.distributed.launcher.api as api
    from twins.cli import main

    def launcher(config, entrypoint):
        def run(*args):
            failures = {0: ProcessFailure(0, 101, -signal.SIGTERM, ""),
                        1: ProcessFailure(1, 102, -signal.SIGKILL, "")}
            raise ChildFailedError("twins", failures)
        return run

    monkeypatch.setattr(api, "elastic_launch", launcher)
    monkeypatch.setattr("shared.threads.machine_cpus", lambda: 2)  # two workers pass on any machine
    monkeypatch.setenv("OMP_NUM_THREADS", os.environ.get("OMP_NUM_THREADS", "1"))  # launch sets it
    assert main([*TRAIN, "--checkpoint", "unused", "--workers", "2", "--batch", "2"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["twins train: error: --workers 2: worker rank 1 killed by SIGKILL (the launcher then "
                   "stopped rank 0 with SIGTERM)"]


# -- messages name the user's own input -----------------------------------------------------------
def test_decode_refuses_a_huge_beam_before_loading_a_framework(tmp_path):
    """``--beam-size`` checked against the checkpoint's vocabulary before any framework starts
    (it answered after 8.7 s of loading, naming the library's ``beam_size``)."""
    from shared.weights import init_weights, save_checkpoint
    from twins.demo_tasks import task_config
    config = task_config("copy")
    save_checkpoint(tmp_path / "run", config, init_weights(config, 0))
    cases = [["decode", "--checkpoint", str(tmp_path / "run"), "--beam-size", HUGE, "3 4"],
             ["decode", "--checkpoint", str(tmp_path / "run"), "--beam-size", "0", "3 4"]]
    results, errors = _run_cli_cases(cases, tmp_path)
    assert [r["rc"] for r in results] == [2, 2] and all(r["frameworks"] == [] for r in results), results
    assert errors == [f"twins decode: error: --beam-size: expected at most tgt_vocab - 1 = "
                      f"{config.tgt_vocab - 1} (pad is never generated), got {HUGE}",
                      "twins decode: error: --beam-size: expected an int >= 1, got 0"]


def _tiny(tgt_vocab: int = 11):
    from shared import TransformerConfig
    from shared.weights import random_weights
    config = TransformerConfig(src_vocab=11, tgt_vocab=tgt_vocab, d_model=8, n_heads=2, d_ff=16,
                               n_encoder_layers=1, n_decoder_layers=1, max_len=16)
    return config, random_weights(config, 0)


def _tiny_decoders(tgt_vocab: int = 11) -> dict:
    """``{name: (package, model)}``: the tiny model in the reference, in ONNX Runtime (where onnx
    and onnxruntime import) and in each backend installed, the same weights; each package has
    ``greedy_decode`` and ``beam_search`` (`parity_tests.fuzz.numpy_decoders`)."""
    from parity_tests.fuzz import numpy_decoders
    config, weights = _tiny(tgt_vocab)
    decoders = numpy_decoders(config, weights)
    for name in ("torch_impl", "tf_impl"):
        try:
            impl = __import__(name)
        except ImportError:
            continue
        model = impl.Transformer(config)
        model.import_weights(weights)
        decoders[name] = (impl, model)
    return decoders


def test_a_ragged_list_is_named_with_its_row_lengths_in_the_reference_and_torch():
    from shared import reference as R
    config, weights = _tiny()
    expected = (r"^src: expected token ids of shape \(batch, seq\), every row of one length, got rows "
                r"of lengths \[2, 1\]; pad the rows to one length \(with pad_id\)$")
    with pytest.raises(ValueError, match=expected):
        R.forward(weights, config, [[1, 2], [3]], [[1, 2], [1, 2]])
    with pytest.raises(ValueError, match=expected):
        R.greedy_decode(R.Model(weights, config), [[1, 2], [3]], 4)
    torch = pytest.importorskip("torch")
    import torch_impl
    model = torch_impl.Transformer(config)
    with pytest.raises(ValueError, match=expected):
        model([[1, 2], [3]], torch.ones(2, 2, dtype=torch.long))


def test_a_source_that_is_no_array_is_named_alike_by_every_decoder():
    """None, text, objects and lists given to greedy_decode: the reference said "rank 0" for None,
    torch_impl refused lists (which the others decode) and named NumPy object arrays in NumPy's
    words, then as "expected a tensor or array, got ndarray" (it is one): an array of objects is
    named by its dtype. One exception type and message for each, in all four; a list decodes
    everywhere. Lists ragged below their rows, and a dict, failed in NumPy's words in the
    reference and ONNX Runtime, whose source check (its own) also named text ``<U1``, an object
    array "dtype object", None and a dict "rank 0" and ragged rows in NumPy's words (found by the
    fuzzer once it ran the NumPy decoders beside torch_impl's). ``[[]]`` was "dtype float64"
    everywhere."""
    decoders = [(name, lambda src, package=package, model=model: package.greedy_decode(model, src, 3))
                for name, (package, model) in _tiny_decoders().items()]
    # Whole messages ($): tf_impl added TensorFlow's reason to the first and last, named a list
    # mixing numbers and text "got list" and Python floats "dtype float32" (found by a differential
    # fuzz of the two backends' decoders).
    cases = [(None, TypeError, r"^src: expected a tensor or array, got NoneType$"),
             ([[1, "a"]], TypeError, r"^src: expected integer token ids, got dtype string$"),
             ([[1.5, 2.0]], TypeError, r"^src: expected integer token ids, got dtype float64$"),
             ("abc", ValueError, r"^src: expected token ids of shape \(batch, seq\), got rank 0 shape \(\)$"),
             (np.array([["a", "b"]]), TypeError, r"^src: expected integer token ids, got dtype string$"),
             (np.array([[1, None]], dtype=object), TypeError,
              r"^src: expected a tensor or array of numbers, got an ndarray of dtype object$"),
             (np.array([[1, 2]], dtype=object), TypeError,  # numbers as objects: none converts them
              r"^src: expected a tensor or array of numbers, got an ndarray of dtype object$"),
             ([[1, None]], TypeError, r"^src: expected a tensor or array, got list$"),
             ([[1, 2], [3]], ValueError, r"^src: expected token ids of shape \(batch, seq\), every row of one "
              r"length, got rows of lengths \[2, 1\]; pad the rows to one length \(with pad_id\)$"),
             ([[1, [2, 3]]], TypeError, r"^src: expected a tensor or array, got list$"),
             ([[1, 2], 3], TypeError, r"^src: expected a tensor or array, got list$"),
             ([[2**70, 3]], TypeError, r"^src: expected a tensor or array, got list$"),
             ({"src": [[1, 2]]}, TypeError, r"^src: expected a tensor or array, got dict$"),
             # An empty list holds no dtype: its emptiness is named, not NumPy's float64 for it
             ([[]], ValueError, r"^src: expected a non-empty \(batch, seq\), got shape \(1, 0\)$"),
             (np.zeros((1, 0)), TypeError, r"^src: expected integer token ids, got dtype float64$")]
    for name, decode in decoders:
        for src, error, needle in cases:
            with pytest.raises(error, match=needle):
                decode(src)
        assert decode([[3, 4, 5]]).tokens.shape == (1, 3), name


def test_ids_of_any_byte_order_and_type_name_decode_alike_in_every_decoder():
    """``np.ulonglong`` ids (uint64 by another name, what NumPy 1 makes of ``uint64 + 2**63``) and
    big-endian ids failed in torch's words in torch_impl ("can't convert np.ndarray of type
    numpy.ulonglong", "given numpy array has byte order different from the native byte order");
    the other decoders took them. All four decode them as the int64 ids now, and name an id out
    of range as given."""
    src = np.array([[3, 4, 5], [6, 7, 8]])
    for name, (package, model) in _tiny_decoders().items():
        want = package.greedy_decode(model, src, 3).tokens
        for dtype in (np.ulonglong, ">i8", ">u4", np.longlong):
            got = package.greedy_decode(model, src.astype(dtype), 3).tokens
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: {np.dtype(dtype)}")
        with pytest.raises(ValueError, match=r"^src: expected token ids in \[0, 11\), got values in "
                                             r"\[3, 9223372036854775808\]$"):
            package.greedy_decode(model, np.array([[3, 2**63]], np.ulonglong), 3)


def test_views_of_any_stride_decode_as_their_copies_in_every_decoder(recwarn):
    """A reversed view (``src[:, ::-1]``: negative strides) failed in torch's words in torch_impl
    ("At least one stride in the given numpy array is negative"), as a source and as a mask, where
    the others decoded it; a read-only array (``np.broadcast_to``'s) drew torch's warning that it
    might write to it. Every decoder now gives what a C-contiguous copy gives, and warns of
    nothing."""
    src = np.array([[5, 4, 3], [8, 7, 6]])
    read_only = src.copy()
    read_only.flags.writeable = False
    views = [src[:, ::-1], src[::-1], np.broadcast_to(src[:1], (2, 3)), np.asfortranarray(src), read_only]
    masks = [np.ones((2, 1, 1, 3), bool)[::-1], np.ones((2, 1, 1, 6), bool)[..., ::-2],
             np.broadcast_to(np.ones((1, 1, 1, 3), bool), (2, 1, 1, 3))]
    for name, (package, model) in _tiny_decoders().items():
        for view in views:
            want = package.beam_search(model, np.array(view), 4, beam_size=2)
            got = package.beam_search(model, view, 4, beam_size=2)
            np.testing.assert_array_equal(got.tokens, want.tokens, err_msg=f"{name}: strides {view.strides}")
        want = package.greedy_decode(model, src, 4, src_mask=np.ones((2, 1, 1, 3), bool)).tokens
        for mask in masks:
            got = package.greedy_decode(model, src, 4, src_mask=mask).tokens
            np.testing.assert_array_equal(got, want, err_msg=f"{name}: mask strides {mask.strides}")
    assert [str(w.message) for w in recwarn] == []


def test_a_masked_array_that_masks_entries_is_refused_by_every_decoder():
    """Ids or a mask given as a NumPy masked array with masked entries: every decoder decoded the
    values under the mask, which its owner said not to use, as `import_weights` refuses to import
    them. Refused now by name, in all four; a masked array that masks nothing is its values."""
    src = np.array([[5, 4, 3], [8, 7, 6]])
    masked = np.ma.masked_array(src, mask=[[0, 0, 1], [0, 0, 0]])
    mask = np.ones((2, 1, 1, 3), bool)
    for name, (package, model) in _tiny_decoders().items():
        with pytest.raises(ValueError, match=r"^src: a masked array with 1 masked entry; fill them "
                                             r"\(\.filled\(value\)\) or pass \.data$"):
            package.greedy_decode(model, masked, 3)
        with pytest.raises(ValueError, match=r"^src_mask: a masked array with 6 masked entries; "):
            package.beam_search(model, src, 3, src_mask=np.ma.masked_array(mask, mask=mask), beam_size=2)
        want = package.greedy_decode(model, src, 3).tokens
        for unmasked in (np.ma.masked_array(src), np.ma.masked_array(src, mask=np.zeros_like(src))):
            np.testing.assert_array_equal(package.greedy_decode(model, unmasked, 3).tokens, want, err_msg=name)


def test_a_torch_tensor_numpy_cannot_read_is_named_with_torchs_reason_by_the_others():
    """A torch tensor that requires grad, or of bfloat16, given to the reference, ONNX Runtime or
    tf_impl: torch's RuntimeError, naming no argument, or "expected a tensor or array, got Tensor"
    (it is one). Now the argument, the tensor's dtype and torch's reason, with its way out."""
    torch = pytest.importorskip("torch")
    from shared.loss import label_smoothed_cross_entropy
    src = np.array([[5, 4, 3], [8, 7, 6]])
    cases = [(torch.tensor(src, dtype=torch.float32, requires_grad=True),
              r"got a Tensor of dtype float32 \(Can't call numpy\(\) on Tensor that requires grad. Use "
              r"tensor.detach\(\).numpy\(\) instead.\)$"),
             (torch.tensor(src).bfloat16(), r"got a Tensor of dtype bfloat16 \(Got unsupported ScalarType BFloat16\)$")]
    for name, (package, model) in _tiny_decoders().items():
        if name != "torch_impl":  # which reads them as its own
            for tensor, reason in cases:
                with pytest.raises(TypeError, match=r"^src: expected a tensor or array NumPy can read, " + reason):
                    package.greedy_decode(model, tensor, 3)
    logits = torch.zeros((2, 3, 5), requires_grad=True)
    with pytest.raises(TypeError, match=r"^logits: expected a tensor or array NumPy can read, got a Tensor of "
                                        r"dtype float32 \(Can't call numpy\(\) on Tensor that requires grad"):
        label_smoothed_cross_entropy(logits, np.ones((2, 3), np.int64), 0, 0.1)


def test_a_mask_that_is_no_bool_array_is_named_alike_by_every_decoder():
    """A ``src_mask`` no framework holds (a duration, text, objects) failed in torch's words ("can't
    convert np.ndarray of type numpy.timedelta64") and in tf_impl's as "expected a tensor or array,
    got ndarray (...)"; text was "<U1" in the reference and ONNX Runtime; a list or a number was "a
    numpy bool array", "a torch bool tensor" or "a tf bool tensor", as the decoder went; a NumPy
    bool scalar was taken as a shape () mask by two and refused as no array by two. One message for
    each now, in all four."""
    src = np.array([[3, 4, 5], [6, 7, 8]])
    no_array = "expected a bool array or tensor \\(True = may attend\\), got"
    cases = [([[[[True, True, True]]]], TypeError, f"{no_array} list"), ("x", TypeError, f"{no_array} str"),
             (True, TypeError, f"{no_array} bool"), (memoryview(np.ones((1, 1, 1, 3), bool)), TypeError,
                                                     f"{no_array} memoryview"),
             (np.ones((2, 1, 1, 3), "m8[s]"), TypeError,
              r"expected a bool mask \(True = may attend\), got dtype timedelta64\[s\]"),
             (np.array([[[["1", "1", "1"]]]]), TypeError,
              r"expected a bool mask \(True = may attend\), got dtype string"),
             (np.ones((1, 1, 1, 3), object), TypeError,
              r"expected a bool mask \(True = may attend\), got dtype object"),
             (np.True_, ValueError, r"expected a rank-4 mask broadcastable to .*, got shape \(\)")]
    for name, (package, model) in _tiny_decoders().items():
        for mask, error, message in cases:
            with pytest.raises(error, match=f"^src_mask: {message}$"):
                package.greedy_decode(model, src, 3, src_mask=mask)
        assert package.greedy_decode(model, src, 3, src_mask=np.ones((2, 1, 1, 3), bool)).tokens.shape == (2, 3), name


def test_a_numpy_duration_is_named_alike_by_every_decoder():
    """NumPy counts a ``timedelta64`` an integer: as ``max_len``, ``beam_size`` or
    ``length_penalty`` it failed in ``int()``'s or a ufunc's words, alike in the three decoders and
    so no difference to the fuzzer, until its rule asked that a refusal name its argument. Ids of
    that dtype were refused by name already."""
    src, duration, shown = np.array([[3, 4, 5]]), np.timedelta64(3, "s"), r"np\.timedelta64\(3,'s'\)"
    cases = [
        (lambda m, model: m.greedy_decode(model, src, duration),
         rf"^max_len: expected an int >= 1, got {shown}$"),
        (lambda m, model: m.beam_search(model, src, 3, beam_size=duration),
         rf"^beam_size: expected an int >= 1, got {shown}$"),
        (lambda m, model: m.beam_search(model, src, 3, beam_size=2, length_penalty=duration),
         rf"^length_penalty: expected a finite float >= 0 \(GNMT alpha; 0 = none\), got {shown}$"),
        (lambda m, model: m.greedy_decode(model, src.astype("m8[s]"), 3),
         r"^src: expected integer token ids, got dtype timedelta64\[s\]$")]
    for name, (package, model) in _tiny_decoders().items():
        for call, message in cases:
            with pytest.raises((ValueError, TypeError), match=message):
                call(package, model)
        assert package.greedy_decode(model, src, np.int64(3)).tokens.shape == (1, 3), name


def test_numpy_ints_of_any_width_decode_as_python_ints_in_every_decoder():
    """``beam_size`` and ``max_len`` as NumPy ints narrower or wider than int64: torch_impl's beam
    search computed its candidates (beam_size * 2 * beam_size) in int8 and wrapped ("shape '[1, 84]'
    is invalid for input of size 340" at 17 beams), and the reference and ONNX Runtime indexed
    with float64 where a uint64 met int64 ("arrays used as indices must be of integer (or boolean)
    type"): found by the fuzzer drawing such ints. Every decoder gives what Python ints give."""
    src = np.array([[3, 4, 5], [6, 7, 8]])
    for name, (package, model) in _tiny_decoders(tgt_vocab=20).items():
        want = package.beam_search(model, src, 5, beam_size=17, length_penalty=0.6)
        for integer in (np.int8, np.uint8, np.int16, np.uint32, np.uint64):
            got = package.beam_search(model, src, integer(5), beam_size=integer(17), length_penalty=0.6)
            for field in ("tokens", "scores", "lengths"):
                np.testing.assert_array_equal(getattr(got, field), getattr(want, field),
                                              err_msg=f"{name}: {integer.__name__} {field}")
            greedy = package.greedy_decode(model, src, integer(5))
            np.testing.assert_array_equal(greedy.tokens, package.greedy_decode(model, src, 5).tokens,
                                          err_msg=f"{name}: {integer.__name__} greedy")


def test_an_unsigned_id_past_int64_is_reported_as_given_in_torch_as_in_the_reference():
    torch = pytest.importorskip("torch")
    import torch_impl
    from shared import reference as R
    config, weights = _tiny()
    ids = np.array([[2**63 + 5, 1]], dtype=np.uint64)
    message = r"^src: expected token ids in \[0, 11\), got values in \[1, 9223372036854775813\]$"
    with pytest.raises(ValueError, match=message):
        R.forward(weights, config, ids, [[1, 2]])
    model = torch_impl.Transformer(config)
    with pytest.raises(ValueError, match=message):
        model(torch.from_numpy(ids), torch.ones(1, 2, dtype=torch.long))
    assert model(torch.from_numpy(ids % 11), torch.ones(1, 2, dtype=torch.long)).shape == (1, 2, 11)


def test_to_marian_lists_each_problem_apart_on_one_line(tmp_path, capsys):
    from shared import TransformerConfig
    from shared.weights import random_weights, save_checkpoint
    from shared.exporters.marian import marian_problems
    from twins.cli import main
    config = TransformerConfig.preset("tiny").replace(norm_first=True, final_norm=True, mask_padding=False)
    save_checkpoint(tmp_path / "ckpt", config, random_weights(config))
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "m"), "--to", "marian"]) == 2
    problems = marian_problems(config)
    assert len(problems) > 2 and "norm_first: expected False (Marian's layers are post-norm), got True" in problems
    assert ("mask_padding: expected True (Marian masks the source's pad tokens; MarianConfig has no setting "
            "to attend them), got False") in problems  # it was written, computing another function
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == [f"twins convert: error: to_marian({str(tmp_path / 'm')!r}): {len(problems)} problem(s): "
                     + "; ".join(problems)]
    assert not (tmp_path / "m").exists()
