"""Where a framework computes: the one spelling of a device that both backends and every command take.

A device is ``"cpu"`` (the default everywhere), ``"cuda"`` (the first GPU) or ``"cuda:N"``, as
PyTorch spells them; TensorFlow's ``/GPU:N`` is the same GPU. The adapters of `twins.backends`
place a model there: torch_impl with ``model.to(device)``; tf_impl is built and called inside
``tf.device`` (``/CPU:0`` too where TensorFlow sees a GPU: it otherwise puts every operation on
the first GPU it sees), as the TF tests choose a device.

On a GPU both frameworks keep float32 products in float32: TF32 off. TensorFlow turns TF32 on by
default on Ampere and later GPUs (torch turns it off for matrix products); its products keep 10
mantissa bits, outside every float32 bound of `shared.tolerances` (the parity tests switch it off
the same way).

Framework-free: the spelling and the messages; what each framework sees is asked by its adapter.
"""
from __future__ import annotations

import re

DEFAULT = "cpu"
SPELLINGS = "cpu, cuda or cuda:N"


def parse_device(device, name: str = "device") -> tuple[str, int | None]:
    """``(kind, index)`` of ``device``: ``("cpu", None)``, ``("cuda", 0)`` for ``"cuda"``,
    ``("cuda", N)`` for ``"cuda:N"`` (N in ASCII digits).

    Raises:
        TypeError: ``device`` is not a str.
        ValueError: any other spelling (``"gpu"``, ``"cuda:-1"``, ``"CUDA"``), naming ``name``.
    """
    if not isinstance(device, str):
        raise TypeError(f"{name}: expected a device name ({SPELLINGS}), got {type(device).__name__}")
    if device == "cpu":
        return "cpu", None
    match = re.fullmatch(r"cuda(?::([0-9]{1,6}))?", device)
    if match is None:
        shown = repr(device) if len(device) <= 80 else f"{device[:80]!r}... ({len(device):,} characters)"
        raise ValueError(f"{name}: expected {SPELLINGS}, got {shown}")
    return "cuda", int(match.group(1) or 0)


def unavailable(name: str, device: str, framework: str, gpus: int) -> str:
    """The message of a ``device`` that ``framework`` (its name and version) cannot use, seeing
    ``gpus`` GPUs: the same sentence in both backends."""
    seen = ("no GPU" if gpus == 0 else
            f"{gpus} GPU{'s' if gpus > 1 else ''}: cuda:0" + (f" to cuda:{gpus - 1}" if gpus > 1 else ""))
    return f"{name}: expected a device that {framework} sees, got {device!r} (it sees {seen})"
