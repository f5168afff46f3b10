"""Everything a session with an NVIDIA GPU runs for the GPU's figures, in one command.

GPU time is lent in short sessions (docs/performance.md, "GPU"), so the measurements the project
asks of a GPU are listed here once, each with its command, and run in order, each with a time
limit; every part writes its whole output to ``--out/<part>.txt`` and its last lines to the
terminal, and a part that fails or runs out of time is reported and the next one runs. The parts:

* ``suite``: the torch parity suite on the GPU (every CUDA case), ``-n 14 --dist loadfile``, its
  JUnit XML in ``--out/suite.xml`` and, last in its log, the count of CUDA cases by outcome;
* ``ops``: the operations of one cached step (`benchmarks/step_ops.py`) on CUDA, float32 and
  bfloat16;
* ``cache``: cached against recomputed greedy decoding per token, batch 1 and 8, float32 and
  bfloat16 (`benchmarks/decoding.py --parts cache`);
* ``contenders``: torch_impl against transformers' ``generate`` and CTranslate2 on CUDA, float32
  and bfloat16 (`benchmarks/decoding.py --parts contenders --device cuda`);
* ``beam``: beam search (4 beams, float32): torch_impl's token selection against a sort of whole
  rows on CUDA (`benchmarks/beam_selection.py`), then the contenders' beam search on CUDA and on
  the CPU (`benchmarks/decoding.py --beam-size 4`);
* ``nn``: forward and training step against ``nn.Transformer`` in bfloat16, and the forward in
  float32; each forward also against torch_impl's own modules' pass, which its inference pass
  (kept weights, no casts at the call) replaces (`benchmarks/torch_vs_nn_transformer.py`);
* ``agreement``: half-precision tokens against float32 on the trained copy and dates models,
  trained first into ``--out`` (`benchmarks/half_precision.py agreement`);
* ``profile``: where a graphed decode's time goes: its kernels, its fixed cost part by part, and
  one query's attention (`benchmarks/gpu_profile.py`);
* ``cpu``: the CPU contenders, one thread (the GPU machine's CPU is the project's second CPU), the
  step's products in each kernel layout and library at 1 and 8 rows
  (`benchmarks/step_layouts.py`: where an Intel CPU's one-row products lose to CTranslate2's),
  whole decodes at 1 and 2 rows with the step packed and dense (`benchmarks/packed_rows.py`), and
  where a greedy step at batch 1 and a beam step at batch 8 spend their time
  (`benchmarks/decode_profile.py`).

    python3 dev.py bench gpu_session [--parts suite ops cache ...] [--out DIR] [--runs DIR]
                                     [--budget SECONDS]

The agreement part trains its two models into ``--runs`` (default: a new temporary directory),
not into ``--out``: a lent machine sends back only a few files from its output folder. Its dates
task needs babel (the project's ``demo`` extra), which a GPU machine may lack: carry its wheel.

Nothing here is timed against a target: the figures go to docs/performance.md by hand, with the
machine and versions the output names.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _cuda, when imported rather than run
from _cuda import cuda_missing  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
BENCH = ROOT / "benchmarks"


def _parts(runs: Path, out: Path) -> dict[str, list[tuple[list[str], int]]]:
    """``{part: [(argv, seconds allowed), ...]}``, in the order they run; ``runs``: where the
    agreement part trains its models; ``out``: where the suite writes its JUnit XML."""
    decoding = [PY, str(BENCH / "decoding.py")]
    train = [PY, "-m", "twins", "train", "--backend", "torch"]
    return {
        "suite": [([PY, "-m", "pytest", "parity_tests", "-q", "-rfEs", "-n", "14", "--dist", "loadfile",
                    "-p", "no:cacheprovider", f"--junitxml={out / 'suite.xml'}"], 420)],
        "ops": [([PY, str(BENCH / "step_ops.py"), "--device", "cuda", "--precision", p] + forward, 120)
                for p in ("float32", "bfloat16")
                for forward in ([], ["--forward", "128", "--batch", "64"])],
        "cache": [(decoding + ["--parts", "cache", "--backends", "torch", "--device", "cuda",
                               "--precision", p, "--batches", "1", "8"], 300)
                  for p in ("float32", "bfloat16")],
        "contenders": [(decoding + ["--parts", "contenders", "--device", "cuda", "--precision", p,
                                    "--contenders", "torch", "transformers", "ct2-float32",
                                    f"ct2-{'float16' if p == 'float32' else p}", "--batches", "1", "8",
                                    "--tokens", "64", "128", "--rounds", "3"], 400)
                       for p in ("float32", "bfloat16")],
        "beam": [([PY, str(BENCH / "beam_selection.py"), "--device", "cuda", "--tokens", "64",
                   "--rounds", "3"], 200),
                 (decoding + ["--parts", "contenders", "--device", "cuda", "--beam-size", "4",
                              "--contenders", "torch", "transformers", "ct2-float32", "--batches", "1", "8",
                              "--tokens", "64", "--rounds", "3"], 300),
                 (decoding + ["--parts", "contenders", "--beam-size", "4", "--contenders", "torch",
                              "ct2-float32", "--batches", "1", "8", "--tokens", "64", "--rounds", "3",
                              "--threads", "1"], 300)],
        "nn": [([PY, str(BENCH / "torch_vs_nn_transformer.py"), "--device", "cuda", "--precision",
                 precision, "--batch", "64", "--length", "128"] + train_flag, 200)
               for precision, train_flag in (("bfloat16", []), ("bfloat16", ["--train"]),
                                             ("float32", []))],
        "agreement": [(train + ["--task", "copy", "--steps", "600", "--checkpoint", str(runs / "copy")], 300),
                      (train + ["--task", "dates", "--steps", "3000", "--checkpoint", str(runs / "dates")], 600),
                      ([PY, str(BENCH / "half_precision.py"), "agreement", "--checkpoint",
                        str(runs / "copy"), str(runs / "dates"), "--heldout", "500", "--device", "cuda",
                        "--backends", "torch"], 600)],
        "profile": [([PY, str(BENCH / "gpu_profile.py")], 300)],
        "cpu": [(decoding + ["--parts", "contenders", "--contenders", "torch", "ct2-float32",
                             "--batches", "1", "8", "--tokens", "64", "128", "--rounds", "3",
                             "--threads", "1"], 500),
                ([PY, str(BENCH / "step_layouts.py"), "--rows", "1", "8", "--encoder-rows", "32"], 200),
                ([PY, str(BENCH / "packed_rows.py"), "--batches", "1", "2", "--tokens", "64"], 200),
                ([PY, str(BENCH / "decode_profile.py"), "--tokens", "16", "128"], 120),
                ([PY, str(BENCH / "decode_profile.py"), "--batches", "8", "--beam-size", "4", "--tokens",
                  "16", "64"], 120)],
    }


def cuda_cases(junit_xml: Path) -> str:
    """One line: how many test cases whose id names ``cuda`` passed, were skipped and failed, from
    pytest's JUnit XML (the suite's summary counts every case, CPU ones too)."""
    import xml.etree.ElementTree as ET
    outcomes = {"passed": 0, "skipped": 0, "failed": 0}
    for case in ET.parse(junit_xml).iter("testcase"):
        if "cuda" in case.get("name", ""):
            outcome = next((o for tag, o in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped"))
                            if case.find(tag) is not None), "passed")
            outcomes[outcome] += 1
    return "CUDA cases: " + ", ".join(f"{n} {outcome}" for outcome, n in outcomes.items())


def main(argv: list[str] | None = None) -> int:
    out_default = Path(os.environ.get("OUT", ROOT / "gpu_session"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=out_default,
                        help="where each part's output goes (default $OUT, else ./gpu_session)")
    parser.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                        help="seconds for the whole run (a lent machine's call has a limit): each "
                             "command's own limit is cut to what is left, and a command with less "
                             "than 20 s left is skipped, saying so")
    parser.add_argument("--runs", type=Path, default=None,
                        help="where the agreement part trains its models (default: a new temporary directory)")
    parser.add_argument("--parts", nargs="+", default=list(_parts(Path("."), Path("."))),
                        choices=list(_parts(Path("."), Path("."))))
    args = parser.parse_args(argv)
    on_gpu = [part for part in args.parts if part != "cpu"]
    if on_gpu and (why := cuda_missing()):
        parser.error(f"--parts {' '.join(on_gpu)}: {why}; only --parts cpu runs here")
    args.out.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    failed = []
    runs = args.runs or (Path(tempfile.mkdtemp(prefix="gpu_session_runs_")) if "agreement" in args.parts
                         else Path("."))  # made only where a part trains
    parts = _parts(runs, args.out)
    deadline = None if args.budget is None else time.perf_counter() + args.budget
    for part in args.parts:
        log = args.out / f"{part}.txt"
        with open(log, "w") as sink:
            for command, limit in parts[part]:
                shown = " ".join(Path(c).name if c == PY else c.replace(str(ROOT) + "/", "") for c in command)
                sink.write(f"$ {shown}\n")
                sink.flush()
                start = time.perf_counter()
                if deadline is not None:
                    limit = min(limit, deadline - start)
                    if limit < 20:
                        sink.write(f"# skipped: {deadline - start:.0f} s of --budget {args.budget:.0f} left\n")
                        failed.append(f"{part}: {shown}: skipped (--budget)")
                        continue
                try:
                    code = subprocess.run(command, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT,
                                          stdin=subprocess.DEVNULL, timeout=limit).returncode
                except subprocess.TimeoutExpired:
                    code = f"timed out after {limit:.0f} s"
                sink.write(f"# exit {code}, {time.perf_counter() - start:.0f} s\n")
                if code != 0:
                    failed.append(f"{part}: {shown}: {code}")
            if part == "suite" and (args.out / "suite.xml").is_file():
                sink.write(cuda_cases(args.out / "suite.xml") + "\n")
        print(f"== {part} ({log})")
        print("\n".join(log.read_text().splitlines()[-14:]), flush=True)
    if failed:
        print("failed:\n  " + "\n  ".join(failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
