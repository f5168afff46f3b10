"""Real transformers models (Marian, FSMT) with random weights, for the interop tests.

Built with the installed transformers (never an imitation of it): every tensor the model computes
with is redrawn (`randomize_`), so a swapped, transposed or ignored tensor shows in the logits.
The positional tables are not weights: transformers builds them through float32, and
`exact_tables_` puts the float64 ones in, as a float64 source must hold for a 1e-12 comparison.
"""
from __future__ import annotations

import numpy as np
import torch

from shared.positional import positional_encoding

TORCH_DTYPES = {"float32": torch.float32, "float64": torch.float64}

# The first transformers whose FSMT decodes with a cache at the right positions. Before it (5.17 and,
# by their source, the 5.x releases back to 5.0.0), a cached step embeds the position of the token
# it is given as if it were the first one (``embed_positions(input_ids)`` of the one new token, the
# cache's length ignored), so ``generate()`` and cached logits are not FSMT's forward pass
# (shared/importers/fsmt.py, "Which transformers"); 5.18 passes ``past_key_values_length``.
FSMT_CACHED_POSITIONS_FIXED = (5, 18)


def fsmt_cache_is_exact() -> bool:
    """Whether the installed transformers decodes FSMT with a cache at the right positions."""
    import transformers
    from packaging.version import Version
    return Version(transformers.__version__).release[:2] >= FSMT_CACHED_POSITIONS_FIXED


def require_exact_fsmt_cache(model) -> None:
    """Skip the calling test when ``model`` is an FSMT whose cached decoding is wrong (see
    `FSMT_CACHED_POSITIONS_FIXED`): its ``generate()`` is no oracle for the project's decoding."""
    if model.config.model_type == "fsmt" and not fsmt_cache_is_exact():
        import pytest
        import transformers
        fixed = ".".join(map(str, FSMT_CACHED_POSITIONS_FIXED))
        pytest.skip(f"transformers {transformers.__version__} < {fixed}: its FSMT embeds every cached "
                    "decoding step at the first position, so generate() and cached logits are not "
                    "FSMT's forward pass")


def randomize_(model: torch.nn.Module, seed: int) -> torch.nn.Module:
    """Redraw every parameter and ``final_logits_bias`` (a buffer) from normal distributions:
    matrices N(0, 1/fan_in) (embeddings N(0, 1/d)), layer-norm gains 1 + N(0, 0.2^2), every other
    vector (biases, norm offsets, the logits bias) N(0, 0.2^2). Positional tables are left alone."""
    g = torch.Generator().manual_seed(seed)
    tensors = dict(model.named_parameters())
    tensors.update({n: b for n, b in model.named_buffers() if n.endswith("final_logits_bias")})
    with torch.no_grad():
        for name, t in tensors.items():
            if "embed_positions" in name:
                continue
            values = torch.randn(t.shape, generator=g, dtype=torch.float64)
            if t.dim() == 2 and "final_logits_bias" not in name:
                values /= np.sqrt(t.shape[1])
            elif "layer_norm" in name and name.endswith("weight"):
                values = 1.0 + 0.2 * values
            else:
                values *= 0.2
            t.copy_(values.to(t.dtype))
    return model


def marian_table(rows: int, d: int) -> np.ndarray:
    return positional_encoding(rows, d, "halves", "paper")


def fsmt_table(rows: int, d: int, pad_id: int) -> np.ndarray:
    table = positional_encoding(rows, d, "halves", "t2t")
    table[pad_id] = 0.0
    return table


def exact_tables_(model, family: str) -> None:
    """Replace the positional tables by the float64 ones (cast to the model's dtype)."""
    core = model.model
    for stack in (core.encoder, core.decoder):
        weight = stack.embed_positions.weight
        rows, d = weight.shape
        table = marian_table(rows, d) if family == "marian" else fsmt_table(rows, d, model.config.pad_token_id)
        with torch.no_grad():
            weight.copy_(torch.as_tensor(table, dtype=weight.dtype))


