"""Random hostile input for both backends, checked against the project's rules: the same call in
torch_impl and tf_impl succeeds in both or raises the same type with the same message, which names
what it refuses first (``max_len: expected ...``); a refused scalar argument is a ``TypeError``
exactly when its type was wrong (`shared.checks.refusal`); a refused call changes nothing; a
damaged file given to ``twins`` ends in one line and exit status 2, never a traceback or an error
of an unexpected kind. Every finding is printed with what produced it.

    python -m parity_tests.fuzz [--surfaces decoders steps forward generator weights train loss files runs]
                                [--cases 200] [--seed 0]

Exit status 1 when anything was found. Surfaces:

* ``decoders``: `greedy_decode` / `beam_search` with sources, lengths, masks and settings that are
  wrong in every way (None, text, floats, lists ragged in their rows or below, a dict, ints past
  int64, bad shapes and ids, NaN, bools), and some that are right; the NumPy decoders of the same
  weights run beside them, the float64 reference and ONNX Runtime's (`twins.onnx_runtime`, where
  onnx and onnxruntime import), and must end as torch_impl's does;
* ``steps``: the cached step (`init_cache`, `decode_step`, `DecoderCache.reorder_beams`) with
  source masks, capacities, beam counts, token ids and beam rows wrong in length, rank, dtype or value, and some
  right (arrays as torch tensors for torch_impl, whose model calls take tensors only);
* ``forward``: the model's call, `encode` and `decode` with ids and masks wrong in shape, dtype or
  value, one or several at once, and some right (TensorFlow's message must hold torch's: Keras
  wraps an error raised in ``call``);
* ``generator``: ``model.generator(x)`` with hidden states wrong in width, rank or dtype, and some
  right of any rank: the same logits' shape or the same refusal;
* ``weights``: `import_weights` of the canonical weights with keys removed, added or renamed, values
  reshaped, recast, made non-finite, non-arrays or strided views;
* ``train``: `training.train_step` with batches so damaged;
* ``loss``: `training.label_smoothed_loss` of both backends, and the reference's beside them, with
  logits, targets, ``pad_id`` and smoothing wrong in shape, dtype (durations and dates too), kind
  or value, and some right;
* ``files``: ``twins convert`` / ``twins decode --src`` (torch, tf, onnx) of a damaged file of
  every readable format (`KIND_OPTIONS`): the neutral directory and transformers' Marian and FSMT
  folders (a JSON file's value replaced or removed, at the top or nested; the safetensors header
  or bytes changed), a torch_impl ``.pt`` and the nn.Transformer and Annotated tutorials' state
  dicts (tensors removed, reshaped, recast, sparse, replaced by non-tensors), tf_impl's and the
  TensorFlow tutorial's ``.weights.h5`` (datasets removed, reshaped, recast, replaced by groups),
  a KerasHub ``.keras`` archive (a member damaged so, removed or joined by a stray one), and an
  ONNX export directory (its JSON or graphs damaged so; decoded by ONNX Runtime, as no format
  reads it);
* ``runs``: a `twins train` run directory with one file damaged as above (or removed), given to
  ``twins train`` to resume it in either backend, to ``twins decode``, ``twins convert`` and
  ``twins figures``; a resume must refuse a run whose model or step changed (the files hold each
  twice), and a refused one must leave every file of the run as it was.

`parity_tests/test_fuzz.py` runs a fixed slice of each in the suite, and checks that the slice
still finds defects it found before, put back (`first_finding`). Defects this found are tests
now: a sparse tensor in a foreign state dict, and h5py's RuntimeError on a Keras file damaged inside
(test_hostile_porting.py); tf_impl naming non-tensor ids in TensorFlow's words
(test_hostile_inputs.py); torch's warnings printed above the refusal of a damaged ``.pt``
(test_torch_weights.py); a resumed run whose config.json or log step had changed, trained as it
stood (test_train_hostile.py: found by reading the resumes that succeeded; the `runs` surface
judges them since); a NumPy ``timedelta64`` taken for an int, refused alike in ``int()``'s words
(test_shared_hostile.py, test_hostile_inputs.py: found once refusals had to name their argument);
ONNX Runtime's source check, its own, naming text ``<U1``, None "rank 0" and ragged rows in
NumPy's words, and the reference's naming lists ragged below the rows in NumPy's words
(test_hostile_inputs.py, test_onnx.py: found once the NumPy decoders ran beside the backends');
a ``src_mask`` that is a list, a NumPy bool or a duration array, named three ways or in torch's
words by the four decoders (test_hostile_inputs.py: a probe first, then 5 findings in 1,500
``decoders`` cases of seed 2 once the masks drawn included them); tf_impl's loss naming a
duration in TensorFlow's words (test_training.py: a probe, then the ``loss`` surface).
"""
from __future__ import annotations

import argparse
import atexit
import contextlib
import dataclasses
import functools
import io
import json
import os
import random
import re
import shutil
import sys
import tempfile
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np

from shared.checks import is_int, is_real
from shared.config import TransformerConfig
from shared.weights import random_weights, save_checkpoint

CONFIG = TransformerConfig.preset("tiny", n_encoder_layers=1, n_decoder_layers=1, src_vocab=20,
                                  tgt_vocab=20, max_len=16, dropout=0.0)
# np.timedelta64: NumPy counts a duration an integer (numbers.Integral); it passed as a size and
# then failed in int()'s words, naming nothing.
# NumPy ints of other widths: an int8 17 as beam_size wrapped torch_impl's candidates (17 * 20)
HOSTILE_SCALARS = [0, 1, 3, 16, 17, -1, 2**40, 1.5, 2.0, float("nan"), float("inf"), None, "3", True,
                   np.int64(3), np.int8(17), np.uint64(2), np.float32(2), np.timedelta64(3, "s"), [3]]


@functools.lru_cache(maxsize=None)
def _backends():
    """``{"torch": (package, model, training, optimizer), "tf": ...}``: the tiny model in both, the
    same weights."""
    import tf_impl
    import torch_impl
    from tf_impl import training as tf_training
    from torch_impl import training as torch_training
    weights = random_weights(CONFIG, 0)
    out = {}
    for name, package, training in (("torch", torch_impl, torch_training), ("tf", tf_impl, tf_training)):
        model = package.Transformer(CONFIG)
        model.import_weights(weights)
        if name == "torch":
            model.eval()
        out[name] = (package, model, training, training.make_optimizer(model, warmup=10))
    return out


