"""ONNX model directories (docs/formats/onnx.md): Optimum's seq2seq layout (``encoder_model.onnx``,
``decoder_model.onnx``, ``decoder_with_past_model.onnx``, ``config.json``,
``generation_config.json``), written from the canonical weights by
`shared.exporters.onnx.to_onnx` (onnx imported only then). Write only: ``twins decode --backend
onnx --checkpoint DIR`` serves an export with ONNX Runtime (`twins.onnx_runtime`), and
``--verify`` checks it there against the float64 oracle.
"""
from __future__ import annotations

from pathlib import Path

from .record import Format


def _write(config, weights, path):
    from shared.exporters.onnx import to_onnx
    to_onnx(config, weights, path)


def is_export(path) -> bool:
    """Whether ``path`` is an ONNX export directory (its encoder and cached decoder present)."""
    path = Path(path)
    return (path / "encoder_model.onnx").is_file() and (path / "decoder_with_past_model.onnx").is_file()


ONNX = Format(
    "onnx", "onnx",
    "an ONNX model directory (encoder, decoder, decoder with past; ONNX Runtime serves it)",
    write=_write, runs_in="onnxruntime")

FORMATS = (ONNX,)
