"""CTranslate2 model directories (docs/formats/ctranslate2.md): written through CTranslate2's own
spec API by `shared.exporters.to_ctranslate2` (ctranslate2 imported only then). Write only: a
CTranslate2 model keeps no training weights to read back exactly (``--verify`` compares its
``score_batch`` log-probs with the source's instead).
"""
from __future__ import annotations

from shared import exporters

from .record import Format


def _write(config, weights, path):
    exporters.to_ctranslate2(config, weights, path)


CTRANSLATE2 = Format(
    "ctranslate2", "ctranslate2", "a CTranslate2 model directory (ctranslate2.Translator loads it)",
    write=_write, runs_in="ctranslate2")

FORMATS = (CTRANSLATE2,)
