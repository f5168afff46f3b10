"""The parity matrix every backend is tested over, defined once so the backends cannot drift apart.

`CASES` crosses model variants (norm placement and style, shared/tied embeddings, presets) with
input shapes (batch sizes, source and target lengths, padding patterns including an all-padding row).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from shared.batches import src_tgt
from shared import TransformerConfig, tasks

TINY = TransformerConfig.preset("tiny")

VARIANTS: dict[str, TransformerConfig] = {
    "tiny-pre-annotated": TINY,
    "tiny-pre-standard": TINY.replace(norm_style="standard"),
    "tiny-post-standard": TINY.replace(norm_first=False, norm_style="standard"),
    "tiny-post-annotated": TINY.replace(norm_first=False),
    "tiny-shared": TINY.replace(tgt_vocab=TINY.src_vocab, share_embeddings=True),
    "tiny-tied": TINY.replace(tie_output=True),
    "tiny-shared-tied-post": TINY.replace(tgt_vocab=TINY.src_vocab, share_embeddings=True,
                                          tie_output=True, norm_first=False, norm_style="standard"),
    "tiny-post-final-norm": TINY.replace(norm_first=False, final_norm=True, norm_style="standard"),
    "base": TransformerConfig.preset("base"),
}


@dataclass(frozen=True)
class Inputs:
    """batch, lengths, and the number of real tokens per row (None = the default pattern)."""
    batch: int
    src_len: int
    tgt_len: int
    src_lengths: tuple[int, ...] | None = None
    tgt_lengths: tuple[int, ...] | None = None

    def make(self, config: TransformerConfig, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        return src_tgt(config, self.batch, self.src_len, self.tgt_len, seed,
                       None if self.src_lengths is None else list(self.src_lengths),
                       None if self.tgt_lengths is None else list(self.tgt_lengths))


SHAPES: dict[str, Inputs] = {
    "b1-full": Inputs(1, 9, 9, (9,), (9,)),
    "b3-padded-src-longer": Inputs(3, 11, 6),
    "b2-tgt-longer": Inputs(2, 5, 8),
    "b3-all-padding-row": Inputs(3, 7, 5, (7, 0, 3), (5, 0, 2)),
}

# Every variant with the padded shape, and every shape with the default variant; `base` runs on one
# shape only (it is 63M parameters). Ids: "variant/shape".
CASES: list[tuple[str, str]] = sorted(
    {(v, "b3-padded-src-longer") for v in VARIANTS if v != "base"}
    | {("tiny-pre-annotated", s) for s in SHAPES}
    | {("tiny-post-standard", "b3-all-padding-row")}
    | {("base", "b2-tgt-longer")}
)


def case(variant: str, shape: str, dtype: str) -> tuple[TransformerConfig, np.ndarray, np.ndarray]:
    config = VARIANTS[variant].replace(dtype=dtype, final_norm=VARIANTS[variant].final_norm)
    src, tgt = SHAPES[shape].make(config)
    return config, src, tgt


def copy_batches(steps: int, seed: int = 0):
    """``steps`` training batches of 4 copy sequences, lengths 10, 8, 6, 4 (padding in every
    batch), as `shared.tasks.batch_sequences` makes them: the training trajectories' data."""
    pairs = tasks.copy_examples(4 * steps, seed)
    for i in range(steps):
        sources = [s[: 10 - 2 * j] for j, (s, _) in enumerate(pairs[4 * i: 4 * i + 4])]
        yield tasks.batch_sequences(sources, sources)
