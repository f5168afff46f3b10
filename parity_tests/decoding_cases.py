"""The cases of the decoding contract suite: tiny models with the EOS logit raised, their sources
and targets, the oracle's decodes, and each backend's decodes, memoised (a TF trace costs about a
second, XLA several: each compiled loop is traced once per case and reused by every test)."""
from __future__ import annotations

import functools

import numpy as np

from parity_tests.decoding_backends import ModelBackend
from parity_tests.matrix import VARIANTS
from shared import TransformerConfig
from shared import reference as R
from shared.batches import token_batch
from shared.weights import random_weights


def tiny_configs() -> dict[str, TransformerConfig]:
    return {name: config for name, config in VARIANTS.items() if name != "base"}


MAX_LEN, BEAM, ALPHAS = 10, 3, (0.0, 0.6)


def config64(variant: str) -> TransformerConfig:
    return tiny_configs()[variant].replace(dtype="float64")


def weights_for(config: TransformerConfig, seed: int, eos_boost: float = 1.5) -> dict:
    """Random weights with the EOS logit raised (as test_decoding_reference does), so that rows
    end at different steps instead of nearly all running to max_len."""
    w = random_weights(config, seed)
    w["generator.bias"] = w["generator.bias"].copy()
    w["generator.bias"][config.eos_id] += eos_boost
    return w


def sources(config: TransformerConfig, seed: int, lengths=(7, 5, 2, 1, 0)) -> np.ndarray:
    """A padded batch; by default the last row is all padding."""
    return token_batch(config, config.src_vocab, len(lengths), 7, seed, list(lengths))


def targets(config: TransformerConfig, rows: int, length: int, seed: int) -> np.ndarray:
    """BOS then ordinary tokens, no pad: what decoding feeds (it never generates pad)."""
    tgt = token_batch(config, config.tgt_vocab, rows, length, seed, [length] * rows)
    tgt[:, 0] = config.bos_id
    return tgt


@functools.lru_cache(maxsize=None)
def reference_decodes(variant: str, seed: int):
    """The oracle's greedy result and beam results (K = 3, every beam) per alpha."""
    config = config64(variant)
    model, src = R.Model(weights_for(config, seed), config), sources(config, seed)
    return (R.greedy_decode(model, src, MAX_LEN),
            {alpha: R.beam_search(model, src, MAX_LEN, BEAM, alpha, True) for alpha in ALPHAS})


def model_for(backend: str, variant: str, dtype: str, seed: int):
    """``backend``'s model of ``variant`` in ``dtype`` holding ``weights_for(float64, seed)``."""
    return ModelBackend(backend).build(tiny_configs()[variant].replace(dtype=dtype),
                                       weights_for(config64(variant), seed))


@functools.lru_cache(maxsize=None)
def greedy(backend: str, variant: str, dtype: str, seed: int, use_cache: bool = True):
    """Memoised: ``backend``'s greedy decode of the case (so a compiled loop is traced once)."""
    model = model_for(backend, variant, dtype, seed)
    return ModelBackend(backend).greedy_decode(model, sources(config64(variant), seed), MAX_LEN,
                                               use_cache=use_cache)


@functools.lru_cache(maxsize=None)
def beams(backend: str, variant: str, dtype: str, seed: int, use_cache: bool = True):
    """Memoised: beam results (K = 3, every beam) per alpha; one compiled loop serves both alphas."""
    model, be = model_for(backend, variant, dtype, seed), ModelBackend(backend)
    src = sources(config64(variant), seed)
    return {alpha: be.beam_search(model, src, MAX_LEN, BEAM, alpha, True, use_cache=use_cache)
            for alpha in ALPHAS}
