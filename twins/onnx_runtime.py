"""ONNX Runtime as a backend: an ONNX export (`shared.exporters.onnx`) served by ``onnxruntime``,
decoded by the shared NumPy search (`shared.decoding`) over the ``decoder_with_past`` session.

Imports NumPy, ``shared`` and ``onnxruntime`` (at call time), never torch or TensorFlow: a server
with neither runs it (parity_tests/test_onnx.py runs it in a process where both are blocked).
``onnx`` itself is needed only by `OnnxRuntimeModel.from_weights`, which builds the graphs in memory.

* `OnnxRuntimeModel.load(path)` opens the three sessions of an export directory;
  `OnnxRuntimeModel.from_weights(config, weights, precision=...)` exports in memory (no files).
  Both take ``threads`` (ONNX Runtime's intra-op pool; default: its own, one per core).
* A float16 export (`shared.exporters.onnx`, ``precision="float16"``) is served the same way:
  ``precision`` (read from the graphs' types) is ``"float16"``, the memory and the search stay
  float32, the cache (``present`` / ``past_key_values``) is float16 and passed back as it came,
  and a step's float16 logits are widened to float32 for the search (exact), as torch_impl's
  cached step widens its half logits (`shared.precision`).
* ``encode``, ``logits`` (the full pass through ``decoder_model``), ``greedy`` and ``beam``
  (`GreedyResult` / `BeamResult`, as `twins.backends`' adapters return) take NumPy ids, and an
  optional ``src_mask`` in the project's convention (bool, True = may attend, broadcastable to
  ``(B, 1, 1, S)``; default ``src != pad_id``, all True with ``mask_padding=False``).
* `OnnxStep` is the step contract of docs/design.md section 7 over the sessions: step 0 runs
  ``decoder_model`` on the start column, later steps ``decoder_with_past`` on column ``t`` with the
  cache as the state; ``reorder`` gathers the self-attention cache's rows (the cross-attention keys
  and values are the same for every beam of an item, and a row is only ever reordered within its
  item, so they are never copied).

**Bad input** is refused before a session runs, with the messages of `shared.checks` (the same as
every implementation's): ids that are not integers (``TypeError``), not ``(batch, seq)``, empty,
longer than ``max_len`` or outside the vocabulary, a mask of the wrong dtype or shape, decoding
arguments out of range (`shared.decoding.check_search_args`); a missing export file is a
``FileNotFoundError`` naming it. Nothing reaches the graphs that could come back as plausible tokens.

**Session options** (measured in docs/performance.md, "ONNX Runtime decoding"):
``graph_optimization_level=ORT_ENABLE_ALL`` (constant folding, the tied generator's ``Transpose``
folded once, MatMul + Add into Gemm-like kernels, Transpose + MatMul into ``FusedMatMul``, layer
norm kernels), ``execution_mode=ORT_SEQUENTIAL`` and ``inter_op_num_threads=1`` (a decoder step is
one chain of small operators: nothing to run in parallel between them), ``intra_op_num_threads``
as given. Spinning of idle pool threads follows ``OMP_WAIT_POLICY`` (`shared.threads`): PASSIVE,
the command line's default, turns it off, as the other backends' threads sleep. A float64 graph
gets ``ORT_ENABLE_BASIC`` instead (the comment above `check_options` says why); a caller's own
``SessionOptions`` are used as given and never changed (`check_options`).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping

import numpy as np

from shared import TransformerConfig
from shared import decoding as search
from shared.checks import check_config, check_mask, check_same_batch, checked_ids, mask_array
from shared.decoding import BeamResult, GreedyResult
from shared.decoding_args import bad_step_message, check_beam_size, check_flags
from shared.exporters.onnx import (DECODER, DECODER_WITH_PAST, ENCODER, GRAPHS, export_precision, past_names,
                                   read_onnx, source_mask)
from shared.messages import type_shown
from shared.threads import check_threads

FORMAT = "onnx"


def session_options(threads: int | None = None, spinning: bool | None = None, dtype: str = "float32"):
    """The ``onnxruntime.SessionOptions`` of every session here (module docstring) for a graph
    computing in ``dtype``; ``spinning`` None follows ``OMP_WAIT_POLICY`` (PASSIVE: idle pool
    threads sleep)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.graph_optimization_level = (ort.GraphOptimizationLevel.ORT_ENABLE_ALL if dtype == "float32"
                                        else ort.GraphOptimizationLevel.ORT_ENABLE_BASIC)
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.inter_op_num_threads = 1
    if threads is not None:
        options.intra_op_num_threads = int(threads)
    if spinning is None:
        spinning = os.environ.get("OMP_WAIT_POLICY", "").upper() != "PASSIVE"
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    options.log_severity_level = 3  # errors only: not the per-session notes about fused nodes
    return options


