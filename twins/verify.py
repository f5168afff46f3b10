"""``twins convert --verify``: the result run beside its source, by whatever runs each format
(`shared.formats.Format.runs_in`): a parity table of one batch's logits, or, for a destination that
is no model of this project, that target's own check (CTranslate2's ``score_batch`` log-probs; a
SavedModel's decoded tokens). True when every row passes.

=================  ===========================================================================
``runs_in``        run by
=================  ===========================================================================
``reference``      `twins.backends` (the NumPy reference; ``torch``, ``tf``: the backends)
``transformers``   `twins.transformers_run` (transformers itself)
``ctranslate2``    `verify_ctranslate2` (``ctranslate2.Translator.score_batch``)
``saved-model``    `twins.saved_model.verify` (``tf.saved_model.load``)
``onnxruntime``    `twins.onnx_runtime.verify` (``onnxruntime.InferenceSession``)
None               no model of the source here: its imported weights in all three implementations
=================  ===========================================================================
"""
from __future__ import annotations

import numpy as np

from shared import TransformerConfig
from shared.formats import Format


def verify(src_fmt: Format, src: str, dst_fmt: Format, dst: str, config: TransformerConfig,
           weights: dict, seed: int = 0) -> bool:
    """Run the check of ``dst_fmt``'s runner; True when it passes."""
    check = CHECKS.get(dst_fmt.runs_in, logits_parity)
    return check(src_fmt, src, dst_fmt, dst, config, weights, seed)


def _load(impl: str, path: str | None, config: TransformerConfig, weights: dict | None):
    """The `twins.backends` adapter of one implementation: loaded by that implementation from the
    file at ``path``, or holding ``weights`` when ``path`` is None."""
    from .backends import load_adapter, make_adapter
    if impl == "transformers":
        from .transformers_run import TransformersRun
        return TransformersRun(path, config)
    if path is None:
        return make_adapter(impl, config, weights)
    return load_adapter(impl, path, config)  # config = the file's, or the given one for a file without


def _bound(dtype: str, a: str, b: str):
    from shared.tolerances import Bound, bound_for
    if a == b:
        return Bound(rtol=0.0, reason="one implementation, the same weights: identical logits")
    try:
        return bound_for(dtype, f"{a}:{b}")
    except KeyError:
        return bound_for(dtype, f"{b}:{a}")


