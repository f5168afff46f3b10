"""What the Marian and FSMT interop tests share: the cases (small real transformers models with
random weights, saved with ``save_pretrained``), the project's implementations on imported
weights, and the comparisons. Models are built once per (case, dtype) and cached."""
from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

import numpy as np

from parity_tests import hf_models as H
from shared.batches import src_tgt
from shared.tolerances import FLOAT64, bound_for

IMPLS = ("reference", "torch", "tf")
# One directory per test process, removed when it exits: every run of the suite left one per
# worker (338 of them in /tmp, 187 MB, after a day of runs).
_TMP = Path(tempfile.mkdtemp(prefix="twins-interop-"))
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


def bound(dtype: str, impl: str):
    return FLOAT64 if dtype == "float64" else bound_for("float32", f"transformers:{impl}")


@functools.lru_cache(maxsize=None)
def saved(family: str, case: str, dtype: str, settings: tuple, seed: int = 0):
    """``(model, directory)``: the transformers model and where ``save_pretrained`` wrote it."""
    make = H.make_marian if family == "marian" else H.make_fsmt
    model = make(seed, dtype, **dict(settings))
    path = _TMP / f"{family}-{case}-{dtype}-{seed}"
    model.save_pretrained(str(path))
    return model, path


_ADAPTERS: dict = {}


def adapter(impl: str, config, weights: dict, key: tuple):
    """The project's implementation ``impl`` holding ``weights``, cached under ``key`` (the case
    the weights were imported from): TF models are slow to build."""
    from twins.backends import make_adapter
    if (impl, key) not in _ADAPTERS:
        _ADAPTERS[(impl, key)] = make_adapter(impl, config, weights)
    return _ADAPTERS[(impl, key)]


def batch(config, seed: int = 0, tgt_full: bool = False):
    """3 right-padded sources (row 0 full) and targets starting with the start token."""
    src, tgt = src_tgt(config, batch=3, src_len=7, tgt_len=6, seed=seed,
                       tgt_lengths=[6, 6, 6] if tgt_full else None)
    assert (src == config.pad_id).any()
    return src, tgt


def sources(config, n: int = 8, length: int = 6, seed: int = 5) -> np.ndarray:
    """``n`` right-padded sources of varied lengths (at least one real token each)."""
    from shared.batches import token_batch
    lengths = [length - (i % (length - 1)) for i in range(n)]
    return token_batch(config, config.src_vocab, n, length, seed, lengths)