# A float64 graph is the proof that the export computes the oracle's function (1e-12), so its
# sessions run only the basic, exact rewrites (constant folding, redundant nodes). The extended
# fusions are float32 kernels in places: ONNX Runtime 1.30 (the lent GPU machine's) fuses swish
# into com.microsoft.QuickGelu, float32 only, so the session fails, and its fusions made the
# head-dim and all-sinusoidal variants part from the oracle by 1.7e-9 relative. 1.32 (pinned)
# passes either way; a float32 graph keeps every optimisation its bounds were measured with.
_FLOAT64_LEVELS = ("ORT_DISABLE_ALL", "ORT_ENABLE_BASIC")


def check_options(ort, options, dtype: str) -> None:
    """Refuse caller-supplied ``options`` whose ``graph_optimization_level`` is above
    ``ORT_ENABLE_BASIC`` for a graph computing in float64 (the comment above says why).

    Refused, not lowered: an ``onnxruntime.SessionOptions`` cannot be copied (no copy, no pickle,
    and its session config entries, initializers, custom op libraries and providers cannot be read
    back), so lowering it would mean changing the caller's object behind their back, and a session
    built from options is expected to run with those options, as ``onnxruntime.InferenceSession``
    does; so the caller hears of the conflict and chooses (``options=None`` gives the project's)."""
    levels = ort.GraphOptimizationLevel
    allowed = [getattr(levels, name) for name in _FLOAT64_LEVELS]
    level = options.graph_optimization_level
    if dtype != "float32" and level not in allowed:
        raise ValueError(f"options.graph_optimization_level: expected {' or '.join(_FLOAT64_LEVELS)} for a "
                         f"{dtype} model (the extended fusions are float32 kernels in places), got "
                         f"{level.name}; or pass options=None for this module's settings")


def _first_line(err: Exception, limit: int = 300) -> str:
    """An onnxruntime error in a message of ours: its first line (its text runs to many), cut."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__


def _session(ort, model, options):
    """A CPU session of a path or of serialized bytes; a file ONNX Runtime cannot open (truncated,
    empty, not a graph) is a ValueError naming it, not onnxruntime's ``InvalidProtobuf``."""
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except (MemoryError, KeyboardInterrupt):
        raise
    except Exception as err:  # noqa: BLE001  (onnxruntime's own kinds: InvalidProtobuf, Fail, ...)
        if not isinstance(model, (str, os.PathLike)):
            raise
        raise ValueError(f"{str(model)!r}: not a graph ONNX Runtime can open ({_first_line(err)})") from None