def numpy_decoders(config: TransformerConfig, weights) -> dict:
    """``{"reference": (module, model), "onnx_runtime": ...}``: the NumPy decoders of ``weights``,
    each as ``(namespace with greedy_decode and beam_search, model)``, called as the backends'
    (``package.greedy_decode(model, src, max_len, ...)``): the float64 reference, and ONNX
    Runtime's (`twins.onnx_runtime`, its methods) where ``onnx`` and ``onnxruntime`` import."""
    from shared import reference
    decoders = {"reference": (reference, reference.Model(weights, config))}
    try:
        from twins.onnx_runtime import OnnxRuntimeModel
        runtime = OnnxRuntimeModel.from_weights(config, weights)
    except ImportError:
        return decoders
    methods = SimpleNamespace(greedy_decode=lambda model, src, max_len, **kw: model.greedy(src, max_len, **kw),
                              beam_search=lambda model, src, max_len, **kw: model.beam(src, max_len, **kw))
    decoders["onnx_runtime"] = (methods, runtime)
    return decoders


@functools.lru_cache(maxsize=None)
def _peers() -> dict:
    """`numpy_decoders` of the backends' weights. They hold no state a call could change, so only
    their outcomes are compared (with torch_impl's)."""
    return numpy_decoders(CONFIG, random_weights(CONFIG, 0))


def _outcome(call) -> str:
    try:
        call()
        return "ok"
    except Exception as err:  # noqa: BLE001  (what was raised is the finding)
        return f"{type(err).__name__}: {err}"


# A refusal's message starts with what it refuses: "src: ...", "TransformerConfig.d_model: ...",
# "noam_lr: step ...". Both backends failing alike in NumPy's or Python's words ("int() argument
# must be ...", for a np.timedelta64 taken for an int) named nothing and was no difference.
_NAMED = re.compile(r"^\w+: [^\s:]+: ")


def _unnamed(name: str, outcome: str) -> list[str]:
    """A finding where ``name``'s refusal does not start with what it refuses."""
    if outcome == "ok" or _NAMED.match(outcome):
        return []
    return [f"{name}: a refusal that names no argument: {outcome[:400]}"]


def _optimizer_steps(name: str) -> float:
    """The steps the backend's optimizer has counted (torch: its parameters' ``step``; Keras:
    ``iterations``)."""
    optimizer = _backends()[name][3]
    if name == "torch":
        return max((float(state["step"]) for state in optimizer.state.values()), default=0.0)
    return float(optimizer.iterations.numpy())


def _misclassed(outcome: str, scalars: dict) -> list[str]:
    """A finding where a refusal naming one of ``scalars`` (argument -> (value, its type's test))
    is not `shared.checks.refusal`'s class: ``TypeError`` where the value had the wrong type,
    ``ValueError`` where it had the right one."""
    kind, _, message = outcome.partition(": ")
    name = message.partition(":")[0]
    if outcome == "ok" or name not in scalars:
        return []
    value, right_type = scalars[name]
    expected = "ValueError" if right_type(value) else "TypeError"
    return [] if kind == expected else [f"{name}={value!r} refused as {kind}, expected {expected}"]


def _differential(what: str, calls: dict, peers: dict | None = None, scalars: dict | None = None) -> str | None:
    """Run the same call in both backends (and in ``peers``, stateless implementations: name ->
    call); a finding where the outcomes differ, where a refusal names no argument, where a refusal
    of a scalar argument (``scalars``, `_misclassed`) is not of its class, or where a refused call
    changed a backend model's weights or its optimizer's step count."""
    results, changed = {}, []
    for name, call in (peers or {}).items():
        results[name] = _outcome(call)
    for name, call in calls.items():
        model = _backends()[name][1]
        before, steps = model.export_weights(), _optimizer_steps(name)
        results[name] = _outcome(call)
        if results[name] != "ok":
            after = model.export_weights()
            if (any(not np.array_equal(before[k], after[k], equal_nan=True) for k in before)
                    or _optimizer_steps(name) != steps):
                changed.append(name)
    problems = []
    for name in [name for name in results if name != "torch"]:
        if results[name] != results["torch"]:
            problems.append(f"torch: {results['torch'][:400]}\n    {name}: {results[name][:400]}")
    problems += [f"{name}: refused, but its weights or its optimizer's step count changed" for name in changed]
    problems += [problem for name, outcome in results.items() for problem in _unnamed(name, outcome)]
    problems += _misclassed(results["torch"], scalars or {})  # the others' equal torch's, or differ above
    return f"{what}\n    " + "\n    ".join(problems) if problems else None


# -- decoders ---------------------------------------------------------------------------------------
def _ids(rng: random.Random):
    shape = rng.choice([(2, 4), (1, 1), (0, 3), (2, 0), (4,), (), (1, 2, 3), (1, 17), (1, 16)])
    return rng.choice([
        lambda: None, lambda: [[1, 2], [3]], lambda: "1 2 3", lambda: 3.5, lambda: [[1, "a"]],
        lambda: [[1.5, 2.0]], lambda: [[True, False]], lambda: [[3, 4, 5]], lambda: np.array([["a", "b"]]),
        lambda: np.array([[1, None]], dtype=object),
        lambda: np.full(shape, rng.choice([-1, 20, 2**40, 0, 1]), np.int64),
        lambda: np.ones(shape, rng.choice([np.float32, np.bool_, np.uint8, np.int16, np.uint64, "m8[s]",
                                           np.ulonglong, ">i8"])),
        lambda: np.ones(shape, np.int32) * 5, lambda: np.ones((2, 4), np.int64) * 7,
        lambda: [[1, [2, 3]]], lambda: [[1, 2], 3], lambda: [[2**70, 3]], lambda: {"src": [[1, 2]]},
        lambda: np.arange(2, 10).reshape(2, 4)[:, ::-1],  # a view torch holds no tensor of
    ])()