def _identical(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def logits_parity(src_fmt: Format, src: str, dst_fmt: Format, dst: str, config: TransformerConfig,
                  weights: dict, seed: int = 0) -> bool:
    """Print the logits parity table of source and result; True when every row passes."""
    from shared.batches import src_tgt
    from shared.conditioning import forward_conditioning
    from shared.tolerances import max_abs_diff, max_rel_diff

    tgt_len = min(7, config.max_len)
    # fsmt numbers positions skipping padding: padded target positions differ by design, so its
    # target rows are full (the source keeps its padding, which both mask)
    full = [tgt_len] * 2 if src_fmt.verify_full_rows or dst_fmt.verify_full_rows else None
    batch = src_tgt(config, batch=2, src_len=min(9, config.max_len), tgt_len=tgt_len, seed=seed,
                    tgt_lengths=full)
    runs = {}  # label -> adapter (twins.backends, or transformers_run)
    if src_fmt.runs_in is None:
        print(f"verify: the {src_fmt.name} source cannot be rebuilt into its source model here "
              f"({src_fmt.describe}); comparing the imported weights in the reference and in both "
              f"backends instead, the {dst_fmt.runs_in} one loaded from DST = {dst}")
        impls = ("reference", "torch", "tf")
        for impl in impls + ((dst_fmt.runs_in,) if dst_fmt.runs_in not in impls else ()):
            path = dst if impl == dst_fmt.runs_in else None
            label = f"{impl}:{'DST' if path else 'imported'}"
            try:
                runs[label] = _load(impl, path, config, weights)
            except ImportError as err:
                if path is not None:
                    raise
                print(f"verify: skipped {impl}: {err}")
            if path is not None:
                result = label
        labels = list(runs)
        pairs = [(a, b) for i, a in enumerate(labels) for b in labels[i + 1:]]
    else:
        print(f"verify: SRC = {src} in {src_fmt.runs_in}, DST = {dst} in {dst_fmt.runs_in}")
        a, b = f"{src_fmt.runs_in}:SRC", f"{dst_fmt.runs_in}:DST"
        runs[a] = _load(src_fmt.runs_in, src, config, None)
        runs[b] = _load(dst_fmt.runs_in, dst, config, None)
        pairs, result = [(a, b)], b

    ok = True
    result_weights = dict(runs[result].export_weights())
    # a shared table the target keeps as two equal ones (Marian without tied output: its exporter's
    # documented round trip) is the same weights, if the second is the first bit for bit
    untied = ("tgt_embed.embeddings" in result_weights and "tgt_embed.embeddings" not in weights
              and "src_embed.embeddings" in weights
              and _identical(result_weights["tgt_embed.embeddings"], weights["src_embed.embeddings"]))
    if untied:
        del result_weights["tgt_embed.embeddings"]
    same = sorted(result_weights) == sorted(weights) and all(
        _identical(result_weights[k], weights[k]) for k in weights)
    ok &= same
    print(f"weights: {len(weights)} tensors in DST "
          f"{'bit-identical to the source' if same else 'DIFFER from the source'}"
          + (" (the shared embedding table written twice, equal)" if untied and same else ""))

    logits = {label: adapter.logits(*batch) for label, adapter in runs.items()}
    # the bounds grow on a model that magnifies rounding more than the random weights they were
    # measured on (shared.conditioning), read from the oracle's pass of this batch
    growth = forward_conditioning(weights, config, *batch)
    width = max(len("compared"), *(len(f"{a} vs {b}") for a, b in pairs))
    print(f"one batch: {batch[0].shape[0]} x {batch[0].shape[1]} source and {batch[1].shape[0]} x "
          f"{batch[1].shape[1]} target tokens (seed {seed}), {config.dtype}")
    print(f"{'name':<8} {'compared':<{width}}  {'max abs':>9}  {'max rel':>9}  {'bound':>7}  result")
    for a, b in pairs:
        x, y = logits[a], logits[b]
        # the less precise side's bound: a float32 source (transformers loads Marian and FSMT in
        # float32) converted with --dtype float64 is held to float32's, not float64's
        dtype = "float32" if np.float32 in (np.asarray(x).dtype, np.asarray(y).dtype) else config.dtype
        bound = _bound(dtype, a.split(":")[0], b.split(":")[0]).conditioned(*growth)
        passed = bool(bound.allows(x, y)) and bool(np.isfinite(x).all() and np.isfinite(y).all())
        ok &= passed
        print(f"{'logits':<8} {a + ' vs ' + b:<{width}}  {max_abs_diff(x, y):>9.2e}  "
              f"{max_rel_diff(x, y):>9.2e}  {bound.rtol:>7.1e}  {'pass' if passed else 'FAIL'}")
        if bound.grown:
            print(f"  (bound {bound.grown})")
    print("(max rel: the difference relative to the logits' scale, which shared/tolerances.py "
          "bounds; an implementation against itself must match exactly)")
    print("PASS" if ok else "FAIL")
    return ok


def verify_ctranslate2(src_fmt: Format, src: str, dst_fmt: Format, dst: str, config: TransformerConfig,
                       weights: dict, seed: int = 0) -> bool:
    """CTranslate2's per-token log-probs (``score_batch``) of one batch against the source's, run
    in the source's implementation (the reference for an importer's state dict); True on pass."""
    import ctranslate2

    from shared.batches import src_tgt
    from shared.conditioning import forward_conditioning
    from shared.exporters import ctranslate2 as ct2
    from shared.tolerances import BOUNDS, bound_for, max_abs_diff, max_rel_diff

    # the source's own implementation where CTranslate2's distance from it is measured; else (no
    # source model here, or one in transformers) its imported weights, in the reference
    if src_fmt.runs_in is None or ("float32", f"ctranslate2:{src_fmt.runs_in}") not in BOUNDS:
        impl, source = "reference", _load("reference", None, config, weights)
    else:
        impl = src_fmt.runs_in
        source = _load(impl, src, config, None)
    # max_len=1 feeds the start token alone: the log-prob of EOS after it is the whole score. A
    # batch CTranslate2 would not run a row of (a tiny vocabulary's [BOS, EOS]) is drawn again.
    for seed in range(seed, seed + 1000):
        src_ids, tgt_in = src_tgt(config, batch=2, src_len=min(9, config.max_len),
                                  tgt_len=max(1, min(7, config.max_len - 1)), seed=seed)
        if not ct2.skipped_rows(config, src_ids):
            break
    tgt = tgt_in[:, 1:]  # score_batch prepends the start token itself
    translator = ctranslate2.Translator(str(dst), device="cpu", compute_type="float32")
    got = ct2.score(translator, config, src_ids, tgt)
    want = ct2.project_scores(source.logits, config, src_ids, tgt)
    # grown on a model that magnifies rounding more than the random weights it was measured on
    bound = bound_for("float32", f"ctranslate2:{impl}").conditioned(
        *forward_conditioning(weights, config, src_ids, tgt_in))
    ok = bool(bound.allows(got, want)) and bool(np.isfinite(got).all())
    label = f"ctranslate2:DST vs {impl}:SRC"
    print(f"verify: DST = {dst} in CTranslate2 {ctranslate2.__version__} (float32), SRC = {src} in {impl}")
    print(f"one batch: 2 x {src_ids.shape[1]} source and 2 x {tgt.shape[1]} target tokens + EOS "
          f"(seed {seed}), per-token log-probs of score_batch")
    print(f"{'name':<9} {'compared':<{len(label)}}  {'max abs':>9}  {'max rel':>9}  {'bound':>7}  result")
    print(f"{'log-probs':<9} {label}  {max_abs_diff(got, want):>9.2e}  {max_rel_diff(got, want):>9.2e}  "
          f"{bound.rtol:>7.1e}  {'pass' if ok else 'FAIL'}")
    if bound.grown:
        print(f"  (bound {bound.grown})")
    print("PASS" if ok else "FAIL")
    return ok


def verify_saved_model(src_fmt: Format, src: str, dst_fmt: Format, dst: str, config: TransformerConfig,
                       weights: dict, seed: int = 0) -> bool:
    """The SavedModel's decoded tokens against tf_impl's on the source weights (`twins.saved_model`)."""
    from shared.formats.saved_model import exported_model
    from . import saved_model
    from .backends import make_adapter
    model = exported_model(dst) or make_adapter("tf", config, weights).model
    return saved_model.verify(model, dst, seed) == 0


def verify_onnx(src_fmt: Format, src: str, dst_fmt: Format, dst: str, config: TransformerConfig,
                weights: dict, seed: int = 0) -> bool:
    """The export in ONNX Runtime against the float64 oracle on the source weights: its logits
    (full and cached) and greedy tokens (`twins.onnx_runtime.verify`)."""
    from . import onnx_runtime
    return onnx_runtime.verify(config, weights, dst, seed) == 0


CHECKS = {"ctranslate2": verify_ctranslate2, "saved-model": verify_saved_model,
          "onnxruntime": verify_onnx}  # else logits_parity