class OnnxRuntimeModel:
    """The three sessions of an ONNX export and its config; NumPy in, NumPy out."""

    name = FORMAT

    def __init__(self, config: TransformerConfig, graphs: Mapping[str, object], threads: int | None = None,
                 options=None):
        """``graphs``: file name -> a path or the serialized graph; ``options``: an
        ``onnxruntime.SessionOptions`` in place of `session_options` (``threads``), used as given
        and never changed; a float64 model refuses a level above ``ORT_ENABLE_BASIC``
        (`check_options`)."""
        check_config(config)
        threads = check_threads(threads, "threads")  # 0 and "2" were taken, 10**12 failed in pybind's words
        if not isinstance(graphs, Mapping) or sorted(graphs) != sorted(GRAPHS):
            got = sorted(graphs) if isinstance(graphs, Mapping) else type_shown(graphs)
            raise ValueError(f"graphs: expected a mapping of {', '.join(GRAPHS)} to a path or a "
                             f"serialized graph each, got {got}")
        try:
            import onnxruntime as ort
        except ImportError as err:
            raise ImportError(f"the onnx backend is not installed ({err}); install the 'onnx' extra") from None
        if options is not None and not isinstance(options, ort.SessionOptions):
            raise TypeError(f"options: expected an onnxruntime.SessionOptions or None, got {type_shown(options)}")
        self.config, self.threads = config, threads
        if options is None:
            options = session_options(threads, dtype=config.dtype)
        else:
            check_options(ort, options, config.dtype)
        self.encoder = _session(ort, graphs[ENCODER], options)
        self.decoder = _session(ort, graphs[DECODER], options)
        self.decoder_with_past = _session(ort, graphs[DECODER_WITH_PAST], options)
        sessions = {ENCODER: self.encoder, DECODER: self.decoder, DECODER_WITH_PAST: self.decoder_with_past}
        exported = {name: self._exported(session) for name, session in sessions.items()}
        self._check_graph_files(exported)
        self._check_graphs()
        self._check_exported_config(exported)
        self._present = [o.name for o in self.decoder.get_outputs()]
        self._past = past_names(config.n_decoder_layers, "past_key_values")
        self._with_past_out = [o.name for o in self.decoder_with_past.get_outputs()]
        # what the products compute in, as the graphs declare it (the logits are the generator's)
        self.precision = "float16" if self.decoder.get_outputs()[0].type == "tensor(float16)" else "float32"

    def _check_graphs(self) -> None:
        """The config must be the graphs' (an export's config.json is a separate file): as many
        decoder layers as the cached graph takes past keys and values for, and the logits as wide
        as the target vocabulary. A ValueError naming the field otherwise, before any name of the
        config's layers is built (a config.json may claim 10**9 of them)."""
        c = self.config
        held = {int(name.split(".")[1]) for name in (i.name for i in self.decoder_with_past.get_inputs())
                if name.startswith("past_key_values.") and name.split(".")[1].isdigit()}
        if len(held) != c.n_decoder_layers or (held and max(held) != c.n_decoder_layers - 1):
            raise ValueError(f"n_decoder_layers: the config says {c.n_decoder_layers}, the graphs "
                             f"hold {len(held)} decoder layers")
        width = self.decoder.get_outputs()[0].shape[-1]
        if isinstance(width, int) and width != c.tgt_vocab:
            raise ValueError(f"tgt_vocab: the config says {c.tgt_vocab}, the graphs' logits are "
                             f"{width} wide")
        kinds = {name: session.get_outputs()[0].type for name, session in
                 ((DECODER, self.decoder), (DECODER_WITH_PAST, self.decoder_with_past))}
        if len(set(kinds.values())) > 1:  # a graph of another export's precision copied in
            raise ValueError("graphs: expected one precision, got " + ", ".join(
                f"{name} computing in {kind}" for name, kind in kinds.items()))

    @staticmethod
    def _exported(session) -> tuple[str, TransformerConfig | None]:
        """What a graph's doc string says it is (`shared.exporters.onnx`: ``"decoder_model.onnx
        (float32): {config}"``): its file name and the config it was exported with; None for a
        graph without such a doc string (not this project's), which is not compared."""
        graph, _, rest = session.get_modelmeta().description.partition(" (")
        try:
            return graph, TransformerConfig.from_json(rest.partition("): ")[2])
        except (ValueError, TypeError, KeyError):
            return graph, None

    @staticmethod
    def _check_graph_files(exported: dict) -> None:
        """Each graph is the file it is opened as (``exported``: file name -> `_exported`): a
        decoder_model.onnx copied over decoder_with_past_model.onnx was blamed on config.json's
        layer count."""
        for name, (graph, config) in exported.items():
            if config is not None and graph != name:
                raise ValueError(f"graphs: {name} holds {graph}")

    def _check_exported_config(self, exported: dict) -> None:
        """The config is the one each graph was exported with, field by field (``exported``). An
        edited config.json (pad_id, decoder_start_id, mask_padding: what the search and the source
        mask read outside the graphs) decoded other tokens without a word, and a graph of another
        export failed half-way through a decode in ONNX Runtime's words."""
        c, problems, named = self.config, [], set()
        for name, (_, config) in exported.items():
            for field in c.to_dict() if config is not None else ():
                if field not in named and getattr(c, field) != getattr(config, field):
                    named.add(field)  # once, with the first graph that says otherwise
                    problems.append(f"{field}: the config says {getattr(c, field)!r}, {name} was "
                                    f"exported with {getattr(config, field)!r}")
        if problems:
            raise ValueError(f"config: {'; '.join(problems)}")

    @classmethod
    def load(cls, path: str | os.PathLike, threads: int | None = None) -> "OnnxRuntimeModel":
        """Open the export directory ``path`` (`shared.exporters.onnx.read_onnx`); a config.json
        that is not its graphs' is refused naming it (`_check_graphs`)."""
        config, files = read_onnx(path)
        try:
            model = cls(config, {name: str(file) for name, file in files.items()}, threads)
        except ValueError as err:
            if str(err).startswith(("n_decoder_layers:", "tgt_vocab:")):
                raise ValueError(f"{str(Path(path) / 'config.json')!r}: {err}") from None
            if str(err).startswith("config: "):
                raise ValueError(f"{str(Path(path) / 'config.json')!r}: {str(err)[8:]}") from None
            if str(err).startswith("graphs:"):
                raise ValueError(f"{str(path)!r}: {err}") from None
            raise
        model._check_sizes(path)
        said = export_precision(path)
        if said != model.precision:  # else blamed on --precision, which the user may not have given
            raise ValueError(f"{str(Path(path) / 'config.json')!r}: precision: the config says "
                             f"{said!r}, the graphs compute in {model.precision}")
        return model

    def _check_sizes(self, path) -> None:
        """The config's ``src_vocab``, ``tgt_vocab`` and ``max_len``, which the graphs hold in their
        tables but no session declares, run once through the encoder and the full decoder: the
        largest ids at the longest length. A config.json claiming more failed at the first input
        that used it (ONNX Runtime's Gather error), or silently sliced the positional table short
        and failed in the search (an IndexError); it is named here, once, at open."""
        import onnxruntime as ort
        c = self.config
        src = np.full((1, c.max_len), c.src_vocab - 1, np.int64)
        tgt = np.full((1, c.max_len), c.tgt_vocab - 1, np.int64)
        mask = np.ones_like(src)
        quiet = ort.RunOptions()
        quiet.log_severity_level = 4  # a failure is reported below, not also logged in red
        try:
            memory = self.encoder.run(None, {"input_ids": src, "attention_mask": mask}, quiet)[0]
            logits = self.decoder.run(["logits"], {"input_ids": tgt, "encoder_hidden_states": memory,
                                                   "encoder_attention_mask": mask}, quiet)[0]
            ran = tuple(memory.shape[:2]) == (1, c.max_len) and logits.shape == (1, c.max_len, c.tgt_vocab)
            why = "" if ran else f"the decoder gave logits of shape {logits.shape}"
        except (MemoryError, KeyboardInterrupt):
            raise
        except Exception as err:  # noqa: BLE001  (onnxruntime's own kinds)
            why = _first_line(err)
        if why:
            raise ValueError(f"{str(Path(path) / 'config.json')!r}: src_vocab={c.src_vocab}, "
                             f"tgt_vocab={c.tgt_vocab}, max_len={c.max_len}: expected sizes the graphs' "
                             f"tables hold, got a run of the largest ids at the longest length that "
                             f"fails ({why})")

    @classmethod
    def from_weights(cls, config: TransformerConfig, weights: Mapping[str, np.ndarray],
                     threads: int | None = None, precision: str = "float32") -> "OnnxRuntimeModel":
        """Export ``(config, weights)`` in ``precision`` in memory and open it (needs ``onnx`` as
        well; `shared.exporters.onnx.build_models` refuses what it cannot export, by name)."""
        from shared.exporters.onnx import build_models
        models = build_models(config, weights, precision)
        return cls(config, {name: m.SerializeToString() for name, m in models.items()}, threads)

    # -- input checks (shared.checks: the messages every implementation gives) ---------------------
    def _ids(self, name: str, ids, vocab: int) -> np.ndarray:
        return checked_ids(name, ids, vocab, self.config.max_len).astype(np.int64, copy=False)

    def _source(self, src, src_mask, *search_args) -> tuple[np.ndarray, np.ndarray]:
        """Checked ``src`` int64 (B, S) and its ``attention_mask`` int64 (B, S); the decoding
        arguments ``search_args`` (max_len, beam size, length penalty) checked between the two,
        in the order of every implementation (`shared.decoding`)."""
        src = self._ids("src", src, self.config.src_vocab)
        if search_args:
            search.check_search_args(self.config, *search_args)
        return src, self._attention_mask(src, src_mask)

    def _attention_mask(self, src: np.ndarray, src_mask) -> np.ndarray:
        """The checked ``src_mask`` (or the default, ``src != pad_id``) as the graphs' key mask,
        int64 (B, S)."""
        if src_mask is None:
            return source_mask(self.config, src)
        src_mask = mask_array("src_mask", src_mask)
        b, s = src.shape
        check_mask("src_mask", src_mask.shape, "bool", True, b, self.config.n_heads, 1, s)
        if src_mask.shape[1] != 1:
            raise ValueError(f"src_mask: expected one mask for every head, shape (batch|1, 1, 1, {s}), "
                             f"got shape {src_mask.shape}: the ONNX graphs take a key mask per row")
        return np.broadcast_to(src_mask[:, 0, 0, :], (b, s)).astype(np.int64)

    # -- the model -----------------------------------------------------------------------------------
    def _encode(self, src: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(None, {"input_ids": src, "attention_mask": mask})[0]

    def encode(self, src, src_mask=None) -> np.ndarray:
        """The memory (B, S, d_model), ``config.dtype`` (the stream's, in float16 exports too)."""
        return self._encode(*self._source(src, src_mask))

    def logits(self, src, tgt, src_mask=None) -> np.ndarray:
        """The full pass: logits (B, T, tgt_vocab) of target inputs ``tgt`` (B, T) (``decoder_model``,
        the target masked as the oracle's default: convention 2), as the graph returns them:
        ``config.dtype``, float16 from a float16 export (as torch_impl's half forward pass)."""
        src = self._ids("src", src, self.config.src_vocab)  # src, tgt, then the mask: the reference's order
        tgt = self._ids("tgt", tgt, self.config.tgt_vocab)
        check_same_batch(src.shape, tgt.shape)
        mask = self._attention_mask(src, src_mask)
        feed = {"input_ids": tgt, "encoder_hidden_states": self._encode(src, mask),
                "encoder_attention_mask": mask}
        return self.decoder.run(["logits"], feed)[0]

    def step(self, src, beams: int = 1, src_mask=None) -> "OnnxStep":
        """A checked source encoded once, as an `OnnxStep` with ``beams`` rows per item."""
        check_beam_size(beams, self.config.tgt_vocab, name="beams")  # 0 was taken, -1 NumPy's error
        src, mask = self._source(src, src_mask)
        return OnnxStep(self, self._encode(src, mask), mask, beams)

    def greedy(self, src, max_len: int, src_mask=None) -> GreedyResult:
        """Greedy decoding (`shared.decoding.greedy_search`), the search in ``config.dtype``
        (float32 for a float16 export)."""
        c = self.config
        src, mask = self._source(src, src_mask, max_len)
        step = OnnxStep(self, self._encode(src, mask), mask, 1)
        return search.greedy_search(step, src.shape[0], max_len, c.start_id, c.eos_id, c.pad_id)

    def beam(self, src, max_len: int, beam_size: int = 4, length_penalty: float = 0.0,
             return_all: bool = False, src_mask=None) -> BeamResult:
        """Beam search (`shared.decoding.beam_search`): K alive and K finished hypotheses per item."""
        c = self.config
        src, mask = self._source(src, src_mask, max_len, beam_size, length_penalty)
        check_flags(return_all=return_all)  # "no" returned every hypothesis
        step = OnnxStep(self, self._encode(src, mask), mask, beam_size)
        return search.beam_search(step, src.shape[0], max_len, beam_size, c.start_id, c.eos_id, c.pad_id,
                                  length_penalty, return_all)


class OnnxStep:
    """The step contract (`shared.decoding.Step`) over the decoder sessions.

    Rows are ``item * beams + beam``. The state is ``None`` before the first step, then
    ``(self-attention keys and values, cross-attention keys and values)``: two lists of arrays
    (N, H, len, d_k) in `past_names` order, in the graphs' cache dtype (float16 from a float16
    export). A step returns (N, V) logits in ``config.dtype``: a float16 export's are widened for
    the search (exactly), never searched in float16."""

    def __init__(self, model: OnnxRuntimeModel, memory: np.ndarray, mask: np.ndarray, beams: int):
        self.model, self.vocab = model, model.config.tgt_vocab
        self.dtype = np.dtype(model.config.dtype)
        self.memory = np.repeat(memory, beams, axis=0)  # (N, S, d)
        self.mask = np.repeat(mask, beams, axis=0)  # (N, S) int64

    def initial_state(self):
        return None

    def __call__(self, prefixes: np.ndarray, t: int, state):
        m = self.model
        column = np.ascontiguousarray(prefixes[:, t: t + 1], dtype=np.int64)
        if state is None:  # step 0: the start column through decoder_model, which makes the cache
            out = m.decoder.run(None, {"input_ids": column, "encoder_hidden_states": self.memory,
                                       "encoder_attention_mask": self.mask})
            named = dict(zip(m._present, out))
            own = [named[n.replace("past_key_values", "present")] for n in m._past if ".decoder." in n]
            cross = [named[n.replace("past_key_values", "present")] for n in m._past if ".encoder." in n]
            return out[0][:, -1].astype(self.dtype, copy=False), (own, cross)
        own, cross = state
        feed = {"input_ids": column, "encoder_attention_mask": self.mask}
        pairs = iter(own), iter(cross)
        for name in m._past:
            feed[name] = next(pairs[".encoder." in name])
        out = m.decoder_with_past.run(m._with_past_out, feed)
        return out[0][:, 0].astype(self.dtype, copy=False), (out[1:], cross)

    def reorder(self, state, rows):
        if state is None:
            return state
        own, cross = state
        return [a[rows] for a in own], cross


def verify(config: TransformerConfig, weights: Mapping[str, np.ndarray], path, seed: int = 0) -> int:
    """``twins convert --to onnx --verify``: load the export at ``path`` with ONNX Runtime and
    compare, on one batch with a padded and an all-padding source row, its logits (the full pass
    and the cached steps) with the float64 oracle on the source weights, against
    ``(config.dtype, "onnx:reference")`` (``("float16", "onnx:reference")`` for a float16 export),
    and its greedy tokens with the oracle's: identical, or, from a float16 export, parted only at a
    near-tie of the oracle's within its float16 decode margin (`shared.divergence.decode_margin`:
    grown with the oracle's pass, on its logits' scale; each parting printed with its margin). The
    logits' bound grows with the model's, read from the oracle's pass of the batch
    (`shared.conditioning`). Prints the table; the exit status (0 when every line passes)."""
    import onnxruntime

    from shared import reference as R
    from shared.batches import src_tgt
    from shared.conditioning import largest
    from shared.divergence import decode_margin, first_divergence, oracle_log_probs
    from shared.tolerances import bound_for, max_abs_diff, max_rel_diff

    model = OnnxRuntimeModel.load(path, threads=1)
    precision = config.dtype if model.precision == "float32" else model.precision
    length = min(7, config.max_len)  # a model of max_len 2 has no row of 3 to pad
    src, tgt = src_tgt(config, 3, length, length, seed, [length, min(3, length), 0], [length] * 3)
    expected, trace = R.forward(weights, config, src, tgt, return_trace=True)
    step = model.step(src)
    state, steps = step.initial_state(), []
    for t in range(tgt.shape[1]):
        logits, state = step(tgt, t, state)
        steps.append(logits)
    bound = bound_for(precision, "onnx:reference")
    bound = bound.conditioned(*largest(config, weights, trace))  # grown with the model: shared.conditioning
    print(f"verify: DST = {path} ({precision}) in onnxruntime {onnxruntime.__version__}, against the float64 "
          f"reference on the source weights; one batch of 3 x {length} source tokens (a padded and "
          f"an all-padding row) and 3 x {length} target tokens (seed {seed})")
    print(f"{'compared':<34} {'max abs':>9}  {'max rel':>9}  {'bound':>7}  result")
    ok = True
    for name, got in (("decoder_model logits", model.logits(src, tgt)),
                      ("decoder_with_past logits", np.stack(steps, 1))):
        passed = bound.allows(got, expected)
        ok &= passed
        print(f"{name:<34} {max_abs_diff(got, expected):>9.2e}  {max_rel_diff(got, expected):>9.2e}  "
              f"{bound.rtol:>7.1e}  {'pass' if passed else 'FAIL'}")
    if bound.grown:
        print(f"  (bound {bound.grown})")
    max_len = min(8, config.max_len)
    oracle = R.greedy_decode(R.Model(weights, config), src, max_len).tokens
    label = f"greedy tokens ({max_len} new)"
    try:
        tokens = model.greedy(src, max_len).tokens
    except ValueError as err:
        if not str(err).startswith(bad_step_message("").partition(",")[0]):  # another error: the command's
            raise
        # logits the search cannot read (a float16 export that overflows): a failed check, as the
        # logits' lines above say, not an error of the command
        print(f"{label:<34} {'NaN or +inf logits':>31}  FAIL")
        print("FAIL")
        return 1
    parts = first_divergence(oracle, tokens, oracle_log_probs(weights, config, src, oracle))
    # float32 / float64 exports: identical tokens; float16's near-ties within its margin, grown
    # with the model's conditioning (shared.conditioning) as every half-precision bound is
    passed = not parts
    if parts and precision == "float16":
        margin = decode_margin("float16", weights, config, src, oracle)
        passed = all(abs(d.margin) <= margin for d in parts)
    result = "identical" if not parts else "near-ties" if passed else "DIFFER"
    print(f"{label:<34} {result:>31}  {'pass' if passed else 'FAIL'}")
    for d in parts:
        print(f"  {d}")
    ok &= passed
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
