"""Exporters: ``(TransformerConfig, canonical weights)`` -> a model directory another library loads.

Each exporter maps every setting of the config onto the target's own description of the model, or
refuses naming each setting the target cannot compute (`ExportError`); it writes its directory
crash-safely (`shared.saving.replace_directory`), so a failed export leaves nothing behind. A target
library is imported only inside the export function that needs it, never by ``import shared``.

=================  =======================================================  ===============
function           target                                                   module
=================  =======================================================  ===============
`to_marian`        a directory ``transformers.MarianMTModel.from_pretrained``  `.marian`
                   loads (NumPy + safetensors; transformers not needed)
`to_ctranslate2`   a CTranslate2 model directory (``ctranslate2.Translator``),  `.ctranslate2`
                   built through CTranslate2's own spec API
=================  =======================================================  ===============
"""
from .common import ExportError
from .ctranslate2 import to_ctranslate2
from .marian import to_marian

__all__ = ["ExportError", "to_ctranslate2", "to_marian"]
