"""The benchmarks' one answer to "can ``--device cuda`` run here?": torch is how every benchmark
sees a GPU, so the reason names torch and its version (a CPU build, or no device)."""
from __future__ import annotations


def cuda_missing() -> str | None:
    """Why ``--device cuda`` cannot run here, or None."""
    try:
        import torch
    except ImportError as err:
        return f"torch is not installed ({err}), and the benchmarks find CUDA devices through it"
    if not torch.cuda.is_available():
        return f"no CUDA device (torch {torch.__version__}: torch.cuda.is_available() is False)"
    return None
