"""`twins decode`: decode with any checkpoint the format registry reads, in either backend.

Two ways in:

* **token ids, any model**: ``--src "5 6 7 8"`` (repeatable) or ``--src-file FILE`` (one row of
  space-separated ids per line; ``-``: standard input, as ``--json -`` is standard output).
  Output: one line per row, the decoded ids up to (not including) EOS; with ``--json FILE``
  (``-``: stdout alone) every row's ids, length, whether it ended with EOS, and its score.
* **the demos' text** (``--task copy|dates``, else from the run's log or the vocabulary): INPUT
  arguments (a date as text, or copy ids), or ``--heldout N``: one line per held-out example,
  ``source<TAB>output<TAB>ok`` or ``source<TAB>output<TAB>expected TARGET``, then
  ``exact match: K/N = P%``. Nothing in it depends on the backend but the outputs, so two
  backends' listings can be compared with ``diff``.

The weights go into the backend chosen with ``--backend`` whichever framework wrote them; a format
that needs options takes them as ``twins convert`` does (``--from nn-transformer --n-heads 8 ...``).
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np

from shared.checks import int_argument
from shared.decoding_args import check_beam_size, check_length_penalty
from shared.devices import DEFAULT as DEFAULT_DEVICE
from shared.exporters.onnx import export_precision, read_onnx
from shared.formats import onnx as onnx_formats
from shared.paths import read_text, utf8_text
from shared.saving import recover, write_atomically
from shared.precision import PRECISIONS, check_precision
from shared.threads import check_threads

from . import arguments, loading
from . import demo_tasks as tasks
from .backends import DECODERS, OnnxRuntime, make_adapter
from .runs import read_log


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="demo text to decode: a date (quote it), or for copy symbol ids "
                             "separated by spaces (quoted as one argument)")
    parser.add_argument("--checkpoint", required=True, metavar="PATH", type=arguments.path,
                        help="any readable format: a run directory of `twins train`, a neutral "
                             "directory, a .pt, a .weights.h5, a Marian directory, ... "
                             "(`twins convert --list-formats`)")
    parser.add_argument("--backend", choices=DECODERS, default="torch",
                        help="torch (default), tf, or onnx: ONNX Runtime, serving an ONNX export "
                             "directory as it is (neither torch nor TensorFlow loads) or any other "
                             "checkpoint exported in memory")
    parser.add_argument("--src", action="append", metavar="IDS",
                        help="source token ids separated by spaces, quoted as one argument "
                             "(repeatable: one row each)")
    parser.add_argument("--src-file", metavar="FILE", type=arguments.path,
                        help="source token ids, one row of space-separated ids per line ('-': "
                             "standard input)")
    parser.add_argument("--task", choices=tasks.TASKS,
                        help="copy or dates, for INPUT / --heldout (default: from the run's log, "
                             "else from the vocabulary)")
    parser.add_argument("--heldout", type=lambda text: int_argument(text, 1, MAX_HELDOUT), metavar="N",
                        help=f"decode and score the first N held-out examples of the demo task "
                             f"(N <= {MAX_HELDOUT})")
    parser.add_argument("--beam-size", type=arguments.integer, default=1, metavar="K",
                        help="beam search with K beams (default 1: greedy)")
    parser.add_argument("--length-penalty", type=float, default=0.0, metavar="ALPHA",
                        help="GNMT length penalty alpha >= 0 of beam search (default 0: none)")
    parser.add_argument("--max-new", type=arguments.integer, metavar="N",
                        help="new tokens at most, EOS included (default: ids: the longest row + 10; "
                             "demos: target length + 1; at most the model's max_len)")
    parser.add_argument("--json", metavar="FILE", help="ids: also write the results as JSON ('-': "
                                                      "stdout, alone)")
    parser.add_argument("--precision", type=arguments.precision(*PRECISIONS),
                        metavar=arguments.choices(PRECISIONS),
                        help="the products' precision: float32 (default; a float64 model computes in "
                             "float64), or bfloat16 / float16 (bf16 / fp16) mixed precision with "
                             "float32 weights, residual stream, layer norm, softmax and search "
                             "(shared.precision); an ONNX export computes in the precision it was "
                             "exported in (the default)")
    parser.add_argument("--threads", type=arguments.integer, metavar="N",
                        help="CPU threads of the framework (default: its own, one per core; idle "
                             "threads sleep, OMP_WAIT_POLICY=PASSIVE, see shared/threads.py)")
    parser.add_argument("--device", type=arguments.device, default=DEFAULT_DEVICE,
                        help="where torch or tf decodes: cpu (default), cuda or cuda:N (float32 "
                             "products in float32 there: TF32 off; shared/devices.py); onnx runs "
                             "on the CPU")
    loading.add_arguments(parser)


_ID = re.compile(r"[+-]?[0-9]+")  # a token id as typed: ASCII digits, a sign for the range check


def _id_rows(args) -> list[tuple[str, list[int]]]:
    """``(where, ids)`` of each ``--src`` / ``--src-file`` row; a bad one names where it is."""
    rows = [(f"--src {text!r}", text) for text in args.src or []]
    if args.src_file:
        # lines end at "\n" alone (splitlines also breaks at \f, \v, U+0085, U+2028, ...: one line
        # would become two rows, and every later line number shift); a UTF-8 BOM is not an id
        lines = _src_text(args.src_file).removeprefix("\ufeff").split("\n")
        rows += [(f"--src-file {args.src_file!r} line {i}", line) for i, line in enumerate(lines, 1)
                 if line.strip()]
        if not any(where.startswith("--src-file") for where, _ in rows):
            raise ValueError(f"--src-file {args.src_file!r}: expected lines of token ids, got none")
    parsed = []
    for where, text in rows:
        ids = text.split()
        if not all(_ID.fullmatch(t) for t in ids):  # int() would take "3_4" and other scripts' digits
            shown = repr(text) if len(text) <= 80 else f"{text[:80]!r}... ({len(text):,} characters)"
            raise ValueError(f"{where}: expected token ids separated by spaces (ASCII digits), got {shown}")
        parsed.append((where, [int(t) for t in ids]))
    return parsed


def _src_text(path: str) -> str:
    """The text of ``--src-file``: the file, or standard input read to its end for ``-`` (closed
    or absent, it holds no rows)."""
    if path != "-":
        return read_text(path, "--src-file")
    stdin = sys.stdin
    if stdin is None:
        return ""
    buffer = getattr(stdin, "buffer", None)  # the bytes, so that the UTF-8 check is read_text's
    return utf8_text(buffer.read(), "--src-file '-' (standard input)") if buffer else stdin.read()


def _check_ids(rows, config) -> None:
    for where, ids in rows:
        if not ids:
            raise ValueError(f"{where}: expected at least one token id, got none")
        bad = [t for t in ids if not 0 <= t < config.src_vocab]
        if bad:
            raise ValueError(f"{where}: expected ids in [0, {config.src_vocab}) (the model's "
                             f"src_vocab), got {bad[:5]}")
        if len(ids) > config.max_len:
            raise ValueError(f"{where}: {len(ids)} tokens, more than the model's max_len {config.max_len}")


def _backend(args, config, weights):
    """The ``--backend`` adapter holding ``weights``, on ``--device``, in ``--precision``."""
    with arguments.flags("device", "precision"):  # named as the user wrote them
        if weights is None:  # an ONNX export directory (run)
            backend = OnnxRuntime.load(args.checkpoint, threads=args.threads, device=args.device)
        else:
            backend = make_adapter(args.backend, config, weights, threads=args.threads, device=args.device)
        backend.set_precision(args.precision)
    return backend


CHUNK_ROWS, MAX_HELDOUT = tasks.CHUNK_ROWS, tasks.MAX_HELDOUT  # (twins/demo_tasks.py says why)


def _search(backend, src: np.ndarray, args, max_new: int):
    """The search of every row of ``src``, `CHUNK_ROWS` rows at a time: one result of all rows."""
    parts = []
    for start in range(0, len(src), CHUNK_ROWS):
        chunk = src[start:start + CHUNK_ROWS]
        if args.beam_size == 1 and args.length_penalty == 0.0:
            parts.append(backend.greedy(chunk, max_new))
        else:
            parts.append(backend.beam(chunk, max_new, args.beam_size, args.length_penalty))
    if len(parts) == 1:
        return parts[0]
    return parts[0]._make(None if part is None else np.concatenate(fields)
                          for part, fields in zip(parts[0], zip(*parts)))


def _max_new(args, config, default: int) -> int:
    """The tokens to decode at most, checked with the length penalty they bound, before any
    framework loads."""
    if args.max_new is None:
        max_new = min(default, config.max_len)  # only the default adapts to the model
    elif not 1 <= args.max_new <= config.max_len:
        raise ValueError(f"--max-new: expected an int in [1, the model's max_len={config.max_len}], "
                         f"got {args.max_new}")
    else:
        max_new = args.max_new
    check_length_penalty(args.length_penalty, max_new, "--length-penalty", "--max-new")
    return max_new


def run(args) -> int:
    ids_mode = bool(args.src or args.src_file)
    ways = [name for name, used in (("INPUT arguments", args.inputs), ("--heldout", args.heldout is not None),
                                    ("--src / --src-file", ids_mode)) if used]
    if len(ways) != 1:
        raise ValueError("nothing to decode: give --src / --src-file ids, INPUT arguments or "
                         "--heldout N" if not ways else f"give one of {', '.join(ways)}, not several")
    check_threads(args.threads)
    check_beam_size(args.beam_size, name="--beam-size")
    check_length_penalty(args.length_penalty, name="--length-penalty")
    if args.json is not None and not ids_mode:
        raise ValueError("--json: only with --src / --src-file")
    if args.task is not None and ids_mode:  # it was ignored: ids are decoded whatever the task
        raise ValueError("--task: only with INPUT arguments or --heldout, not --src / --src-file")
    if args.json is not None and args.json != "-":  # before the work, not after it
        loading.check_output("--json", args.json, {"--checkpoint": args.checkpoint, "--src-file":
                                                   None if args.src_file == "-" else args.src_file})
    # an interrupted save of the path finished first: else a half-swapped export was no export
    # here, then recovered by the reader and refused as "an ONNX export, never read back"
    recover(args.checkpoint)
    if onnx_formats.is_export(args.checkpoint):  # served as it is: ONNX Runtime alone
        if args.backend != "onnx":
            raise ValueError(f"--checkpoint {args.checkpoint!r} is an ONNX export: decode it with "
                             f"--backend onnx (got --backend {args.backend})")
        if args.config is not None:  # it was ignored: the export's config.json is what it computes
            raise ValueError(f"--config: --checkpoint {args.checkpoint!r} is an ONNX export, which "
                             "holds its config; do not pass one")
        config, weights = read_onnx(args.checkpoint)[0], None
        args.precision = args.precision or export_precision(args.checkpoint)
    else:
        _, config, weights = loading.read(args.checkpoint, args)
    args.precision = args.precision or "float32"
    check_beam_size(args.beam_size, config.tgt_vocab, name="--beam-size")  # before any framework loads
    try:  # kept as its canonical name (the JSON report's), once named as the user wrote it
        args.precision = check_precision(args.precision, config.dtype)
    except ValueError as err:  # named as the user wrote it
        raise ValueError(f"--{err}") from None
    if ids_mode:
        return _decode_ids(args, config, weights)
    return _decode_demo(args, config, weights)


def _decode_ids(args, config, weights) -> int:
    rows = _id_rows(args)
    _check_ids(rows, config)
    longest = max(len(ids) for _, ids in rows)
    max_new = _max_new(args, config, longest + 10)
    src = np.full((len(rows), longest), config.pad_id, dtype=np.int64)
    for i, (_, ids) in enumerate(rows):
        src[i, :len(ids)] = ids
    result = _search(_backend(args, config, weights), src, args, max_new)
    scores = (result.log_probs.sum(axis=1) if hasattr(result, "log_probs") else result.scores)
    out = []
    for (where, ids), row, length, score in zip(rows, result.tokens, result.lengths, scores):
        row = [int(t) for t in row[:int(length)]]
        ended = bool(row) and row[-1] == config.eos_id
        out.append({"src": ids, "tokens": row[:-1] if ended else row, "eos": ended,
                    "score": float(score)})
    text = sys.stderr if args.json == "-" else sys.stdout  # with --json - stdout carries JSON alone
    for item in out:
        print(" ".join(map(str, item["tokens"])), file=text)
    if args.json:
        report = {"checkpoint": str(args.checkpoint), "backend": args.backend, "device": args.device,
                  "precision": args.precision,
                  "search": {"beam_size": args.beam_size, "length_penalty": args.length_penalty,
                             "max_new": max_new}, "results": out}
        dumped = json.dumps(report, indent=1)
        if args.json == "-":
            print(dumped)
        else:
            write_atomically(args.json, lambda tmp: Path(tmp).write_text(dumped + "\n", encoding="utf-8"))
    return 0


def _decode_demo(args, config, weights) -> int:
    log = read_log(args.checkpoint) if Path(args.checkpoint).is_dir() else None
    task = tasks.resolve_task(args.task, log, config)
    spec = tasks.spec(task)
    if args.heldout is not None:
        examples = tasks.heldout(task, args.heldout)
        sources, targets = examples.sources, examples.targets
        shown = [t[0] for t in examples.texts] if examples.texts else [
            " ".join(map(str, s)) for s in sources]
    else:
        sources, targets = [tasks.parse_input(task, text) for text in args.inputs], None
        shown = args.inputs
    longest = max(len(s) for s in sources)
    if longest > config.max_len:
        raise ValueError(f"an input of {longest} tokens is longer than the model's max_len "
                         f"{config.max_len}")
    max_new = _max_new(args, config, longest + 1 if task == "copy" else spec.target_len + 1)
    tokens = _search(_backend(args, config, weights), tasks.pad(sources), args, max_new).tokens
    outputs = [tasks.format_output(task, row) for row in tokens]
    if targets is None:
        for out in outputs:
            print(out)
        return 0
    ok = tasks.exact(tokens, targets)
    for text, out, target, good in zip(shown, outputs, targets, ok):
        expected = tasks.format_output(task, list(target) + [tasks.data.EOS_ID])
        print(f"{text}\t{out}\t{'ok' if good else 'expected ' + expected}")
    print(f"exact match: {int(ok.sum())}/{ok.size} = {ok.mean():.1%}")
    return 0