def _mask(rng: random.Random, src):
    shape = np.shape(src) if isinstance(src, np.ndarray) else (1, 1)
    return rng.choice([None, np.ones(shape, np.bool_), np.ones(shape, np.int64),
                       np.ones((1, *shape), np.bool_), np.zeros(shape, np.float32), np.ones(shape, "m8[s]"),
                       np.ones(shape, np.bool_).tolist(), np.True_])


def decoders(rng: random.Random) -> str | None:
    name = rng.choice(["greedy_decode", "beam_search"])
    src, max_len, kwargs = _ids(rng), rng.choice(HOSTILE_SCALARS), {}
    if rng.random() < 0.4:
        kwargs["src_mask"] = _mask(rng, src)
    if name == "beam_search":
        if rng.random() < 0.6:
            kwargs["beam_size"] = rng.choice(HOSTILE_SCALARS)
        if rng.random() < 0.4:
            kwargs["length_penalty"] = rng.choice(HOSTILE_SCALARS)
    if rng.random() < 0.2:
        kwargs["use_cache"] = rng.choice([False, 0, "yes", None])
    calls = {b: functools.partial(getattr(pkg, name), model, src, max_len, **kwargs)
             for b, (pkg, model, _, _) in _backends().items()}
    peers = {} if "use_cache" in kwargs else {  # NumPy's decoders take no use_cache: they always cache
        p: functools.partial(getattr(module, name), model, src, max_len, **kwargs)
        for p, (module, model) in _peers().items()}
    scalars = {"max_len": (max_len, is_int), "beam_size": (kwargs.get("beam_size", 1), is_int),
               "length_penalty": (kwargs.get("length_penalty", 0.0), is_real)}
    return _differential(f"{name}(src={_shown(src)}, {max_len!r}, {_shown(kwargs)})", calls, peers, scalars)


# -- the cached step ----------------------------------------------------------------------------------
def _as_backend(name: str, value):
    """A NumPy array as ``name``'s tensor: torch's model calls take torch tensors only, tf_impl's
    arrays too (the same values either way; a non-tensor is refused in each framework's words,
    test_decoding.py checks those). Anything else as it is. An array torch cannot take as it is
    (big-endian, ``np.ulonglong``) is made native first, as its user would have to."""
    if name == "torch" and isinstance(value, np.ndarray):
        import torch
        native = np.dtype(value.dtype.str).newbyteorder("=")  # also NumPy's own name for the type
        return torch.from_numpy(np.array(value, dtype=native).view(native))  # a copy: contiguous, writable, 0-d kept
    return value


def _step_ids(rng: random.Random, rows: int) -> np.ndarray:
    """Ids or beam rows for a cache of ``rows`` rows: right, or wrong in length, rank, dtype or
    value."""
    length = rng.choice([rows, rows, rows - 1, rows + 1, 0, 1])
    return rng.choice([
        lambda: np.full(length, rng.choice([0, 1, 2, 3, 19, 20, -1, 2**40]), np.int64),
        lambda: np.arange(length, dtype=rng.choice([np.int32, np.int64, np.uint8, np.int16])),
        lambda: np.ones(length, rng.choice([np.float32, np.float64, np.bool_])),
        lambda: np.full(length, 2**63 + 5, np.uint64), lambda: np.ones((rows, 1), np.int64),
        lambda: np.ones((), np.int64), lambda: np.arange(rows, dtype=np.int64)[::-1].copy(),
    ])()


def steps(rng: random.Random) -> str | None:
    """`init_cache` with hostile ``src_mask``, ``max_len`` and ``beams``, then `decode_step` with
    hostile tokens, or `DecoderCache.reorder_beams` with hostile rows and a step after it."""
    src = np.random.default_rng(rng.randrange(2**32)).integers(3, CONFIG.src_vocab, (2, 5))
    max_len = rng.choice(HOSTILE_SCALARS) if rng.random() < 0.3 else rng.choice([1, 2, 4])
    beams = rng.choice(HOSTILE_SCALARS) if rng.random() < 0.3 else rng.choice([1, 2, 3])
    rows = 2 * beams if isinstance(beams, int) and 0 < beams < 20 else 2
    reorder = _step_ids(rng, rows) if rng.random() < 0.4 else None
    tokens = _step_ids(rng, rows)
    mask = None if rng.random() < 0.7 else rng.choice([  # None: the backend's own make_src_mask
        np.ones((1, 1, 1, 5), np.bool_), np.zeros((2, 1, 1, 5), np.bool_), np.ones((2, 5), np.bool_),
        np.ones((2, 1, 1, 5), np.int64), np.ones((2, 1, 2, 5), np.bool_), np.ones((2, 1, 1, 4), np.bool_),
        np.ones((3, 1, 1, 5), np.bool_), np.ones((2, 1, 1, 5), np.float32)])

    def call(name: str):
        package, model = _backends()[name][:2]
        ids = _as_backend(name, src)
        given = package.inputs.make_src_mask(ids, CONFIG.pad_id) if mask is None else _as_backend(name, mask)
        cache = model.init_cache(model.encode(ids), given, max_len, beams)
        if reorder is not None:
            cache = cache.reorder_beams(_as_backend(name, reorder))
        model.decode_step(_as_backend(name, tokens), cache)

    shown = (f"src_mask={_shown(mask)}, max_len={max_len!r}, beams={beams!r}, reorder={_shown(reorder)}, "
             f"tokens={_shown(tokens)}")
    return _differential(f"init_cache / reorder_beams / decode_step({shown})",
                         {name: functools.partial(call, name) for name in _backends()},
                         scalars={"max_len": (max_len, is_int), "beams": (beams, is_int)})


# -- the forward pass -------------------------------------------------------------------------------
def _numeric(rng: random.Random, make) -> np.ndarray:
    """``make()`` where it gives a NumPy array of numbers or bools (what both frameworks take as
    a tensor), else right ids: non-arrays are refused in each framework's words (test_inputs.py)."""
    value = make()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value
    return np.random.default_rng(rng.randrange(2**32)).integers(3, CONFIG.src_vocab, (2, 4))


