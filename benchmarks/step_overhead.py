"""A cached decoding step's time, of two checkouts of this project side by side in one process.

torch_impl's step at a few rows streams its kernels from memory (164 MB a step of ``base``), and
everything else it does, Python and about a thousand small operations, runs between two products
on an interpreter whose objects the stream has evicted: docs/performance.md ("A step's Python").
This benchmark measures that part. Each ``--roots`` checkout is imported under its own module
objects (its ``torch_impl`` and ``shared``) and builds the same model twice (in the order given,
then in reverse: where a model's memory lies moves its time by 1-3%), and the checkouts' steps run
interleaved, round after round (every other round in reverse), in one process: the same machine
state for both, which runs of two processes on a shared machine do not give. Printed: each
checkout's median ms a step, the median of the per-round ratios to the first, and whether their
logits are bit for bit equal.

``--preset base`` times the whole step (`benchmarks/_decoding_contenders.contender_config`,
float32); ``--preset tiny`` the same six layers at ``d_model`` 64 and a vocabulary of 64, whose
products take next to nothing: what is left is the step's own overhead. Batch 1, ``--beams`` rows
of one source (``Transformer.init_cache`` / ``decode_step`` without the search loop's work), one
thread by default.

``--decode`` times whole greedy decodes instead (`torch_impl.greedy_decode` of ``--steps`` tokens,
EOS suppressed as `benchmarks/_decoding_contenders.bench_weights` does, so every decode runs to the
limit): the encoder pass, the cache's making and the search loop's own work (greedy's update, its
host read) included, in ms a token; a change to the search shows here and not in the step alone.
With ``--beams`` above 1, beam searches of the one source (`torch_impl.beam_search`, that beam
size), whose loop also reorders the cache's rows every step. Compared: every array of the result
(tokens, log-probs or scores, lengths), bit for bit.

``--device cuda`` runs both on a GPU (TF32 off, as in the parity tests): there a decode replays
CUDA graphs (`torch_impl.graphs`), so ``--decode`` is what compares two checkouts' graphed steps;
``--precision bfloat16`` (or float16) decodes in that mixed precision
(`torch_impl.precision.set_precision`), on either device.

    python3 dev.py bench step_overhead --roots OLD_CHECKOUT . [--preset base|tiny] [--rounds 15]
                                       [--steps 40] [--beams 1] [--threads 1] [--decode]
                                       [--device cpu|cuda] [--precision float32|bfloat16|float16]

(``git worktree add /tmp/old <commit>`` makes an old checkout.) Measured: docs/performance.md.
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))  # this checkout's shared.threads, before torch starts

from shared.threads import apply_thread_policy, thread_count  # noqa: E402
from _args import positive  # noqa: E402
from _cuda import cuda_missing  # noqa: E402


def _checkout(text: str) -> Path:
    root = Path(text).resolve()
    if not (root / "torch_impl" / "__init__.py").is_file() or not (root / "shared" / "__init__.py").is_file():
        raise argparse.ArgumentTypeError(f"expected a checkout of this project (torch_impl/ and shared/), got {text}")
    return root


def _import_from(root: Path):
    """``(torch_impl, shared.config, shared.weights, shared.masks)`` of the checkout at ``root``,
    as new module objects: every ``torch_impl`` and ``shared`` module imported before is dropped
    from ``sys.modules`` first (the objects made from them keep their own)."""
    for name in [m for m in sys.modules if m.split(".")[0] in ("torch_impl", "shared")]:
        del sys.modules[name]
    sys.path.insert(0, str(root))
    try:
        modules = [importlib.import_module(m) for m in ("torch_impl", "shared.config", "shared.weights",
                                                        "shared.masks")]
    finally:
        sys.path.remove(str(root))
    if not Path(modules[0].__file__).resolve().is_relative_to(root):
        raise RuntimeError(f"torch_impl came from {modules[0].__file__}, not from {root}")
    return modules


def _contender(root: Path, args, parser):
    """One model of the checkout at ``root`` (`_import_from`) and the function that times it:
    ``run() -> (ms a step or a token, its outputs as one tensor)``."""
    import numpy as np
    import torch

    torch_impl, config_module, weights_module, masks = _import_from(root)
    extra = {} if args.preset == "base" else dict(d_model=64, d_ff=64, src_vocab=64, tgt_vocab=64)
    # benchmarks/_decoding_contenders.contender_config's settings, spelled out: an old
    # checkout's benchmarks may differ
    config = config_module.TransformerConfig.preset("base", norm_eps=1e-5, pe_layout="halves", **extra)
    if args.steps + 1 > config.max_len:
        parser.error(f"--steps: expected at most {config.max_len - 1}, got {args.steps}")
    weights = weights_module.init_weights(config, 0)
    if args.decode:  # EOS never chosen: every decode runs to the limit (bench_weights)
        weights["generator.bias"] = weights["generator.bias"].copy()
        weights["generator.bias"][config.eos_id] = -3e4
    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    model.to(args.device).eval()
    if args.precision != "float32":
        importlib.import_module("torch_impl.precision").set_precision(model, args.precision)
    src = np.random.default_rng(0).integers(3, config.src_vocab, size=(1, 32))

    if args.decode:
        def decode():
            start = time.perf_counter()
            result = (torch_impl.greedy_decode(model, src, args.steps) if args.beams == 1
                      else torch_impl.beam_search(model, src, args.steps, beam_size=args.beams))
            elapsed = (time.perf_counter() - start) / args.steps * 1e3
            return elapsed, torch.as_tensor(np.concatenate([np.ravel(array).astype(np.float64)
                                                            for array in result if array is not None]))
        return decode

    with torch.inference_mode():
        src_t = torch.as_tensor(src, device=args.device)
        mask = torch.as_tensor(masks.make_src_mask(src, config.pad_id), device=args.device)
        memory = model.encode(src_t, mask)

    def run():
        with torch.inference_mode():
            cache = model.init_cache(memory, mask, args.steps + 1, args.beams)
            tokens = torch.full((args.beams,), 5, dtype=torch.long, device=args.device)
            logits = []
            _synchronize(args.device)
            start = time.perf_counter()
            for _ in range(args.steps):
                out, cache = model.decode_step(tokens, cache)
                tokens = out.argmax(-1)
                logits.append(out)
            _synchronize(args.device)
            return (time.perf_counter() - start) / args.steps * 1e3, torch.stack(logits).cpu()
    return run


def _synchronize(device: str) -> None:
    """Wait for the device's queued work (a GPU runs behind the host; the CPU has none)."""
    if device == "cuda":
        import torch
        torch.cuda.synchronize()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--roots", nargs="+", type=_checkout, required=True,
                        help="checkouts to compare (the first is the ratios' reference)")
    parser.add_argument("--preset", choices=["base", "tiny"], default="base")
    parser.add_argument("--rounds", type=positive, default=15, help="interleaved rounds")
    parser.add_argument("--steps", type=positive, default=40, help="timed steps a round and checkout")
    parser.add_argument("--beams", type=positive, default=1,
                        help="rows of the one source (with --decode: beam search's beam size, 1 = greedy)")
    parser.add_argument("--threads", type=thread_count, default=1, help="torch.set_num_threads (default 1)")
    parser.add_argument("--decode", action="store_true",
                        help="time whole decodes of --steps tokens (batch 1) instead of steps")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--precision", choices=["float32", "bfloat16", "float16"], default="float32")
    args = parser.parse_args(argv)
    if args.device == "cuda" and (why := cuda_missing()):
        parser.error(f"--device cuda: {why}")
    apply_thread_policy(args.threads)  # before torch starts its thread pool

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False  # as the parity tests
    # Each checkout built twice, in the order given and then in reverse (A B B A), and a checkout's
    # time a round the mean of its two models': two models of the same code in one process differ
    # by 1-3% a token, as their memory lies (two copies of one commit as `--roots`, one model
    # each: the second 0.944x to 0.986x the first; docs/performance.md, "A step's Python").
    order = list(range(len(args.roots))) + list(reversed(range(len(args.roots))))
    runs = [(i, _contender(args.roots[i], args, parser)) for i in order]
    search = "greedy decodes" if args.beams == 1 else f"beam searches ({args.beams} beams)"
    what = (f"{search} of {args.steps} tokens (ms a token)" if args.decode
            else f"{args.beams} rows, {args.steps} steps a round")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"torch {torch.__version__}, {device}, {torch.get_num_threads()} threads, preset {args.preset} "
          f"{args.precision} (6 decoder layers), batch 1, {what}, {args.rounds} interleaved rounds, each checkout's "
          f"model built twice (in the order given, then in reverse)")
    first = [run()[1] for _, run in runs]  # warm: the kept weights, the allocator
    times = np.zeros((args.rounds, len(args.roots)))
    for r in range(args.rounds):  # every other round in reverse: neither goes first always
        for i, run in runs if r % 2 == 0 else reversed(runs):
            times[r, i] += run()[0] / 2
    outputs = "results" if args.decode else "logits"
    unit = "a token" if args.decode else "a step"
    for i, root in enumerate(args.roots):
        ratio = np.median(times[:, i] / times[:, 0])
        mine = [out for (j, _), out in zip(runs, first) if j == i]
        same = all(torch.equal(out, first[0]) for out in mine)
        print(f"{root}: {np.median(times[:, i]):.3f} ms {unit} (fastest round {times[:, i].min():.3f}), "
              f"{ratio:.3f}x the first; {outputs} {'bit for bit equal' if same else 'differ'} to the "
              "first's", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
