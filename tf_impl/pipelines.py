"""Keras' input pipelines, each batch checked before a step takes it (`Transformer._checked` in
`tf_impl.model`). Keras' `fit`, `evaluate` and `predict` compile their steps with XLA wherever they
see a GPU (or with ``jit_compile=True``), where nothing can raise and an id out of range embeds as
NaN: one step on a NaN loss makes every weight NaN. So the batches a pipeline makes in Python (a
generator's, a ``keras.utils.PyDataset``'s, a torch ``DataLoader``'s) are checked with NumPy as
they are made (`shared.checks.checked_inputs`, the reference's check and words), and passed on
unchanged. TensorFlow-only: torch_impl has no Keras functions (its twin checks at the call).

The targets ``y`` too, where the compiled loss is Keras' sparse categorical cross-entropy, whose
labels the model knows: ids in ``[0, tgt_vocab)`` or the loss's ``ignore_class`` (`label_rule`).
Under XLA its gather takes a label out of range as NaN, as the embedding does an id. A port from
PyTorch meets it first: torch's cross-entropy ignores ``-100`` by default, Keras' loss only the
``ignore_class`` it is given. Another loss's labels are its own, and are not checked.
"""
from __future__ import annotations

import sys
from typing import Mapping

import keras
import tensorflow as tf

from shared import TransformerConfig
from shared.checks import as_array, checked_inputs

from .inputs import runtime_check

LabelRule = tuple  # (tgt_vocab, ignore_class or None): the labels a loss takes (`label_rule`)


def unpack_x(x, src_mask, tgt_mask):
    """``x`` as ``predict`` passes it (and `Transformer.call` takes it): ``(src, tgt[, src_mask,
    tgt_mask])`` or a dict of those, as ``(src, tgt, src_mask, tgt_mask)`` with the keywords'
    masks where ``x`` has none; a mask in ``x`` and as a keyword is refused (the keyword was
    dropped without a word)."""
    if isinstance(x, Mapping):
        unknown = sorted(set(x) - {"src", "tgt", "src_mask", "tgt_mask"})
        if unknown or "src" not in x or "tgt" not in x:
            raise ValueError("x: expected a dict with keys 'src', 'tgt' (and optionally 'src_mask', "
                             f"'tgt_mask'), got keys {sorted(x)}")
        packed = [x["src"], x["tgt"], x.get("src_mask"), x.get("tgt_mask")]
    elif isinstance(x, (tuple, list)) and 2 <= len(x) <= 4:
        packed = list(x) + [None] * (4 - len(x))
    else:
        raise ValueError("tgt: required (or pass x = (src, tgt) or {'src': ..., 'tgt': ...}), got src alone")
    for i, (name, keyword) in enumerate((("src_mask", src_mask), ("tgt_mask", tgt_mask)), start=2):
        if packed[i] is None:
            packed[i] = keyword
        elif keyword is not None:
            raise ValueError(f"{name}: given twice, in x and as a keyword; give one")
    return tuple(packed)


def label_rule(loss, tgt_vocab: int) -> LabelRule | None:
    """``(tgt_vocab, ignore_class)`` where ``loss`` (`compile`'s) is Keras' sparse categorical
    cross-entropy (the class, its function or its name), whose labels are target ids; None for
    any other loss, whose labels this module cannot know."""
    if isinstance(loss, keras.losses.SparseCategoricalCrossentropy):
        return tgt_vocab, loss.get_config()["ignore_class"]
    sparse = ("sparse_categorical_crossentropy", "SparseCategoricalCrossentropy")
    if (isinstance(loss, str) and loss in sparse) or loss is keras.losses.sparse_categorical_crossentropy:
        return tgt_vocab, None
    return None


def labels_message(rule: LabelRule, lo, hi) -> str:
    vocab, ignore = rule
    return (f"y: expected target ids in [0, {vocab}) for the loss (SparseCategoricalCrossentropy "
            f"with ignore_class={ignore!r}), got values in [{lo}, {hi}]")


def check_labels(y, rule: LabelRule | None) -> None:
    """Integer labels ``y`` (any shape) within ``rule`` (`label_rule`), with NumPy: every value but
    the ignored one in ``[0, tgt_vocab)``, else a ``ValueError`` naming the values' range
    (`labels_message`). Nothing to check without a rule, without labels, or for float labels
    (Keras casts them; they hold no id to name), nor for a structure of several (a dict: not
    this model's one output)."""
    if rule is None or y is None or isinstance(y, Mapping):
        return
    y = as_array("y", y)
    kept = y if rule[1] is None else y[y != rule[1]]
    if y.dtype.kind in "iu" and kept.size and (kept.min() < 0 or kept.max() >= rule[0]):
        raise ValueError(labels_message(rule, int(kept.min()), int(kept.max())))


