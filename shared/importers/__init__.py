"""Importers: models trained elsewhere -> ``(TransformerConfig, canonical weights)``. NumPy only.

Each importer reads a source layout without executing code, maps every setting the source stores
(or the caller declares) onto `shared.TransformerConfig`, or refuses naming the setting; it never
guesses. Every problem is reported at once in one `ImporterError`, and nothing is returned partially.

=====================  ==============================================  =========================
function               source                                          module
=====================  ==============================================  =========================
`from_nn_transformer`  PyTorch tutorial ``Seq2SeqTransformer``          `.pytorch`
`from_annotated`       the Annotated Transformer's ``EncoderDecoder``   `.pytorch`
=====================  ==============================================  =========================
"""
from .common import ImporterError
from .pytorch import from_annotated, from_nn_transformer

__all__ = ["ImporterError", "from_annotated", "from_nn_transformer"]
