"""The architecture variants of docs/design.md, convention 15, as small float64 configs: each new
field alone and every non-default value at once (two combinations, since learned positions exclude
the ``pe_*`` fields). Read by every module that runs the variants (test_variants_parity.py,
test_onnx.py); configs and weights are built once per (variant, dtype) and only read."""
import functools

from shared import TransformerConfig
from shared.weights import random_weights

BASE = TransformerConfig(src_vocab=11, tgt_vocab=13, d_model=8, n_heads=2, d_ff=12, n_encoder_layers=1,
                         n_decoder_layers=2, max_len=10, dropout=0.0, norm_first=True,
                         norm_style="standard", dtype="float64")
VARIANTS = {
    "gelu": dict(activation="gelu"),
    "swish": dict(activation="swish"),
    "learned": dict(positional="learned"),
    "halves": dict(pe_layout="halves"),
    "t2t": dict(pe_timescale="t2t"),
    "offset": dict(pe_offset=3),
    "unscaled": dict(embed_scale=False),
    "head-dim": dict(head_dim=5),
    "start-pad": dict(decoder_start_id=0),
    "start-eos": dict(decoder_start_id=2),
    "no-pad-mask": dict(mask_padding=False),  # KerasHub without mask_zero: padding is attended to
    # Every non-default value at once; d_model 10 is no multiple of n_heads 4 (head_dim 3 instead).
    "all-sinusoidal": dict(activation="swish", pe_layout="halves", pe_timescale="t2t", pe_offset=2,
                           embed_scale=False, head_dim=3, d_model=10, n_heads=4, decoder_start_id=0,
                           norm_first=False),
    "all-learned": dict(activation="gelu", positional="learned", embed_scale=False, head_dim=3,
                        d_model=10, n_heads=4, decoder_start_id=0, share_embeddings=True,
                        tgt_vocab=11, tie_output=True),
}
ALL = ["all-sinusoidal", "all-learned"]


@functools.lru_cache(maxsize=None)
def config(variant: str, dtype: str = "float64") -> TransformerConfig:
    return BASE.replace(dtype=dtype, **VARIANTS[variant])


@functools.lru_cache(maxsize=None)
def weights(variant: str, dtype: str = "float64") -> dict:
    return random_weights(config(variant, dtype), seed=sorted(VARIANTS).index(variant))
