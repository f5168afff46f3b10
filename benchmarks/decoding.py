"""Decoding speed: torch_impl and tf_impl against other libraries, and cached vs recompute.

Preset ``base`` (float32), `shared.weights.init_weights` (seed 0) with the generator bias of EOS set
to -3e4 (`bench_weights`; -1e9 before float16 contenders), so that every row of every contender decodes exactly the tokens asked (EOS suppressed: all
do the same work); sources of 32 tokens with padding (row r keeps 32 - 3 (r mod 11), `sources`).

Part ``contenders`` (issues 14 and 28): torch_impl, transformers' ``MarianMTModel.generate``,
tf_impl (compiled, XLA), CTranslate2 float32 and int8 (a reference point: quantised weights; float16
and bfloat16 on request) and ONNX Runtime on the same weights, exported by the project's own
exporters (`_decoding_contenders`: the model is ``base`` with Marian's eps and table, which cost
nothing); greedy (or with ``--beam-size K`` every contender's beam search, no length penalty),
batch 1 and 8, 64 and 128 new tokens; each round decodes every (length, contender) once, interleaved, so a machine whose speed drifts (shared cores) slows every contender
alike. Each contender runs in a process of its own, as users run one framework
(`_decoding_contenders.serve`: frameworks side by side in one process slowed torch_impl by about
5%), and on the CPU all of them on the same ``--threads`` cores (``--no-pin``: the scheduler's;
unpinned, a contender whose process waited while another worked resumes on a core that idled, and
ran 10-20% slower here). With ``--device cuda`` every contender runs on the GPU where its library
can (TF32 off, as in the parity tests; one that cannot is skipped with its library's message) and
none is pinned: the host only launches work there. The first round checks that every row decoded
exactly the tokens asked and that transformers' tokens equal torch_impl's (float32: the same
function; `check_first_round`), and prints the share of each contender's tokens equal to
torch_impl's. Printed: ms per step (a whole decode, encoder included, divided by the new tokens;
median of the rounds; results on the host, so a GPU's work is inside it) and the ratio to
CTranslate2 float32, or where it did not run to the first contender that did (the header names
it): the median of the per-round ratios (target: at most 1.0).

Part ``cache``: per backend, cached vs recompute. Printed: tokens/second, the recompute/cached
time ratio (target: cached >= 5x faster), and the time of the 16th, 64th and 128th token (median
of the 8 steps ending there; target: flat with the cache, growing linearly without it).
Per-token times come from timestamps taken inside the run (a backend's ``step_times``), so that
the machine's speed drifting between runs cannot fake a slope. A backend without it (a compiled
loop) is timed at max_len 16, 64 and 128 instead, and the marginal cost of the tokens in
(0,16], (16,64], (64,128] is printed.

Thread and memory policy (`shared.threads`): ``OMP_WAIT_POLICY=PASSIVE`` and
``THP_MEM_ALLOC_ENABLE=1`` (torch's large allocations on huge pages) are set before any framework starts,
and every contender gets ``--threads`` (default 1: on shared cores one thread per decoder is the
fair and the fast setting; give the core count on a quiet machine).

    python3 dev.py bench decoding [--parts contenders cache]
                                  [--contenders torch transformers tf ct2-float32 ct2-int8
                                                ct2-float16 ct2-bfloat16 onnx]
                                  [--batches 1 8] [--tokens 64 128] [--rounds 5] [--threads N] [--[no-]pin]
                                  [--backends torch tf] [--repeats 3] [--recompute-repeats 1]
                                  [--modes cached recompute] [--device cpu|cuda]
                                  [--precision float32|bfloat16|float16] [--beam-size 1]

Measured (quiet 2-core AMD EPYC, load average 0.5-1.2, 1 thread per contender; ratio to
CTranslate2 float32 per step, at 64 / 128 tokens; the median of 3 rounds, the last of 5):

    torch_impl                            batch 1       batch 8
    before (e15fbc4: MKL addmm)           0.94 / 0.95   1.09 / 1.16
    oneDNN packed weights, 2-pass greedy  1.00 / 0.99   0.71 / 0.75
    + narrowing kernels (out, in)         1.13 / 0.91   0.79 / 0.71
    + THP_MEM_ALLOC_ENABLE=1              1.02 / 0.90   0.78 / 0.73
    tf_impl (same runs)                   0.57 - 0.74   0.81 - 0.90
    CTranslate2 int8                      0.43 - 0.52   0.29 - 0.36

At batch 1 every contender streams its weights from memory once a step (about 165 MB for base);
torch_impl and CTranslate2 (both on MKL) sit at the same bandwidth, within this machine's
run-to-run noise of about 10%, while XLA's own matrix-vector products read faster (tf_impl at 9.5
to 10 ms a step on one core, its CPU time equal to its wall time). Cached vs recompute at 128
tokens: torch 4.6-4.7x at batch 1 (recompute's products have t rows and run near the arithmetic
peak) and 11.7x at batch 8; TF 5.8x and 10.4x. Cached per-token time at 128 / at 16 tokens:
torch 1.02-1.03 (batch 1), 1.26 (batch 8); TF 0.59 and 0.85.

Measured again on a later machine (quiet 2-core AMD EPYC with AVX-512, CTranslate2 float32 at
6.5 ms a step at batch 1 and 16.7 at batch 8; same settings, 3 rounds):

    torch_impl                            batch 1       batch 8
    packed from 2 rows (addmm at 1 row)   1.42 / 1.34   -
    packed from 1 row (PACKED_MIN_ROWS 1) 1.10 / 1.06   0.73 / 0.71
    + torch.inference_mode                1.02 / 1.05   0.72 / 0.66
    tf_impl (same run)                    0.78 / 0.75   0.92 / 0.92
    CTranslate2 int8                      0.63 / 0.64   0.37 / 0.39

Those runs held every contender in one process, unpinned. Then the encoder pass went onto oneDNN's
packed kernels (`torch_impl.cache.EncoderWeights`), and the benchmark to a process per contender,
pinned to one core, with paired ratios (5 rounds; CTranslate2 float32 at 6.3-6.5 ms a step at
batch 1, 16.7-16.9 at batch 8):

    torch_impl                            0.96 / 0.97   0.67 / 0.67
    tf_impl (same run)                    0.81 / 0.78   0.93 / 0.92
    CTranslate2 int8                      0.64 / 0.64   0.37 / 0.38

Other runs of the same setting: 0.95 / 0.95 (3 rounds, ratio of medians, before the pairing), and
0.98 / 1.10 in one (3 rounds, ratio of medians) where the host was busy: CTranslate2 itself took
7.5 ms a step there against 6.4, and the pairing by round is the answer to that drift.

There, at 1 row, oneDNN's packed products read `base`'s 164 MB of kernels at about 33 GB/s against
MKL addmm's 23 (`python3 dev.py bench step_layouts`); what is left of a torch step beyond its
products is about 0.8 ms (Python, attention over the cache, layer norms, the two passes over the
logits; under ``torch.no_grad``, before inference mode); most other CPUs measured since read them
faster through addmm, and a one-row step is now dense on every CPU (docs/performance.md, "One row
dense on every CPU"). Part ``cache``, torch (``--parts cache
--backends torch``): cached 6.6x faster than recompute at 128 tokens at batch 1 and 21.7x at batch
8; cached per-token time at 128 / at 16 tokens 1.00 and 1.10. With the encoder pass packed: 7.0x
and 22.5x, per-token 1.02 and 1.08 (6.15 / 6.26 ms at batch 1, 10.6 / 11.4 at batch 8). TF on
this machine (``--parts cache --backends tf``): 4.3-4.5x at batch 1 (``--recompute-repeats 3``:
0.59 s cached, 2.63 s recompute) and 8.3x at batch 8. Its cached step is at the memory wall: 4.4 ms
a token for about 164 MB of weights is 37 GB/s, what one core streams here (a NumPy sgemv over the
76 MB output projection: 36 GB/s), so the ratio can only grow by recompute growing slower, and
tf.function's recompute runs on oneDNN's AVX-512 products here, faster than on the first machine
(5.8x there).

tf_impl runs as users get it by default: compiled, one ``tf.function`` per (batch, max_len, mode),
with XLA for the cached loop (`tf_impl.decoding.JIT_COMPILE`); it is warmed up at every timed
length, so that no tracing or compilation is timed.
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _decoding_contenders

from shared import TransformerConfig  # noqa: E402
from shared.threads import apply_thread_policy, available_cores, thread_count  # noqa: E402
from shared.decoding import GreedyResult  # noqa: E402
from _cuda import cuda_missing  # noqa: E402
from _decoding_contenders import CONTENDERS, bench_weights  # noqa: E402

LENGTHS = (16, 64, 128)
SRC_LEN = 32


@dataclass
class Backend:
    """One implementation as the benchmark sees it.

    ``decode(src, max_len, use_cache)`` runs greedy decoding of ``src`` (NumPy ids ``(B, S)``) to
    completion (results on the host, so device work is finished when it returns).
    ``step_times(src, max_len, use_cache)``, optional, does the same and returns
    ``(result, per-step seconds (max_len - 1,))``: the time between the ends of consecutive steps.
    ``warm_up_lengths``: the max_len values decoded once, untimed, before timing (a compiled loop
    is traced and compiled per max_len).
    """
    name: str
    description: str
    decode: Callable[[np.ndarray, int, bool], GreedyResult]
    step_times: Callable[[np.ndarray, int, bool], tuple[GreedyResult, np.ndarray]] | None = None
    warm_up_lengths: tuple[int, ...] = (4,)


def torch_backend(config: TransformerConfig, weights: dict, args) -> Backend:
    import torch

    import torch_impl
    from torch_impl.precision import set_precision

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.device == "cuda":  # float32 as users run it, but no TF32, as in the parity tests
        torch.backends.cuda.matmul.allow_tf32 = False
    model = torch_impl.Transformer(config)
    model.import_weights(weights)
    model = model.to(args.device).eval()
    set_precision(model, args.precision)

    def decode(src: np.ndarray, max_len: int, use_cache: bool) -> GreedyResult:
        return torch_impl.greedy_decode(model, src, max_len, use_cache=use_cache)

    def step_times(src: np.ndarray, max_len: int, use_cache: bool):
        stamps = []

        def observe(t, top):  # called once a step, after its token is chosen
            if args.device == "cuda":
                torch.cuda.synchronize()
            stamps.append(time.perf_counter())

        result = torch_impl.greedy_decode(model, src, max_len, use_cache=use_cache, observe=observe)
        return result, np.diff(stamps)

    # On CUDA, timestamps inside the run would need a synchronisation a step, which stops the host
    # from running ahead of the GPU (torch_impl.search reads each step's flags one step late): time
    # whole decodes at several lengths instead.
    return Backend("torch", f"torch {torch.__version__}, {args.device}, {args.precision}, "
                   f"{torch.get_num_threads()} threads", decode,
                   None if args.device == "cuda" else step_times)


def tf_backend(config: TransformerConfig, weights: dict, args) -> Backend:
    """tf_impl with its defaults (compiled; XLA where `tf_impl.decoding.JIT_COMPILE` says), in
    ``--precision``. TF places ops on its first GPU when it sees one, else on the CPU; TF32 off, as
    in the parity tests."""
    import os

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    import tf_impl
    from tf_impl.decoding import JIT_COMPILE
    from tf_impl.precision import set_precision

    try:  # before TF starts its thread pools (part contenders may have started them already)
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    except RuntimeError:
        pass
    tf.config.experimental.enable_tensor_float_32_execution(False)
    tf.get_logger().setLevel("ERROR")  # the retracing notice: a trace per max_len is by design here
    model = tf_impl.Transformer(config)
    model.import_weights(weights)
    set_precision(model, args.precision)  # the Keras mixed policy of `tf_impl.precision`

    def decode(src: np.ndarray, max_len: int, use_cache: bool) -> GreedyResult:
        return tf_impl.greedy_decode(model, src, max_len, use_cache=use_cache)

    where = "GPU" if tf.config.list_physical_devices("GPU") else "CPU"
    threads = tf.config.threading.get_intra_op_parallelism_threads() or "TF's default"
    xla = {True: "XLA", False: "tf.function, no XLA"}
    return Backend("tf", f"tf {tf.__version__}, {where}, {args.precision}, intra-op threads {threads}; compiled: cached "
                   f"{xla[JIT_COMPILE[True]]}, recompute {xla[JIT_COMPILE[False]]}", decode,
                   warm_up_lengths=LENGTHS)


BACKENDS: dict[str, Callable[[TransformerConfig, dict, argparse.Namespace], Backend]] = {
    "torch": torch_backend,
    "tf": tf_backend,
}


def sources(config: TransformerConfig, batch: int) -> np.ndarray:
    """Random ids ``(batch, SRC_LEN)`` (seeded by ``batch``), row r padded after ``SRC_LEN - 3 * (r
    mod 11)`` real tokens: 32 down to 2, then again, never an all-padding row (CTranslate2 skips
    one). Before, row r kept ``32 - 3r``, a count that wrapped past row 10 and left every row from
    22 on all padding; rows 0-10 are unchanged."""
    rng = np.random.default_rng(batch)
    src = rng.integers(3, config.src_vocab, size=(batch, SRC_LEN), dtype=np.int64)
    for row in range(batch):
        src[row, SRC_LEN - 3 * (row % 11):] = config.pad_id
    return src


def timed(backend: Backend, src: np.ndarray, max_len: int, use_cache: bool,
          per_step: bool = False) -> tuple[float, np.ndarray | None]:
    """Seconds of one whole decode (encoder included), and its per-step seconds when asked."""
    start = time.perf_counter()
    if per_step:
        result, steps = backend.step_times(src, max_len, use_cache)
    else:
        result, steps = backend.decode(src, max_len, use_cache), None
    elapsed = time.perf_counter() - start
    if not (result.lengths == max_len).all():  # the EOS bias must force equal work
        raise AssertionError(f"{backend.name}: expected {max_len} tokens per row, got {result.lengths}")
    return elapsed, steps


def measure(backend: Backend, src: np.ndarray, use_cache: bool, repeats: int):
    """(median seconds of a whole decode of LENGTHS[-1] tokens, ms per token at each of LENGTHS,
    a label saying how the latter was measured)."""
    top = LENGTHS[-1]
    if backend.step_times is not None:
        runs = [timed(backend, src, top, use_cache, per_step=True) for _ in range(repeats)]
        steps = np.median(np.stack([s for _, s in runs]), axis=0)  # (top - 1,): step 1 .. top - 1
        at = [float(np.median(steps[n - 9:n - 1])) * 1e3 for n in LENGTHS]  # tokens n-7 .. n
        return statistics.median(t for t, _ in runs), at, "in-run"
    totals = {n: statistics.median(timed(backend, src, n, use_cache)[0] for _ in range(repeats))
              for n in LENGTHS}
    bounds = (0, *LENGTHS)
    at = [(totals[b] - (totals[a] if a else 0.0)) / (b - a) * 1e3 for a, b in zip(bounds, bounds[1:])]
    return totals[top], at, "windows"


def report(name: str, batch: int, mode: str, total: float, at: list[float], how: str) -> None:
    per_token = "  ".join(f"{ms:7.2f}" for ms in at)
    print(f"{name:6s} {batch:5d}  {mode:9s} {batch * LENGTHS[-1] / total:9.1f}  {total:8.2f}   "
          f"{per_token}   ({how})", flush=True)


class Contender:
    """A contender (`_decoding_contenders.serve`) in a process of its own, pinned to ``cpus``."""

    def __init__(self, name: str, settings, cpus: list[int] | None):
        import multiprocessing

        from _decoding_contenders import serve

        context = multiprocessing.get_context("spawn")  # a fresh interpreter: no framework inherited
        self.name, (self.conn, child) = name, context.Pipe()
        self.process = context.Process(target=serve, args=(child, name, settings, cpus), daemon=True)
        self.process.start()

    def ready(self) -> tuple[str, str]:
        """``("ready", description)`` or ``("skipped", reason)``, once the contender is built."""
        try:
            return self.conn.recv()
        except EOFError:  # its process died building it: a library that aborts instead of raising
            self.process.join()
            return "skipped", (f"its process exited with code {self.process.exitcode} while building "
                               "it, before any message (its own output is above)")

    def decode(self, src: np.ndarray, max_len: int) -> tuple[float, np.ndarray]:
        """Seconds of one decode (timed in the contender's process) and its tokens ``(B, max_len)``."""
        self.conn.send((src, max_len))
        reply = self.conn.recv()
        if reply[0] == "failed":
            raise RuntimeError(f"{self.name} failed to decode batch {len(src)}, {max_len} tokens:\n{reply[1]}")
        return reply[1], reply[2]

    def close(self) -> None:
        self.conn.send(None)
        self.process.join()


def pinned_cpus(threads: int, pin: bool) -> list[int] | None:
    """The cores every contender runs on: the last ``threads`` of this process's (all of them when
    there are fewer), or None (``--no-pin``: the scheduler's choice)."""
    if not pin or not hasattr(os, "sched_getaffinity"):
        return None
    return sorted(os.sched_getaffinity(0))[-threads:]


# Contenders whose tokens must equal torch_impl's in float32: the same function, computed by
# another library (checked in the first round), unless the float64 oracle shows a near-tie where
# they part. The others are reported: CTranslate2 and ONNX Runtime are checked against the
# project's decoding in the suite, on small models; int8 is another function; and in half
# precision each library rounds its own way (transformers runs its norms and softmax in the half
# dtype too, torch_impl in float32: docs/design.md, section 12).
SAME_TOKENS = ("transformers",)

# (rows, tokens (rows, n)) -> the float64 oracle's step log-probs along ``tokens`` (rows, n, V)
OracleLogProbs = Callable[[np.ndarray, np.ndarray], np.ndarray]


def oracle_log_probs(config: TransformerConfig, src: np.ndarray) -> OracleLogProbs:
    """The float64 reference's teacher-forced step log-probs of ``src[rows]`` along ``tokens``, on
    the contenders' weights (`bench_weights`), pad impossible (it is never generated): what tells a
    near-tie from a disagreement (`shared.divergence`). Built only where tokens differ (seconds
    for a few rows of ``base``)."""

    def log_probs(rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        from shared import reference
        from shared.loss import log_softmax

        c64 = config.replace(dtype="float64")
        w64 = {name: value.astype(np.float64) for name, value in bench_weights(config).items()}
        tgt = np.concatenate([np.full((len(rows), 1), c64.start_id), tokens[:, :-1]], axis=1)
        out = log_softmax(reference.forward(w64, c64, src[rows], tgt))
        out[..., c64.pad_id] = -np.inf
        return out

    return log_probs


def check_first_round(tokens: dict[str, np.ndarray], n: int, pad_id: int, precision: str,
                      log_probs: OracleLogProbs | None = None, greedy: bool = True) -> str:
    """Every contender decoded exactly ``n`` tokens in every row (the EOS bias forces equal work),
    and, in greedy decoding, those of `SAME_TOKENS` equal torch_impl's in float32, or part from
    them only at near-ties of the oracle's (``log_probs``: a float64 margin within
    ``decode-margin`` of `shared.tolerances`; without it any difference is refused). A beam
    search's hypotheses part at near-ties of summed scores, which one step's margin does not
    measure: there the share is reported, not checked. Returns the line reporting the share of
    each contender's tokens equal to torch_impl's, and the near-ties."""
    from shared.divergence import first_divergence
    from shared.tolerances import bound_for

    for name, ids in tokens.items():
        lengths = (ids != pad_id).sum(axis=1)  # pad is never generated, EOS never chosen
        if ids.shape[1] != n or not (lengths == n).all():
            raise AssertionError(f"{name}: expected {n} tokens per row, got lengths {lengths} "
                                 f"({ids.shape[1]} columns)")
    reference = tokens.get("torch")
    if reference is None:
        return "tokens not compared: torch is not among the contenders"
    shares = []
    for name, ids in tokens.items():
        if name == "torch":
            continue
        equal = f"{100 * (ids == reference).mean():.1f}%"
        share = f"{name} {equal}"
        divergences = first_divergence(reference, ids)
        if divergences and greedy and name in SAME_TOKENS and precision == "float32":
            bound = bound_for("float32", "decode-margin").rtol
            rows = np.array([d.item for d in divergences])
            if log_probs is not None:  # each row's margin, from the oracle along torch_impl's tokens
                margins = log_probs(rows, reference[rows])
                divergences = first_divergence(reference[rows], ids[rows], margins)
                divergences = [d._replace(item=int(rows[d.item])) for d in divergences]
            # either side may hold the oracle's better token; NaN (no oracle) is refused
            refused = [d for d in divergences if not abs(d.margin) <= bound]
            if refused:
                raise AssertionError(f"{name}: tokens differ from torch_impl's ({equal} equal) where "
                                     f"no near-tie explains it (float32 bound {bound:g}): "
                                     + "; ".join(map(str, refused)))
            share += " (near-ties: " + "; ".join(map(str, divergences)) + ")"
        shares.append(share)
    return "tokens equal to torch_impl's: " + (", ".join(shares) or "no other contender")


def reference_contender(made: list[str]) -> str:
    """The contender the ratios are taken to: ct2-float32 when it ran, else the first that ran."""
    return "ct2-float32" if "ct2-float32" in made else made[0]


def run_contenders(args) -> None:
    """Part ``contenders``: interleaved rounds, ms per step and the ratio to a reference contender."""
    from _decoding_contenders import Settings, contender_config

    config = contender_config()
    settings = Settings(args.threads, args.device, args.precision, args.beam_size)
    cpus = pinned_cpus(args.threads, args.pin)
    print(f"part contenders: preset base with norm_eps {config.norm_eps} and pe_layout "
          f"{config.pe_layout!r} (the form every contender computes), {args.device}, {args.precision}, "
          f"{settings.search}; "
          f"each contender in a process of its own, on cores {cpus if cpus else 'of the scheduler'}")
    started = [Contender(name, settings, cpus) for name in args.contenders]
    made = {}
    for contender in started:  # built side by side; nothing is timed until all are ready
        status, text = contender.ready()
        print(f"{contender.name}: {text if status == 'ready' else f'skipped ({text})'}")
        if status == "ready":
            made[contender.name] = contender
    if not made:
        print("no contender could run")
        return
    reference = reference_contender(list(made))
    print(f"ratios: to {reference}, the median of the per-round ratios")
    print(f"contender     batch  tokens  ms/step   vs {reference}")
    for batch in args.batches:
        src = sources(config, batch)
        log_probs = oracle_log_probs(config, src)
        for n in args.tokens:  # warm-up: compilation, first-call allocations; equal work checked
            tokens = {name: contender.decode(src, n)[1] for name, contender in made.items()}
            line = check_first_round(tokens, n, config.pad_id, args.precision,
                                     log_probs if args.beam_size == 1 else None, args.beam_size == 1)
            print(f"batch {batch}, {n} tokens: {line}")
        seconds = {(name, n): [] for name in made for n in args.tokens}
        for _ in range(args.rounds):
            for n in args.tokens:
                for name, contender in made.items():
                    seconds[(name, n)].append(contender.decode(src, n)[0])
        for n in args.tokens:
            base = seconds[(reference, n)]
            for name in made:
                ms = statistics.median(seconds[(name, n)]) / n * 1e3
                # Paired by round (decodes seconds apart), so that the machine's drift between
                # rounds cancels: the median of the per-round ratios.
                ratio = statistics.median(a / b for a, b in zip(seconds[(name, n)], base))
                print(f"{name:12s} {batch:6d} {n:7d} {ms:8.2f}   {ratio:6.2f}x", flush=True)
    for contender in made.values():
        contender.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--parts", nargs="+", default=["contenders", "cache"],
                        choices=["contenders", "cache"])
    parser.add_argument("--contenders", nargs="+", choices=list(CONTENDERS),
                        default=["torch", "transformers", "tf", "ct2-float32", "ct2-int8", "onnx"])
    parser.add_argument("--tokens", nargs="+", type=int, default=[64, 128],
                        help="new tokens per decode, part contenders")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds, part contenders")
    parser.add_argument("--backends", nargs="+", default=list(BACKENDS), choices=list(BACKENDS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--repeats", type=int, default=3, help="timed runs per length, cached")
    parser.add_argument("--recompute-repeats", type=int, default=1,
                        help="timed runs per length, recompute")
    parser.add_argument("--threads", type=thread_count, default=1,
                        help="threads per contender: torch.set_num_threads, TF intra- and inter-op "
                             "threads, CTranslate2 intra_threads (default 1)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=None,
                        help="part contenders: run every contender on the same --threads cores "
                             "(default on the CPU; --no-pin, the default with --device cuda: where "
                             "the scheduler puts them)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="part cache: torch_impl's device; part contenders: every contender's "
                             "(one that cannot run there is skipped, saying why)")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="torch_impl's and tf_impl's precision (their precision modules), and in "
                             "part contenders transformers' (the model's dtype) and the ONNX export's")
    parser.add_argument("--beam-size", type=int, default=1,
                        help="part contenders: beams (default 1: greedy); part cache is greedy")
    parser.add_argument("--modes", nargs="+", default=["cached", "recompute"],
                        choices=["cached", "recompute"],
                        help="decoding modes to time (recompute, quadratic, is the slow one)")
    args = parser.parse_args(argv)
    if args.beam_size < 1:
        parser.error(f"--beam-size: expected at least 1, got {args.beam_size}")
    apply_thread_policy(args.threads)  # before any framework is imported
    if args.pin is None:  # on a GPU the host only launches work: no core to keep warm for it
        args.pin = args.device == "cpu"
    if args.device == "cuda" and (why := cuda_missing()):
        print(f"decoding.py: --device cuda: {why}; run it on a machine with an NVIDIA GPU, or "
              "leave --device out (cpu)", file=sys.stderr)
        return 2

    config = TransformerConfig.preset("base")
    print(f"threads {args.threads} per contender, OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}, "
          f"THP_MEM_ALLOC_ENABLE={os.environ['THP_MEM_ALLOC_ENABLE']}, {available_cores()} cores available, "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"preset base float32 ({config.n_encoder_layers}+{config.n_decoder_layers} layers, "
          f"vocab {config.tgt_vocab}), EOS suppressed, sources of {SRC_LEN} tokens with padding")
    if "contenders" in args.parts:
        run_contenders(args)
        print(f"load average {os.getloadavg()[0]:.1f} at the end of part contenders")
    if "cache" not in args.parts:
        return 0
    print(f"part cache: greedy, lengths {LENGTHS}; repeats {args.repeats} cached / "
          f"{args.recompute_repeats} recompute (median)")
    weights = bench_weights(config)
    header = ("backend batch  mode          tok/s   s/decode   ms per token at 16 / 64 / 128")
    ratios = []
    for name in args.backends:
        try:
            backend = BACKENDS[name](config, weights, args)
        except NotImplementedError as exc:
            print(f"{name}: skipped ({exc})")
            continue
        print(f"{name}: {backend.description}")
        print(header)
        for batch in args.batches:
            src = sources(config, batch)
            modes = [mode == "cached" for mode in args.modes]  # use_cache per mode
            for use_cache in modes:  # warm-up: first-call allocations, compilation
                for n in backend.warm_up_lengths:
                    backend.decode(src, n, use_cache)
            timings = {}
            for use_cache in modes:
                mode = "cached" if use_cache else "recompute"
                repeats = args.repeats if use_cache else args.recompute_repeats
                timings[mode] = measure(backend, src, use_cache, repeats)
                report(name, batch, mode, *timings[mode])
            if len(timings) == 2:
                cached, recompute = timings["cached"], timings["recompute"]
                ratios.append((name, batch, recompute[0] / cached[0], cached[1][-1] / cached[1][0]))
    for name, batch, ratio, flat in ratios:
        print(f"{name} batch {batch}: cached {ratio:.1f}x faster than recompute at {LENGTHS[-1]} tokens "
              f"(target >= 5x); cached per-token time at {LENGTHS[-1]} / at {LENGTHS[0]} = {flat:.2f} "
              "(flat = 1)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
