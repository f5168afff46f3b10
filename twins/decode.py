"""`twins decode`: load a demo checkpoint in either backend and decode inputs or the held-out set.

The checkpoint is a `twins train` run directory, any neutral checkpoint directory, a torch_impl
``.pt`` or a tf_impl ``.weights.h5``; the weights go into the backend chosen with ``--backend``
whichever backend trained them. Output, on stdout:

* for INPUT arguments: one line per input, the decoded output alone (a date ``yyyy-mm-dd``, or the
  copied ids separated by spaces);
* for ``--heldout N``: one line per held-out example, ``source<TAB>output<TAB>ok`` or
  ``source<TAB>output<TAB>expected TARGET``, then ``exact match: K/N = P%``. Nothing in it depends
  on the backend but the outputs, so two backends' listings can be compared with ``diff``.
"""
from __future__ import annotations

from pathlib import Path

from shared.saving import recover
from shared.decoding_args import check_beam_size
from shared.threads import check_threads

from . import demo_tasks as tasks
from .backends import BACKENDS, make_adapter


def add_arguments(parser) -> None:
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="what to decode: a date as text (quote it), or for copy symbol ids "
                             "separated by spaces (quoted as one argument)")
    parser.add_argument("--checkpoint", required=True, metavar="PATH",
                        help="a run directory of `twins train`, a neutral checkpoint directory, a "
                             ".pt or a .weights.h5")
    parser.add_argument("--backend", choices=BACKENDS, default="torch", help="torch (default) or tf")
    parser.add_argument("--task", choices=tasks.TASKS,
                        help="copy or dates (default: from the run's log, else from the vocabulary)")
    parser.add_argument("--heldout", type=int, metavar="N",
                        help="decode and score the first N held-out examples (those `twins train` "
                             "evaluates on)")
    parser.add_argument("--beam-size", type=int, default=1, metavar="K",
                        help="beam search with K beams (default 1: greedy)")
    parser.add_argument("--max-len", type=int,
                        help="new tokens at most, EOS included (default: target length + 1; for "
                             "copy inputs, the longest input + 1)")
    parser.add_argument("--threads", type=int, metavar="N",
                        help="CPU threads of the framework (default: its own, one per core; idle "
                             "threads sleep, OMP_WAIT_POLICY=PASSIVE, see shared/threads.py)")


def load(path: str):
    """``(config, weights, train log or None)`` of any checkpoint format."""
    from .convert import detect, read
    from .train import read_log
    p = Path(path)
    recover(p)  # a save that a crash interrupted: finished (or refused, naming the data) first
    if not p.exists():
        raise FileNotFoundError(f"--checkpoint {path!r}: no such file or directory")
    config, weights = read(detect(path, "source"), path)
    return config, weights, read_log(p) if p.is_dir() else None


def resolve_task(given: str | None, log: dict | None, config) -> str:
    task = given or (log or {}).get("task") or tasks.infer_task(config)
    if log and given and log.get("task") != given:
        raise ValueError(f"--task {given}: the checkpoint's train log says {log.get('task')}")
    tasks.check_config(task, config)
    return task


def run(args) -> int:
    if not args.inputs and args.heldout is None:
        raise ValueError("nothing to decode: give INPUT arguments or --heldout N")
    if args.inputs and args.heldout is not None:
        raise ValueError("give INPUT arguments or --heldout N, not both")
    check_threads(args.threads)
    check_beam_size(args.beam_size, name="--beam-size")
    if args.max_len is not None and args.max_len < 1:
        raise ValueError(f"--max-len: expected an int >= 1, got {args.max_len}")
    config, weights, log = load(args.checkpoint)
    check_beam_size(args.beam_size, config.tgt_vocab, name="--beam-size")  # before any framework loads
    task = resolve_task(args.task, log, config)
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
    if args.max_len is not None and args.max_len > config.max_len:
        raise ValueError(f"--max-len: expected at most the model's max_len={config.max_len}, "
                         f"got {args.max_len}")
    default = longest + 1 if task == "copy" else spec.target_len + 1
    max_len = args.max_len or min(default, config.max_len)  # only the default adapts to the model
    backend = make_adapter(args.backend, config, weights, threads=args.threads)
    src = tasks.pad(sources)
    result = (backend.greedy(src, max_len) if args.beam_size == 1
              else backend.beam(src, max_len, args.beam_size))
    tokens = result.tokens
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
