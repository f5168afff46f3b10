"""Framework-free core shared by every implementation (NumPy only).

Conventions are fixed here once: masks (True = may attend), the positional encoding tables,
the Noam schedule, the canonical weight schema and checkpoint format, and the float64 reference.
Importing this package imports neither PyTorch nor TensorFlow.
"""
from .config import PRESETS, TransformerConfig
from .masks import make_src_mask, make_tgt_mask, padding_id, padding_mask, start_is_pad, subsequent_mask
from .positional import positional_encoding, positional_table
from .schedule import noam_lr

__all__ = [
    "PRESETS", "TransformerConfig", "make_src_mask", "make_tgt_mask", "padding_mask",
    "subsequent_mask", "start_is_pad", "padding_id", "positional_encoding", "positional_table", "noam_lr",
]
