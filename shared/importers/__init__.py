"""Importers: models trained elsewhere -> ``(TransformerConfig, canonical weights)``. NumPy only.

Each importer reads a source layout without executing code, maps every setting the source stores
(or the caller declares) onto `shared.TransformerConfig`, or refuses naming the setting; it never
guesses. Every problem is reported at once in one `ImporterError`, and nothing is returned partially.

=====================  ================================================  ================
function               source                                            module
=====================  ================================================  ================
`from_nn_transformer`  PyTorch tutorial ``Seq2SeqTransformer``            `.pytorch`
`from_annotated`       the Annotated Transformer's ``EncoderDecoder``     `.pytorch`
`from_marian`          ``MarianMTModel.save_pretrained`` (OPUS-MT)        `.marian`
`from_fsmt`            ``FSMTForConditionalGeneration.save_pretrained``   `.fsmt`
`from_tf_tutorial`     the TensorFlow text tutorial's ``Transformer``     `.tf_tutorial`
`from_keras_hub`       KerasHub ``TransformerEncoder/Decoder`` models     `.keras_hub`
=====================  ================================================  ================

The Keras importers take the variables of a ``.weights.h5`` / ``.keras`` file as `read_keras_file`
returns them (h5py, imported only when a file is read; nothing in the file is executed).

The PyTorch-layout and transformers importers take ``rename={OLD: NEW}`` (source key prefixes mapped first) and, when keys are
missing, names the unexpected keys that look like them and the prefixes that would map them.
"""
from .common import ImporterError
from .fsmt import from_fsmt
from .keras_file import KerasFile, read_keras_file
from .keras_hub import from_keras_hub
from .marian import from_marian
from .pytorch import from_annotated, from_nn_transformer
from .tf_tutorial import from_tf_tutorial

__all__ = ["ImporterError", "KerasFile", "from_annotated", "from_fsmt", "from_keras_hub", "from_marian",
           "from_nn_transformer", "from_tf_tutorial", "read_keras_file"]
