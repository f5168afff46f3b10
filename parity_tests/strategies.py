"""Hypothesis strategies shared by the backends' property tests (one definition, both backends)."""
from hypothesis import strategies as st

from shared.batches import src_tgt
from shared import TransformerConfig


@st.composite
def variants(draw, d_model: int, tgt_vocab: int, pad_id: int = 0) -> dict:
    """The architecture-variant fields (docs/design.md, convention 15) for a config of width
    ``d_model``: every value the config accepts there (a layout or timescale that cannot represent
    an odd or tiny ``d_model`` is not drawn), ``head_dim`` excepted (`cases` draws it with the width)."""
    out = dict(activation=draw(st.sampled_from(["relu", "gelu", "swish"])),
               positional=draw(st.sampled_from(["sinusoidal", "learned"])),
               embed_scale=draw(st.booleans()),
               decoder_start_id=draw(st.sampled_from([None, pad_id]) | st.integers(0, tgt_vocab - 1)),
               mask_padding=draw(st.booleans()))
    if out["positional"] == "sinusoidal":
        even = d_model % 2 == 0
        out["pe_layout"] = draw(st.sampled_from(["interleaved", "halves"] if even else ["interleaved"]))
        out["pe_timescale"] = draw(st.sampled_from(["paper", "t2t"] if even and d_model >= 4
                                                   else ["paper"]))
        out["pe_offset"] = draw(st.integers(0, 5))
    return out


@st.composite
def cases(draw):
    """A small float64 config (heads, sizes, layers, norms, tying, the architecture variants) and a
    padded batch for it: ``(config, src, tgt, seed)``; padding patterns include all-padding rows."""
    n_heads = draw(st.sampled_from([1, 2, 3, 4]))
    style = draw(st.sampled_from(["standard", "annotated"]))
    d_k = draw(st.integers(2 if style == "annotated" and n_heads == 1 else 1, 4))
    # head_dim set: any width, no longer a multiple of n_heads (the TF tutorial's key_dim = d_model).
    head_dim = draw(st.none() | st.integers(1, 4))
    d_model = n_heads * d_k if head_dim is None else draw(st.integers(2, 12))
    share = draw(st.booleans())
    src_vocab = draw(st.integers(4, 12))
    tgt_vocab = src_vocab if share else draw(st.integers(4, 12))
    max_len = draw(st.integers(4, 10))
    config = TransformerConfig(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d_model, n_heads=n_heads, head_dim=head_dim,
        d_ff=draw(st.integers(1, 12)), n_encoder_layers=draw(st.integers(1, 2)),
        n_decoder_layers=draw(st.integers(1, 2)), dropout=0.1, max_len=max_len,
        norm_first=draw(st.booleans()), norm_style=style,
        norm_eps=draw(st.sampled_from([1e-6, 1e-3, 0.5])),
        final_norm=draw(st.sampled_from([None, True, False])), share_embeddings=share,
        tie_output=draw(st.booleans()), dtype="float64", **draw(variants(d_model, tgt_vocab)))
    batch = draw(st.integers(1, 3))
    src_len, tgt_len = draw(st.integers(1, max_len)), draw(st.integers(1, max_len))
    src_lengths = draw(st.lists(st.integers(0, src_len), min_size=batch, max_size=batch))
    tgt_lengths = draw(st.lists(st.integers(0, tgt_len), min_size=batch, max_size=batch))
    seed = draw(st.integers(0, 2**16))
    src, tgt = src_tgt(config, batch, src_len, tgt_len, seed, src_lengths, tgt_lengths)
    return config, src, tgt, seed
