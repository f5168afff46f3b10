"""Exporters: ``(TransformerConfig, canonical weights)`` -> the files another library loads.

=================  =====================================================  ===================
function           target                                                 module
=================  =====================================================  ===================
`to_marian`        a directory ``transformers.MarianMTModel.from_pretrained``  `.marian`
                   loads (NumPy + safetensors; transformers not needed)
=================  =====================================================  ===================

An exporter writes exactly what the target computes or refuses, naming each setting the target
cannot express; the directory is written crash-safely (`shared.saving.replace_directory`), so a
failed export leaves nothing behind.
"""
from .common import ExportError
from .marian import to_marian

__all__ = ["ExportError", "to_marian"]
