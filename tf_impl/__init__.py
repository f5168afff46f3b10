"""The Transformer in TensorFlow 2 / Keras 3. Imports TensorFlow, Keras and `shared`, never torch.

``Transformer(config)`` is a ``keras.Model`` built from small layers that torch_impl mirrors file for
file: embedding, norm, attention, feed_forward, layers, stacks, model; inputs holds the input checks
and default masks, weights_io maps the canonical weight names of `shared.weights` onto its variables;
checkpoints reads and writes files (`load_checkpoint`, `save_checkpoint`: a neutral directory or a
``.weights.h5``), above the model.
Decoding: `greedy_decode` and `beam_search` (decoding.py, over the search loops of search.py and the
key/value cache of cache.py), compiled into one tf.function by default.
"""
from shared.load_order import load_triton_first

load_triton_first()  # before TensorFlow loads (shared/load_order.py: triton after TensorFlow crashes)

from .checkpoints import load_checkpoint, save_checkpoint  # noqa: E402
from .decoding import beam_search, greedy_decode  # noqa: E402
from .model import Generator, Transformer  # noqa: E402

__all__ = ["Transformer", "Generator", "greedy_decode", "beam_search", "load_checkpoint",
           "save_checkpoint"]