def forward(rng: random.Random) -> str | None:
    """``model(src, tgt, src_mask, tgt_mask)``, `encode` and `decode` with ids and masks wrong in
    shape, dtype or value, one or several at once (which is named first is part of the
    contract), and some right."""
    src = _numeric(rng, lambda: _ids(rng))
    tgt = _numeric(rng, lambda: _ids(rng)) if rng.random() < 0.5 else np.full((2, 3), 1, np.int64)
    masks = {}  # bool = may attend; wrong in dtype, rank, batch, key length, or all False
    if rng.random() < 0.4:
        s = np.shape(src)[-1] if np.ndim(src) else 1
        masks["src_mask"] = rng.choice([
            np.ones((2, 1, 1, s), np.bool_), np.ones((1, 1, 1, s), np.bool_), np.zeros((2, 1, 1, s), np.bool_),
            np.ones((2, s), np.bool_), np.ones((2, 1, 1, s), np.int64), np.ones((2, 1, 1, s), np.float32),
            np.ones((3, 1, 1, s), np.bool_), np.ones((2, 1, 1, s + 1), np.bool_)])
    if rng.random() < 0.3:
        t = np.shape(tgt)[-1] if np.ndim(tgt) else 1
        masks["tgt_mask"] = rng.choice([
            np.ones((2, 1, t, t), np.bool_), np.tril(np.ones((t, t), np.bool_))[None, None],
            np.ones((2, 1, 1, t), np.bool_), np.ones((2, t, t), np.bool_), np.ones((2, 1, t, t), np.int64),
            np.ones((2, 1, t, t + 1), np.bool_)])
    what = rng.choice(["call", "encode", "decode"])
    outcomes = {}
    for name, (_, model, _, _) in _backends().items():
        args = {k: _as_backend(name, v) for k, v in masks.items()}
        s, t = _as_backend(name, src), _as_backend(name, tgt)

        def call(model=model, s=s, t=t, args=args, name=name):
            if what == "call":
                return model(s, t, **args)
            if what == "encode":
                return model.encode(s, args.get("src_mask"))
            source = _as_backend(name, np.ones((2, 5), np.int64) * 3)
            given = args.get("src_mask")  # decode requires one (its refusal names each package)
            given = _backends()[name][0].inputs.make_src_mask(source, CONFIG.pad_id) if given is None else given
            return model.decode(t, model.encode(source), given, args.get("tgt_mask"))
        outcomes[name] = _outcome(call)
    problems = _unnamed("torch", outcomes["torch"])
    if outcomes["torch"] != outcomes["tf"]:  # word for word: Keras' wrapping of call's is undone
        problems.append(f"torch: {outcomes['torch'][:400]}\n    tf:    {outcomes['tf'][:400]}")
    return (f"{what}(src={_shown(src)}, tgt={_shown(tgt)}, {_shown(masks)})\n    " + "\n    ".join(problems)
            if problems else None)


def generator(rng: random.Random) -> str | None:
    """``model.generator(x)`` with hidden states wrong in width, rank or dtype (float64 into a
    float32 model, ints, bools, halves), and some right, of any rank ``(..., d_model)``: both
    backends succeed with logits of the same shape ``(..., tgt_vocab)`` or refuse alike, word for
    word (`shared.checks.check_hidden`)."""
    d = CONFIG.d_model
    shape = rng.choice([(2, 3, d), (2, 3, d), (6, d), (1, d), (d,), (2, 1, 3, d), (2, 0, d), (0, d), (),
                        (2, 3, d + 1), (2, 3, d - 1), (2, 3, 1), (d, 2), (2, 3, 0)])
    dtype = rng.choice([np.float32, np.float32, np.float32, np.float64, np.float16, np.int64, np.int32,
                        np.bool_])
    x = np.random.default_rng(rng.randrange(2**32)).standard_normal(shape).astype(dtype)
    if rng.random() < 0.1 and x.size and x.dtype.kind == "f":
        x.flat[0] = np.nan  # a value, not a refusal: NaN logits in both
    outcomes, shapes = {}, {}
    for name, (_, model, _, _) in _backends().items():
        def call(model=model, value=_as_backend(name, x), name=name):
            shapes[name] = tuple(model.generator(value).shape)
        outcomes[name] = _outcome(call)
    problems = _unnamed("torch", outcomes["torch"])
    if (outcomes["torch"], shapes.get("torch")) != (outcomes["tf"], shapes.get("tf")):
        problems.append(f"torch: {outcomes['torch'][:400]} {shapes.get('torch', '')}\n"
                        f"    tf:    {outcomes['tf'][:400]} {shapes.get('tf', '')}")
    elif outcomes["torch"] == "ok" and shapes["torch"] != shape[:-1] + (CONFIG.tgt_vocab,):
        problems.append(f"logits of shape {shapes['torch']} for hidden states {shape}")
    return f"generator(x={_shown(x)})\n    " + "\n    ".join(problems) if problems else None


# -- weights and training ---------------------------------------------------------------------------
def _damaged_weights(rng: random.Random) -> tuple[dict, str]:
    weights = dict(random_weights(CONFIG, 1))
    key = rng.choice(sorted(weights))
    value = weights[key]
    damage = {
        "removed": lambda: weights.pop(key),
        "extra key": lambda: weights.__setitem__(key + ".x", value),
        "key not a str": lambda: weights.__setitem__(rng.choice([1, None, ("a",), b"k"]), value),
        "flattened": lambda: weights.__setitem__(key, value.ravel()),
        "transposed": lambda: weights.__setitem__(key, value.T if value.ndim == 2 else value[None]),
        "recast": lambda: weights.__setitem__(key, value.astype(rng.choice(
            [np.int64, np.bool_, np.complex64, np.float16, np.uint8, np.float64, object]))),
        "non-finite or past float32": lambda: weights.__setitem__(key, np.full(value.shape, rng.choice(
            [np.nan, np.inf, 1e39]))),
        "not an array": lambda: weights.__setitem__(key, rng.choice([None, 3, "x", [1.0, 2.0], value.tolist()])),
        "empty": lambda: weights.__setitem__(key, np.zeros((0, *value.shape), value.dtype)),
        "strided view": lambda: weights.__setitem__(key, np.broadcast_to(value, (2, *value.shape))[0]),
        "reversed": lambda: weights.__setitem__(key, value[::-1].copy()),
    }
    what = rng.choice(sorted(damage))
    damage[what]()
    return weights, f"{key}: {what}"


