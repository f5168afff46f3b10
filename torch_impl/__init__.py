"""The Transformer in PyTorch. Imports torch and `shared`, never TensorFlow or Keras.

``Transformer(config)`` is an ``nn.Module`` built from small modules that tf_impl mirrors file for
file: embedding, norm, attention, feed_forward, layers, stacks, model; weights_io maps the canonical
weight names of `shared.weights` onto its parameters; checkpoints reads and writes files
(`load_checkpoint`, `save_checkpoint`: a neutral directory or a ``.pt``), above the model.
Decoding: `greedy_decode` and `beam_search` (decoding.py, over the search loops of search.py and
the key/value cache of cache.py).
"""
from shared.load_order import load_triton_first

load_triton_first()  # before torch loads (shared/load_order.py: triton after TensorFlow crashes)

from .checkpoints import load_checkpoint, save_checkpoint  # noqa: E402
from .decoding import beam_search, greedy_decode  # noqa: E402
from .model import Generator, Transformer  # noqa: E402

__all__ = ["Transformer", "Generator", "greedy_decode", "beam_search", "load_checkpoint",
           "save_checkpoint"]
