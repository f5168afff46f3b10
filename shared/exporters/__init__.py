"""Exporters: ``(TransformerConfig, canonical weights)`` -> a model directory another library loads.

Each exporter maps every setting of the config onto the target's own description of the model, or
refuses naming the setting the target cannot compute; it writes its directory crash-safely
(`shared.saving.replace_directory`), so a failed export leaves nothing behind. The target library is
imported only inside the export function, never by ``import shared``.

=====================  ==============================================  =========================
function               target                                          module
=====================  ==============================================  =========================
`to_ctranslate2`       a CTranslate2 model (``ctranslate2.Translator``)  `.ctranslate2`
=====================  ==============================================  =========================
"""
from .ctranslate2 import to_ctranslate2

__all__ = ["to_ctranslate2"]