def weights(rng: random.Random) -> str | None:
    damaged, what = _damaged_weights(rng)
    calls = {b: functools.partial(model.import_weights, damaged) for b, (_, model, _, _) in _backends().items()}
    finding = _differential(f"import_weights({what})", calls)
    for _, model, _, _ in _backends().values():  # the next case starts from the same weights
        model.import_weights(random_weights(CONFIG, 0))
    return finding


def _damaged_ids(rng: random.Random, v: np.ndarray):
    return rng.choice([
        lambda: None, lambda: v.tolist(), lambda: v[:1], lambda: v[:, :0], lambda: v[..., None],
        lambda: v.ravel(), lambda: np.zeros_like(v), lambda: np.concatenate([v, v], 1),
        lambda: v.tolist()[:1] + [v.tolist()[1][:-1]], lambda: v,
        lambda: v.astype(rng.choice([np.float32, np.bool_, np.uint8, np.int32, "U3", object])),
        lambda: np.full_like(v, rng.choice([-1, 20, 2**40])),
    ])()


def train(rng: random.Random) -> str | None:
    ids = np.random.default_rng(rng.randrange(2**32))
    batch = [ids.integers(3, 20, (2, 5)), ids.integers(3, 20, (2, 4)), ids.integers(3, 20, (2, 4))]
    for i in rng.sample(range(3), rng.choice([1, 1, 2])):
        batch[i] = _damaged_ids(rng, batch[i])
    batch = tuple(batch[:2]) if rng.random() < 0.05 else tuple(batch)
    calls = {b: functools.partial(training.train_step, model, optimizer, batch)
             for b, (_, model, training, optimizer) in _backends().items()}
    finding = _differential(f"train_step({_shown(batch)})", calls)
    for _, model, _, _ in _backends().values():
        model.import_weights(random_weights(CONFIG, 0))
    return finding


def _reference_loss(logits, targets, pad_id, smoothing):
    """The reference's loss, its refusals under the backends' function name (its own is
    ``label_smoothed_cross_entropy``)."""
    from shared.loss import label_smoothed_cross_entropy
    try:
        return label_smoothed_cross_entropy(logits, targets, pad_id, smoothing)
    except (TypeError, ValueError) as err:
        raise type(err)(str(err).replace("label_smoothed_cross_entropy:", "label_smoothed_loss:")) from None


def loss(rng: random.Random) -> str | None:
    """`training.label_smoothed_loss` of both backends and the reference's with logits, targets,
    ``pad_id`` and smoothing wrong in every way (shapes, dtypes no framework holds, None, lists
    ragged or of objects, ids out of range, NaN), and some right; numeric arrays go to torch_impl
    as tensors half the time."""
    b, t, v = rng.choice([(2, 3, 5), (1, 1, 5), (0, 3, 5), (2, 0, 5), (2, 3, 1)])
    numbers = np.random.default_rng(rng.randrange(2**32))
    logits = rng.choice([
        lambda: numbers.normal(size=(b, t, v)).astype(rng.choice([np.float32, np.float64, np.float16, ">f8",
                                                                   np.longdouble])),
        lambda: np.zeros((b, t)), lambda: np.zeros((b, t, v), np.int64), lambda: None,
        lambda: np.zeros((b, t, v)).tolist(), lambda: np.full((b, t, v), rng.choice([np.nan, np.inf])),
        lambda: "x", lambda: np.zeros((b, t, v), rng.choice([np.bool_, "M8[s]", object]))])()
    targets = rng.choice([
        lambda: numbers.integers(0, v, (b, t)).astype(rng.choice([np.int64, np.ulonglong, ">i4"])),
        lambda: np.full((b, t), rng.choice([-1, v, 2**40, 0])),
        lambda: np.zeros((b, t), rng.choice([np.float32, "m8[s]", "U1"])), lambda: None, lambda: [[1, 2], [3]],
        lambda: np.zeros((b, t + 1), np.int64), lambda: np.zeros((b,), np.int64), lambda: [[]],
        lambda: np.zeros((b, t), np.uint64) + 2**63, lambda: [[1, [2]]],
        lambda: numbers.integers(0, v, (b, t)).tolist()])()
    pad_id = rng.choice([0, 0, 0, None, -1, 1.5, "0", True, np.int64(1), 2**70, np.timedelta64(1, "s")])
    smoothing = rng.choice([0.0, 0.0, 0.1, 1.0, -0.1, float("nan"), None, "0.1", True, np.float32(0.1)])
    tensors = rng.random() < 0.5

    def given(name: str, value):  # as a tensor where torch holds the array's numbers (not a longdouble)
        held = isinstance(value, np.ndarray) and value.dtype.kind in "biuf" and value.dtype.itemsize <= 8
        return _as_backend(name, value) if tensors and held else value

    calls = {b: functools.partial(lambda b, training: training.label_smoothed_loss(
        given(b, logits), given(b, targets), pad_id, smoothing), b, training)
        for b, (_, _, training, _) in _backends().items()}
    peers = {"reference": functools.partial(_reference_loss, logits, targets, pad_id, smoothing)}
    return _differential(f"label_smoothed_loss({_shown(logits)}, {_shown(targets)}, pad_id={pad_id!r}, "
                         f"smoothing={smoothing!r})", calls, peers)


# -- files ------------------------------------------------------------------------------------------
# Every readable format, one valid file each, and the ``twins`` options that read it (its ids,
# heads, flags: what the format does not store). The folders (neutral, Marian, FSMT) are found by
# their files, so a damaged one also tests recognition.
KIND_OPTIONS = {
    "neutral": [], "torch": [], "tf": [], "marian": [], "fsmt": [],
    "annotated": ["--from", "annotated", "--n-heads", "4", "--pad-id", "0", "--bos-id", "1", "--eos-id", "2"],
    "nn-transformer": ["--from", "nn-transformer", "--n-heads", "4", "--norm-first", "false", "--pad-id", "1",
                       "--bos-id", "2", "--eos-id", "3"],
    "tf-tutorial": ["--from", "tf-tutorial", "--bos-id", "2", "--eos-id", "3"],
    "keras-hub": ["--from", "keras-hub", "--bos-id", "2", "--eos-id", "3", "--mask-zero", "false"],
    "onnx": [],  # an ONNX export directory: ONNX Runtime decodes it as it is (`twins decode --backend onnx`)
}
# Small source models, vocabularies of 11 and 13 (the ids of `files`' --src among them).
_SMALL = dict(src_vocab=11, tgt_vocab=13, d=16, heads=4, ff=24)