def checked_labels(y: tf.Tensor, rule: LabelRule | None) -> tf.Tensor:
    """`check_labels` in graph mode (a `tf.data.Dataset`'s map) on a tensor ``y``: ``y`` carrying
    an ``Assert`` with the same message; ``y`` as it is where there is nothing to check."""
    if rule is None or not y.dtype.is_integer:
        return y
    vocab, ignore = rule
    kept = tf.ones_like(y, tf.bool) if ignore is None else tf.not_equal(y, tf.cast(ignore, y.dtype))
    lo = tf.reduce_min(tf.where(kept, y, y.dtype.max))  # none kept: lo = max, hi = min, both pass
    hi = tf.reduce_max(tf.where(kept, y, y.dtype.min))
    return runtime_check(y, [(tf.logical_and(lo >= 0, hi < vocab), labels_message(rule, "{}", "{}"), (lo, hi))])


def check_batch(config: TransformerConfig, batch, labels: LabelRule | None = None) -> None:
    """One batch a pipeline made in Python (``x``, ``(x, y)`` or ``(x, y, sample_weight)``, as
    Keras unpacks it): ``x``'s ids and masks checked with NumPy (`shared.checks.checked_inputs`),
    and ``y`` by ``labels`` (`check_labels`), where it is made (a PyDataset's worker process too)."""
    x, y, _ = keras.utils.unpack_x_y_sample_weight(batch)
    checked_inputs(config, *unpack_x(x, None, None))
    check_labels(y, labels)


def checked_batches(batches, config: TransformerConfig, labels: LabelRule | None = None):
    """A Python generator's batches, each checked (`check_batch`) before Keras takes it."""
    for batch in batches:
        check_batch(config, batch, labels)
        yield batch


class CheckedPyDataset(keras.utils.PyDataset):
    """A ``keras.utils.PyDataset`` whose every batch is checked (`check_batch`) as it is made,
    with the wrapped one's workers, length and epoch hooks."""

    def __init__(self, batches: keras.utils.PyDataset, config: TransformerConfig, labels: LabelRule | None = None):
        super().__init__(workers=batches.workers, use_multiprocessing=batches.use_multiprocessing,
                         max_queue_size=batches.max_queue_size)
        self.batches, self.config, self.labels = batches, config, labels

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def num_batches(self):
        return self.batches.num_batches

    def __getitem__(self, index):
        batch = self.batches[index]
        check_batch(self.config, batch, self.labels)
        return batch

    def on_epoch_begin(self):
        self.batches.on_epoch_begin()

    def on_epoch_end(self):
        self.batches.on_epoch_end()


def is_torch_loader(x) -> bool:
    """Whether ``x`` is a ``torch.utils.data.DataLoader`` (Keras takes one in `fit`, `evaluate` and
    `predict`), asked without importing torch: where one exists torch is imported already, and
    tf_impl imports no torch (design.md, section 3)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.utils.data.DataLoader)


def checked_torch_loader(loader, config: TransformerConfig, labels: LabelRule | None = None):
    """A ``torch.utils.data.DataLoader`` whose every batch is the given loader's, checked
    (`check_batch`, on a CPU copy of its tensors) before Keras takes it, and passed on unchanged.
    The given loader keeps its workers, sampler and collation; this one adds none: its items are
    the batches (``batch_size=None``), each passed on as it is (torch's default conversion would
    make a tuple a list). Keras reads a loader's batches, and its length (the steps of an epoch)
    where its dataset has one (``TorchDataLoaderAdapter``), so this one has a length where the
    given one's dataset has."""
    import torch  # imported already: `loader` is torch's

    def on_host(value):
        return value.cpu() if isinstance(value, torch.Tensor) else value

    class Batches(torch.utils.data.IterableDataset):
        def __iter__(self):
            for batch in loader:
                check_batch(config, keras.tree.map_structure(on_host, batch), labels)
                yield batch

    class SizedBatches(Batches):
        def __len__(self):
            return len(loader)

    batches = SizedBatches() if hasattr(loader.dataset, "__len__") else Batches()
    return torch.utils.data.DataLoader(batches, batch_size=None, collate_fn=_as_made)


def _as_made(batch):
    """A batch as its loader made it (the ``collate_fn`` of `checked_torch_loader`)."""
    return batch
