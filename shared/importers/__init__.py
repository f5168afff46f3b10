"""Importers: models trained elsewhere -> ``(TransformerConfig, canonical weights)``. NumPy only.

Each importer reads a source layout without executing code, maps every setting the source stores
(or the caller declares) onto `shared.TransformerConfig`, or refuses naming the setting; it never
guesses. Every problem is reported at once in one `ImporterError`, and nothing is returned partially.

=====================  ==============================================  =========================
function               source                                          module
=====================  ==============================================  =========================
`from_nn_transformer`  PyTorch tutorial ``Seq2SeqTransformer``          `.pytorch`
`from_annotated`       the Annotated Transformer's ``EncoderDecoder``   `.pytorch`
`from_tf_tutorial`     the TensorFlow text tutorial's ``Transformer``   `.tf_tutorial`
`from_keras_hub`       KerasHub ``TransformerEncoder/Decoder`` models   `.keras_hub`
=====================  ==============================================  =========================

The Keras importers take the variables of a ``.weights.h5`` / ``.keras`` file as `read_keras_file`
returns them (h5py, imported only when a file is read; nothing in the file is executed).
"""
from .common import ImporterError
from .keras_file import KerasFile, read_keras_file
from .keras_hub import from_keras_hub
from .pytorch import from_annotated, from_nn_transformer
from .tf_tutorial import from_tf_tutorial

__all__ = ["ImporterError", "KerasFile", "from_annotated", "from_keras_hub", "from_nn_transformer",
           "from_tf_tutorial", "read_keras_file"]
