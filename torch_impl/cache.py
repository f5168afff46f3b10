"""The key/value cache of incremental decoding: what one decoding step keeps for the next.

Per decoder layer, cross-attention keys and values are computed once per source (they depend only
on the encoder memory) and self-attention keys and values grow by one position a step. Rows are
``n = item * beams + beam`` (``beams = 1`` for greedy), the row order of `shared.decoding`.

Self-attention keys/values live in buffers preallocated for ``capacity`` positions and written in
place at the current position, rather than concatenated along the length axis each step. Measured
on ``base`` float32 (torch 2.13 CPU, 1 thread, greedy, 128 tokens, 4 interleaved runs each), the two
are equally fast: 2.10-2.26 s (buffer) vs 2.10-2.19 s (concatenation) at batch 1, 5.17-6.62 s vs
5.15-8.45 s at batch 8. A step is dominated by reading the weights (~180 MB); concatenation copies
the growing cache (up to 2 MB per layer a step at batch 8), attention over a buffer slice reads it
strided. The buffer wins on the rest: no allocation per step, and it is the fixed-shape state a
compiled loop (tf_impl's ``tf.while_loop``, XLA) needs, so both backends keep one design.

Every update is written in place (torch tensors are mutable) and the updated object is also
returned (`MultiHeadAttention.extend` returns the buffers, `DecoderLayer.step` the layer cache,
`Transformer.decode_step` ``(logits, cache)``, `DecoderCache.reorder_beams` the cache), so that the
code that uses a cache is the same as tf_impl's, whose caches are immutable tuples.

Used through `torch_impl.Transformer.init_cache` and `.decode_step`; `torch_impl.search` gives the
loops that drive them (the `shared.decoding` spec, with the cache as the step's state).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class LayerCache:
    """One decoder layer's cached keys and values, per head.

    Shape:
        self_key, self_value: ``(N, H, capacity, d_k)``; positions ``0 .. length - 1`` of the owning
            `DecoderCache` are filled, the rest is scratch.
        cross_key, cross_value: ``(N, H, S, d_k)``, from the encoder memory, never changed.
    """
    self_key: torch.Tensor
    self_value: torch.Tensor
    cross_key: torch.Tensor
    cross_value: torch.Tensor

    def updated(self, self_key: torch.Tensor, self_value: torch.Tensor) -> "LayerCache":
        """This layer's cache holding the self-attention buffers of a step (those
        `MultiHeadAttention.extend` returns: here the same tensors, written in place); returns
        ``self``, updated, where tf_impl returns a new cache."""
        self.self_key, self.self_value = self_key, self_value
        return self


@dataclass
class DecoderCache:
    """The state of incremental decoding for ``N`` rows.

    Attributes:
        layers: one `LayerCache` per decoder layer.
        src_mask: bool, True = may attend, ``(N|1, 1|H, 1, S)``: the source padding, for
            cross-attention.
        length: positions already decoded; the next token goes to position ``length`` (and gets
            row ``length`` of the positional table).
    """
    layers: list[LayerCache]
    src_mask: torch.Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        """The most positions the self-attention buffers hold (``max_len`` of `init_cache`)."""
        return self.layers[0].self_key.shape[2] if self.layers else 0

    @property
    def rows(self) -> int:
        return self.layers[0].self_key.shape[0] if self.layers else self.src_mask.shape[0]

    def advanced(self, layers: list[LayerCache]) -> "DecoderCache":
        """The cache after one decoding step: ``layers`` (from each `DecoderLayer.step`) and one
        more position filled. Updates ``self`` and returns it (tf_impl returns a new cache)."""
        self.layers, self.length = list(layers), self.length + 1
        return self

    def reorder_beams(self, rows: torch.Tensor) -> "DecoderCache":
        """Let row ``n`` continue from row ``rows[n]`` (beam search's source beam): gathers the
        filled self-attention positions, in place, and returns ``self``.

        ``rows[n]`` must belong to the same source item as ``n`` (``rows[n] // beams == n // beams``),
        as beam search's are: cross-attention keys/values and the source mask are the same for every
        beam of an item, so they are left as they are rather than copied every step.

        Shape: rows ``(N,)`` int64, on the cache's device.
        """
        end = self.length
        for layer in self.layers:
            for buf in (layer.self_key, layer.self_value):
                buf[:, :, :end] = buf[:, :, :end].index_select(0, rows)  # gathers a copy, then writes
        return self


def repeat_rows(x: torch.Tensor, beams: int) -> torch.Tensor:
    """Repeat each row ``beams`` times along axis 0: row ``b`` -> rows ``b * beams`` to
    ``b * beams + beams - 1``. A tensor with a batch axis of 1 broadcasts and is returned as is."""
    return x if beams == 1 or x.shape[0] == 1 else x.repeat_interleave(beams, dim=0)