def make_marian(seed: int = 0, dtype: str = "float64", exact_tables: bool = True, **settings):
    from transformers import MarianConfig, MarianMTModel
    config = MarianConfig(**settings)
    model = MarianMTModel(config).to(TORCH_DTYPES[dtype])
    randomize_(model, seed)
    if exact_tables:
        exact_tables_(model, "marian")
    return model.eval()


def make_fsmt(seed: int = 0, dtype: str = "float64", exact_tables: bool = True, **settings):
    from transformers import FSMTConfig, FSMTForConditionalGeneration
    config = FSMTConfig(**settings)
    model = FSMTForConditionalGeneration(config).to(TORCH_DTYPES[dtype])
    randomize_(model, seed)
    if exact_tables:
        exact_tables_(model, "fsmt")
    return model.eval()


def target_mask(tgt: np.ndarray, pad_id: int, start_is_pad: bool) -> np.ndarray:
    """transformers' ``decoder_attention_mask`` for the project's target-mask rule (convention 2):
    padding keys masked, column 0 kept when it is the pad start token."""
    mask = tgt != pad_id
    if start_is_pad:
        mask[:, 0] = True
    return mask


def hf_logits(model, src: np.ndarray, tgt: np.ndarray, pad_id: int, start_is_pad: bool) -> np.ndarray:
    """The model's own forward pass, with the source and target masks of the project's inputs
    (``use_cache=False``: FSMT builds no causal mask for a full target with the cache on).

    A float64 FSMT cannot run that pass: transformers 5.23 builds its causal mask by filling a
    float32 tensor with float64's ``finfo.min`` (a RuntimeError); it runs through its cached
    decoding path instead (`hf_cached_logits`)."""
    if model.config.model_type == "fsmt" and model.dtype == torch.float64:
        return hf_cached_logits(model, src, tgt, pad_id)
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != pad_id),
                    decoder_input_ids=torch.as_tensor(tgt),
                    decoder_attention_mask=torch.as_tensor(target_mask(tgt, pad_id, start_is_pad)),
                    use_cache=False)
    return out.logits.numpy()


def hf_cached_logits(model, src: np.ndarray, tgt: np.ndarray, pad_id: int,
                     exact_only: bool = True) -> np.ndarray:
    """Teacher-forced logits through the cached path ``generate`` uses: one target token a call,
    the keys and values of the earlier ones from ``past_key_values``. No target padding mask is
    applied there, so targets must be right-padded (a real position then sees real keys only).
    ``exact_only``: skip where that path is wrong (`require_exact_fsmt_cache`)."""
    if exact_only:
        require_exact_fsmt_cache(model)
    steps = []
    with torch.no_grad():
        encoder = model.get_encoder()(input_ids=torch.as_tensor(src),
                                      attention_mask=torch.as_tensor(src != pad_id))
        past = None
        for t in range(tgt.shape[1]):
            out = model(attention_mask=torch.as_tensor(src != pad_id), encoder_outputs=encoder,
                        decoder_input_ids=torch.as_tensor(tgt[:, t:t + 1]), past_key_values=past,
                        use_cache=True)
            past = out.past_key_values
            steps.append(out.logits.numpy())
    return np.concatenate(steps, axis=1)


def hf_greedy(model, src: np.ndarray, max_new: int, pad_id: int) -> np.ndarray:
    """``generate(num_beams=1, do_sample=False)`` as the project decodes: pad never generated, no
    EOS forced at the limit; the tokens after the start column, padded to ``max_new`` columns.
    Skips where FSMT's cached decoding is wrong (`require_exact_fsmt_cache`)."""
    require_exact_fsmt_cache(model)
    with torch.no_grad():
        out = model.generate(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != pad_id),
                             num_beams=1, do_sample=False, max_new_tokens=max_new, min_new_tokens=0,
                             bad_words_ids=[[pad_id]], forced_eos_token_id=None).numpy()
    tokens = np.full((src.shape[0], max_new), pad_id, dtype=np.int64)
    tokens[:, : out.shape[1] - 1] = out[:, 1:]
    return tokens