@functools.lru_cache(maxsize=None)
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="twins-fuzz-"))
    atexit.register(shutil.rmtree, root, True)  # pytest's workers run exit handlers too (conftest.py)
    return root


@functools.lru_cache(maxsize=None)
def _source(kind: str) -> Path:
    """A valid file of ``kind`` (a key of `KIND_OPTIONS`), written the first time it is asked for
    (a kind's framework or library is imported only when one of its cases comes up), and checked
    to convert with `KIND_OPTIONS`: a case of the kind is then refused for its damage alone."""
    from twins.cli import main
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")  # Keras on the tutorial's masks; transformers' progress bar
        path = _write_source(kind)
    code, err = _twins(main, _command(kind, path, "torch", _root() / f"{kind}-checked", "neutral"))
    assert code == 0, f"the fuzzer's {kind} source is not read: {err}"
    return path


def _command(kind: str, path: Path, backend: str | None, out: Path, to: str) -> list:
    """``twins decode`` of ``path`` (a file of ``kind``) in ``backend``, or, ``backend`` None,
    ``twins convert`` of it to ``out`` in format ``to``. An ONNX export is only decoded, by ONNX
    Runtime: no format reads it."""
    if kind == "onnx" or backend is not None:  # ids within every kind's vocabularies
        return ["decode", "--checkpoint", path, "--backend", "onnx" if kind == "onnx" else backend,
                "--src", "4 5 6", *KIND_OPTIONS[kind]]
    return ["convert", path, out, "--to", to, *KIND_OPTIONS[kind]]


def _write_source(kind: str) -> Path:
    """Write the valid file of ``kind`` under `_root`; its path."""
    from twins.cli import main
    root, s = _root(), _SMALL
    if kind == "neutral":
        save_checkpoint(root / "neutral", CONFIG, random_weights(CONFIG, 0))
    elif kind in ("torch", "tf"):
        path = root / {"torch": "m.pt", "tf": "m.weights.h5"}[kind]
        assert _twins(main, ["convert", _source("neutral"), path, "--to", kind])[0] == 0
        return path
    elif kind == "onnx":  # as `twins convert --to onnx` writes it: three graphs and their config
        assert _twins(main, ["convert", _source("neutral"), root / "onnx", "--to", "onnx"])[0] == 0
    elif kind == "marian":  # as `twins convert --to marian` writes it: the settings Marian computes
        marian = dataclasses.replace(CONFIG, norm_style="standard", norm_eps=1e-5, norm_first=False,
                                     final_norm=False, pe_layout="halves")
        save_checkpoint(root / "neutral-marian", marian, random_weights(marian, 0))
        assert _twins(main, ["convert", root / "neutral-marian", root / "marian", "--to", "marian"])[0] == 0
    elif kind == "fsmt":  # save_pretrained's folder: config.json, generation_config.json, safetensors
        from parity_tests import hf_models
        hf_models.make_fsmt(0, "float32", langs=("en", "de"), d_model=s["d"], encoder_layers=1,
                            decoder_layers=1, encoder_attention_heads=s["heads"],
                            decoder_attention_heads=s["heads"], encoder_ffn_dim=s["ff"],
                            decoder_ffn_dim=s["ff"], max_position_embeddings=32,
                            src_vocab_size=s["src_vocab"], tgt_vocab_size=s["tgt_vocab"]
                            ).save_pretrained(root / "fsmt")
    elif kind in ("annotated", "nn-transformer"):  # the two tutorials' state dicts, as torch.save wrote them
        import torch
        from parity_tests import source_models as S
        model = (S.make_annotated(src_vocab=s["src_vocab"], tgt_vocab=s["tgt_vocab"], n=1, d_model=s["d"],
                                  d_ff=s["ff"], h=s["heads"], max_len=32) if kind == "annotated" else
                 S.Seq2SeqTransformer(1, 1, s["d"], s["heads"], s["src_vocab"], s["tgt_vocab"], s["ff"],
                                      maxlen=32))
        torch.save(S.randomize_(model, seed=3).state_dict(), root / f"{kind}.pt")
        return root / f"{kind}.pt"
    elif kind == "tf-tutorial":  # save_weights of the TensorFlow tutorial's model
        from parity_tests import keras_source_models as K
        model = K.TutorialTransformer(num_layers=1, d_model=s["d"], num_heads=s["heads"], dff=s["ff"],
                                      input_vocab_size=s["src_vocab"], target_vocab_size=s["tgt_vocab"],
                                      dropout_rate=0.0)
        model((np.ones((1, 2), np.int32), np.ones((1, 2), np.int32)))  # builds every variable
        model.save_weights(root / "tutorial.weights.h5")
        return root / "tutorial.weights.h5"
    elif kind == "keras-hub":  # model.save of the keras.io example's model: a .keras archive
        from parity_tests import keras_source_models as K
        K.keras_hub_model(s["src_vocab"], s["tgt_vocab"], 12, s["d"], s["heads"], s["ff"], dropout=0.0
                          ).save(root / "hub.keras")
        return root / "hub.keras"
    else:
        raise KeyError(kind)
    return root / kind


