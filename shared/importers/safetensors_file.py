"""A ``model.safetensors`` of another model (a transformers ``save_pretrained``), read as float32 or
float64 NumPy arrays without executing code. NumPy only (and the safetensors package).

``safetensors.numpy`` reads only the dtypes NumPy has, so a bfloat16 tensor (transformers saves one
routinely: ``save_pretrained`` of a model loaded in half precision) fails there with NumPy's "data
type 'bfloat16' not understood". Here the file is opened and validated by safetensors first (header,
offsets, size), then each tensor is read by its dtype:

* ``F32`` and ``F64`` as they are;
* ``F16`` and ``BF16`` widened to float32, exactly: every float16 and every bfloat16 value is a float32
  value (bfloat16 is the upper half of a float32's bits, so the widening is a 16-bit shift), which
  an `ImportNote` says;
* anything else (integers, bool, 8-bit floats) is refused, naming the file, the tensor, its dtype and
  what is supported: the importers compute with floating-point weights only.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import numpy as np

from .notes import note_widened

KEPT = {"F32": np.float32, "F64": np.float64}
WIDENED = {"F16": "float16", "BF16": "bfloat16"}
SUPPORTED = "F32 and F64 (kept), F16 and BF16 (widened exactly to float32)"


def bfloat16_to_float32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 values given as their uint16 bit patterns -> float32, exactly (same shape): a
    bfloat16 is the upper 16 bits of a float32 with the same value."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


# safetensors' dtypes that `safetensors.numpy` loads (NumPy has no bfloat16 nor float8)
NUMPY_LOADS = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64", "F16", "F32", "F64"}


def numpy_unloadable(file: str | Path) -> dict[str, str]:
    """``{tensor: safetensors dtype}`` of the tensors of ``file`` that `safetensors.numpy` cannot
    load (BF16, F8_E4M3, ...: it would fail naming neither); raises what ``safetensors.safe_open``
    raises for a file that is not valid safetensors."""
    from safetensors import safe_open

    with safe_open(str(file), framework="numpy"):  # validates header, offsets and size
        header, _ = _header(Path(file))
    return {name: meta["dtype"] for name, meta in header.items()
            if name != "__metadata__" and meta["dtype"] not in NUMPY_LOADS}


def _header(file: Path) -> tuple[dict, int]:
    """``(the JSON header, the offset of the data)`` of a safetensors file (which safetensors has
    validated already): an 8-byte little-endian header size, the header, then the tensors' bytes."""
    with open(file, "rb") as f:
        (size,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(size)), 8 + size


def read_float_safetensors(file: str | Path) -> tuple[dict[str, np.ndarray], list[str]]:
    """``({name: float32 or float64 array}, problems)`` of a safetensors file. ``problems``: one per
    tensor of an unsupported dtype, naming the file, the tensor, the dtype and `SUPPORTED` (nothing
    is returned for those). Without problems, emits one `ImportNote` per widened dtype. Raises what
    ``safetensors.safe_open`` raises for a file that is not valid safetensors."""
    from safetensors import safe_open

    file = Path(file)
    with safe_open(str(file), framework="numpy") as reader:  # validates header, offsets and size
        names = list(reader.keys())
        header, start = _header(file)
        arrays, problems, widened = {}, [], {}
        for name in names:
            dtype, shape = header[name]["dtype"], tuple(header[name]["shape"])
            if dtype in KEPT or dtype == "F16":
                value = reader.get_tensor(name)
                arrays[name] = value.astype(np.float32) if dtype == "F16" else value
            elif dtype == "BF16":
                begin, end = header[name]["data_offsets"]
                with open(file, "rb") as f:
                    f.seek(start + begin)
                    bits = np.frombuffer(f.read(end - begin), dtype="<u2").reshape(shape)
                arrays[name] = bfloat16_to_float32(bits)
            else:
                problems.append(f"{str(file)!r}: tensor {name!r}: dtype {dtype} is not supported "
                                f"(supported: {SUPPORTED})")
                continue
            if dtype in WIDENED:
                widened.setdefault(dtype, []).append(name)
    for dtype, tensors in widened.items() if not problems else ():
        note_widened(file, WIDENED[dtype], len(tensors))
    return arrays, problems
