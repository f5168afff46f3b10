"""ONNX model directories (docs/formats/onnx.md): Optimum's seq2seq layout (``encoder_model.onnx``,
``decoder_model.onnx``, ``decoder_with_past_model.onnx``, ``config.json``,
``generation_config.json``), written from the canonical weights by
`shared.exporters.onnx.to_onnx` (onnx imported only then), in float32 (the model's dtype) or, with
``--precision float16``, in `shared.precision`'s float16 mixed precision. Write only: ``twins
decode --backend onnx --checkpoint DIR`` serves an export with ONNX Runtime (`twins.onnx_runtime`),
and ``--verify`` checks it there against the float64 oracle.

Why write only, in either precision: an export is a computation, not a checkpoint. Its weights are
rearranged for it (query, key and value kernels concatenated, a tied generator a ``Transpose`` of
the table), and a float16 export's kernels are rounded: widening them back to float32 would be
exact, but it would give the float16-rounded weights, not the model that was exported. Keep the
checkpoint the export was made from.
"""
from __future__ import annotations

from pathlib import Path

from ..checks import check_config
from ..paths import check_path
from ..precision import check_precision
from .record import Format, Option

PRECISION = Option("precision", "onnx: what the graphs compute in, float32 (default: the model's dtype) or "
                   "float16 / fp16 (shared.precision's mixed precision: float16 products and cache, "
                   "float32 stream, norms and softmax); bfloat16 is refused", metavar="PRECISION")


def _write(config, weights, path, precision: str = "float32"):
    from shared.exporters.onnx import to_onnx
    check_path(path)
    check_config(config)  # before its dtype is read
    precision = check_precision(precision, config.dtype)
    to_onnx(config, weights, path, precision=precision)
    return None if precision == "float32" else f"{precision} mixed-precision graphs (shared.precision)"


def is_export(path) -> bool:
    """Whether ``path`` is an ONNX export directory: any of its graphs there (one lost is then
    named by the reader, `read_onnx`, not taken for a neutral checkpoint missing its weights)."""
    path = Path(path)
    return any((path / name).is_file() for name in
               ("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"))


ONNX = Format(
    "onnx", "onnx",
    "an ONNX model directory (encoder, decoder, decoder with past; ONNX Runtime serves it)",
    write=_write, write_options=(PRECISION,), runs_in="onnxruntime")

FORMATS = (ONNX,)