def _twins(main, argv) -> tuple[object, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exit_:
            code = exit_.code
    return code, err.getvalue()


def _damage_json(rng: random.Random, path: Path) -> str:
    """One value of a JSON file replaced or removed: a top-level one, or (a nested config, as a
    ``.keras`` archive's) one further down."""
    data = json.loads(path.read_text())
    parent, where = data, []
    while True:
        keys = sorted(parent) if isinstance(parent, dict) else list(range(len(parent)))
        key = rng.choice(keys)
        where.append(str(key))
        if not isinstance(parent[key], (dict, list)) or not parent[key] or rng.random() < 0.4:
            break
        parent = parent[key]
    name = f"{path.name}: {'.'.join(where)}"
    if rng.random() < 0.15:
        del parent[key]
        what = f"{name} removed"
    else:
        parent[key] = rng.choice([*HOSTILE_SCALARS, "", {}, [], 10**30, "float16", -0.0])
        what = f"{name}={parent[key]!r}"
    path.write_text(json.dumps(data, default=str))
    return what


def _damage_bytes(rng: random.Random, path: Path) -> str:
    data = bytearray(path.read_bytes())
    if rng.random() < 0.3:
        n = rng.randrange(len(data))
        path.write_bytes(bytes(data[:n]))
        return f"{path.name}: truncated to {n} of {len(data)} bytes"
    if path.suffix == ".safetensors" and rng.random() < 0.5:
        size = int.from_bytes(data[:8], "little")
        header = json.loads(data[8:8 + size])
        key = rng.choice(sorted(k for k in header if k != "__metadata__"))
        field, value = rng.choice([("dtype", rng.choice(["F16", "BF16", "I64", "BOOL", "U8", "F64", "XX"])),
                                   ("shape", rng.choice([[], [0], [-1], [2**40, 2**40], [3, 3]])),
                                   ("data_offsets", rng.choice([[0, 0], [0, 2**62], [-1, 4], [5, 1]]))])
        header[key][field] = value
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        path.write_bytes(len(text).to_bytes(8, "little") + text + bytes(data[8 + size:]))
        return f"{path.name}: header {key}.{field}={value}"
    for _ in range(rng.randint(1, 8)):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return f"{path.name}: bytes changed"


def _damage_state_dict(rng: random.Random, path: Path) -> str:
    import torch
    obj = torch.load(path, weights_only=True)
    state = obj["state_dict"] if "state_dict" in obj else obj
    key = rng.choice(sorted(k for k, v in state.items() if isinstance(v, torch.Tensor)))
    v = state[key]
    damage = {
        "removed": lambda: state.pop(key), "extra key": lambda: state.__setitem__(key + "_x", v),
        "flattened": lambda: state.__setitem__(key, v.flatten()),
        "recast": lambda: state.__setitem__(key, v.to(rng.choice([torch.int64, torch.bool, torch.complex64,
                                                                   torch.float16, torch.uint8]))),
        "non-finite": lambda: state.__setitem__(key, torch.full_like(v, float("nan"))),
        "not a tensor": lambda: state.__setitem__(key, rng.choice([None, 3, "x", [1, 2], {"a": 1}])),
        "empty": lambda: state.__setitem__(key, torch.empty(0)),
        "sparse": lambda: state.__setitem__(key, v.to_sparse()),
        "scalar": lambda: state.__setitem__(key, torch.tensor(1.0)),
        "expanded": lambda: state.__setitem__(key, torch.zeros(1).expand(10**6)),
    }
    what = rng.choice(sorted(damage))
    damage[what]()
    torch.save(obj, path)
    return f"{path.name}: {key} {what}"


def _damage_h5(rng: random.Random, path: Path) -> str:
    import h5py
    with h5py.File(path, "r+") as f:
        names = []
        f.visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        name = rng.choice(sorted(names))
        value = f[name][()]
        del f[name]
        what = rng.choice(["removed", "recast", "flattened", "scalar", "huge", "non-finite", "group", "cut"])
        if what == "recast":
            f[name] = np.asarray(value).astype(rng.choice([np.int64, np.bool_, np.complex64, np.float16, "S3"]))
        elif what == "flattened":
            f[name] = np.asarray(value).ravel()
        elif what == "scalar":
            f[name] = np.float32(1.0)
        elif what == "huge":  # declared, never written: nothing allocated on disk
            f.create_dataset(name, shape=(2**20, 2**20), dtype="f4", chunks=(1, 16))
        elif what == "non-finite":
            f[name] = np.full(np.shape(value), np.nan, np.float32)
        elif what == "group":
            f.create_group(name)
        elif what == "cut":
            f[name] = np.asarray(value)[..., :-1] if np.ndim(value) else np.zeros(2, np.float32)
    return f"{path.name}: {name} {what}"


def _damage_archive(rng: random.Random, path: Path) -> str:
    """A ``.keras`` archive with one member damaged (its JSON as `_damage_json`, its weights as
    `_damage_h5`), removed, or joined by a stray one; or the archive's own bytes changed."""
    import zipfile
    if rng.random() < 0.25:
        return _damage_bytes(rng, path)
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    name = rng.choice(sorted(members))
    what = rng.choice(["damaged", "damaged", "damaged", "removed", "stray"])
    if what == "removed":
        del members[name]
        detail = f"{name} removed"
    elif what == "stray":
        stray = rng.choice(["../outside.json", "/absolute.h5", "config.json/", "model.weights.h5.bak"])
        members[stray] = members[name]
        detail = f"a copy of {name} as {stray!r}"
    else:
        with tempfile.TemporaryDirectory() as scratch:
            member = Path(scratch) / name
            member.write_bytes(members[name])
            detail = (_damage_json(rng, member) if name.endswith(".json") else
                      _damage_h5(rng, member) if rng.random() < 0.8 else _damage_bytes(rng, member))
            members[name] = member.read_bytes()
    with zipfile.ZipFile(path, "w") as archive:  # stored, as Keras writes it
        for member_name, data in members.items():
            archive.writestr(member_name, data)
    return f"{path.name}: {detail}"


def _damage(rng: random.Random, path: Path) -> str:
    """``path`` (a copy of a `_source`) damaged in one way its format allows; what was done."""
    if path.is_dir():  # neutral, marian, fsmt, onnx: one of its JSON files, its safetensors or graphs
        target = rng.choice(sorted(path.iterdir()))
        return _damage_json(rng, target) if target.suffix == ".json" else _damage_bytes(rng, target)
    if path.suffix == ".pt":
        return _damage_state_dict(rng, path) if rng.random() < 0.8 else _damage_bytes(rng, path)
    if path.suffix == ".keras":
        return _damage_archive(rng, path)
    return _damage_h5(rng, path) if rng.random() < 0.8 else _damage_bytes(rng, path)


def files(rng: random.Random) -> str | None:
    from twins.cli import main
    kind = rng.choice(sorted(KIND_OPTIONS))
    source = _source(kind)
    work = Path(tempfile.mkdtemp(prefix="twins-fuzz-case-"))
    try:
        copy = work / source.name
        (shutil.copytree if source.is_dir() else shutil.copy)(source, copy)
        what = _damage(rng, copy)
        backend = rng.choice(["torch", "tf", "torch", "tf", "onnx"]) if rng.random() < 0.3 else None
        to = rng.choice(["neutral", "torch", "tf", "neutral", "torch", "tf", "marian"])
        argv = _command(kind, copy, backend, work / {"torch": "out.pt", "tf": "out.weights.h5"}.get(to, "out"), to)
        code, err = _twins(main, argv)
        lines = err.strip().splitlines()
        if code not in (0, 2) or "--verbose shows the traceback" in err or (code == 2 and len(lines) != 1):
            return f"twins {argv[0]} of {kind} ({what}): exit {code}\n    {err.strip()[-600:]}"
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


# -- runs -------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def _run() -> Path:
    """A `twins train` run directory of 2 steps (config.json, model and optimizer safetensors,
    train_log.json), written once."""
    from twins.cli import main
    path = _root() / "run"
    code, err = _twins(main, ["train", "--task", "copy", "--backend", "torch", "--steps", "2", "--checkpoint",
                              path, "--preset", "tiny", "--batch", "8", "--eval-every", "0", "--heldout", "2",
                              "--no-progress"])
    assert code == 0, f"the fuzzer's run does not train: {err}"
    return path


def _files_of(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


def _held_twice(run: Path) -> tuple:
    """What a run's files hold twice, each copy as a resume reads it (or the error reading it):
    the model (config.json's config and the log's) and the step (the log's and its last
    segment's). A resume must refuse a run where a copy changed."""
    def read(part):
        try:
            return part()
        except Exception as err:  # noqa: BLE001  (a damaged file fails in many ways: all alike here)
            return f"unreadable ({type(err).__name__})"

    def log() -> dict:
        return json.loads((run / "train_log.json").read_text())

    return (read(lambda: TransformerConfig.from_dict(json.loads((run / "config.json").read_text())["config"])),
            read(lambda: TransformerConfig.from_dict(log()["config"])), read(lambda: log()["step"]),
            read(lambda: log()["segments"][-1]["last_step"]))


def runs(rng: random.Random) -> str | None:
    """A damaged `twins train` run directory given to ``twins train`` to resume (one step more, in
    either backend), to ``twins decode``, ``twins convert`` and ``twins figures``: one line and
    exit status 2 when refused; a resume refuses a run whose model or step changed, and leaves
    every file of a run it refuses as it was."""
    from twins.cli import main
    work = Path(tempfile.mkdtemp(prefix="twins-fuzz-case-"))
    try:
        run = work / "run"
        shutil.copytree(_run(), run)
        target = rng.choice(sorted(run.iterdir()))
        if rng.random() < 0.1:
            target.unlink()
            what = f"{target.name} removed"
        elif target.suffix == ".json":
            what = _damage_json(rng, target)
        else:
            what = _damage_bytes(rng, target)
        before, held = _files_of(run), _held_twice(run)
        command = rng.choice(["train", "train", "decode", "convert", "figures"])
        if command == "train":
            argv = ["train", "--task", "copy", "--backend", rng.choice(["torch", "tf"]), "--steps", "1",
                    "--checkpoint", run, "--eval-every", "0", "--heldout", "2", "--no-progress"]
        elif command == "decode":
            argv = ["decode", "--checkpoint", run, "--backend", rng.choice(["torch", "tf"]), "--src", "4 5 6"]
        elif command == "convert":
            argv = ["convert", run, work / "out", "--to", rng.choice(["neutral", "torch", "tf"])]
        else:  # the training curve and the attention figure, at the smallest resolution
            argv = ["figures", "--out", work / "figures", "--checkpoint", run, "--dpi", "20"]
        code, err = _twins(main, argv)
        lines = err.strip().splitlines()
        if code not in (0, 2) or "--verbose shows the traceback" in err or (code == 2 and len(lines) != 1):
            return f"twins {command} of a run ({what}): exit {code}\n    {err.strip()[-600:]}"
        if command == "train" and code == 0 and held != _held_twice(_run()):
            return f"twins train resumed a run ({what}) whose model or step is not the one it saved"
        if code == 2 and _files_of(run) != before:
            changed = sorted(set(before) ^ set(_files_of(run)) | {n for n, b in _files_of(run).items()
                                                                    if before.get(n, b) != b})
            return f"twins {command} of a run ({what}): refused ({err.strip()}), yet changed {changed}"
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)


SURFACES = {"decoders": decoders, "steps": steps, "forward": forward, "generator": generator, "weights": weights,
            "train": train, "loss": loss, "files": files, "runs": runs}


def _shown(value) -> str:
    if isinstance(value, np.ndarray):
        return f"ndarray{value.shape}:{value.dtype}"
    if isinstance(value, dict):
        return ", ".join(f"{k}={_shown(v)}" for k, v in value.items())
    if isinstance(value, tuple):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return repr(value)[:60]


def _findings(surface: str, cases: int, seed: int):
    """``(case, finding)`` for each of ``cases`` random cases of ``surface`` that finds something,
    as they are drawn (reproducible from ``seed``)."""
    rng = random.Random(f"{surface}:{seed}")
    for case in range(cases):
        finding = SURFACES[surface](rng)
        if finding is not None:
            yield case, finding


def first_finding(surface: str, cases: int, seed: int) -> tuple[int, str] | None:
    """The first of `run`'s findings, as ``(case, finding)``, drawing no case after it; else None."""
    return next(_findings(surface, cases, seed), None)


def run(surface: str, cases: int, seed: int) -> list[str]:
    """The findings of ``cases`` random cases of ``surface`` (reproducible from ``seed``)."""
    return [f"{surface} case {case} (seed {seed}): {finding}" for case, finding in _findings(surface, cases, seed)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--surfaces", nargs="+", choices=sorted(SURFACES), default=list(SURFACES))
    parser.add_argument("--cases", type=int, default=200, help="cases per surface (default 200)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    found = 0
    for surface in args.surfaces:
        findings = run(surface, args.cases, args.seed)
        for finding in findings:
            print(finding, flush=True)
        print(f"{surface}: {args.cases} cases, {len(findings)} findings", flush=True)
        found += len(findings)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
