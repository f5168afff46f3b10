"""Importers: models trained elsewhere -> ``(TransformerConfig, canonical weights)``. NumPy only.

Each importer reads a source layout without executing code, maps every setting the source stores
(or the caller declares) onto `shared.TransformerConfig`, or refuses naming the setting; it never
guesses. Every problem is reported at once in one `ImporterError`, and nothing is returned partially.

=====================  ==============================================  =========================
function               source                                          module
=====================  ==============================================  =========================
`from_nn_transformer`  PyTorch tutorial ``Seq2SeqTransformer``          `.pytorch`
`from_annotated`       the Annotated Transformer's ``EncoderDecoder``   `.pytorch`
`from_marian`          ``MarianMTModel.save_pretrained`` (OPUS-MT)     `.marian`
`from_fsmt`            ``FSMTForConditionalGeneration.save_pretrained`` `.fsmt`
=====================  ==============================================  =========================

Every importer takes ``rename={OLD: NEW}`` (source key prefixes mapped first) and, when keys are
missing, names the unexpected keys that look like them and the prefixes that would map them.
"""
from .common import ImporterError
from .fsmt import from_fsmt
from .marian import from_marian
from .pytorch import from_annotated, from_nn_transformer

__all__ = ["ImporterError", "from_annotated", "from_fsmt", "from_marian", "from_nn_transformer"]
