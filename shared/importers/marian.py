"""Hugging Face Marian (OPUS-MT) -> ``(TransformerConfig, canonical weights)``. NumPy + safetensors.

Reads what ``MarianMTModel.save_pretrained(DIR)`` writes (``config.json``, ``model.safetensors``),
never a pickle. What transformers 5 computes, in the project's terms:

=================================  ==========================================================
Marian (transformers)              project config
=================================  ==========================================================
post-norm layers, torch LayerNorm  ``norm_first=False``, ``final_norm=False``,
(eps 1e-5, not configurable)       ``norm_style="standard"``, ``norm_eps=1e-5``
sinusoidal table, ``[sin | cos]``, ``positional="sinusoidal"``, ``pe_layout="halves"``,
paper frequencies, positions from 0  ``pe_timescale="paper"``, ``pe_offset=0``
``activation_function``            ``activation``: relu, gelu (exact), swish/silu -> swish
``scale_embedding``                ``embed_scale``
``tie_word_embeddings`` and        ``share_embeddings`` / ``tie_output`` (below)
``share_encoder_decoder_embeddings``
``lm_head`` (no bias) +            ``generator.kernel`` (or the tied table) and
``final_logits_bias``              ``generator.bias``
``decoder_start_token_id`` (pad)   ``decoder_start_id`` (None when it equals ``bos_token_id``)
``pad_token_id``, ``eos_token_id`` ``pad_id``, ``eos_id``
``bos_token_id`` (often absent)    ``bos_id``; Marian has no BOS, so when it is absent (or pad)
                                   ``bos_id = eos_id``: it only names the default start token,
                                   which ``decoder_start_id`` overrides
``max_position_embeddings``        ``max_len``
``dropout``                        ``dropout`` (``attention_dropout`` and ``activation_dropout``
                                   change training only, and are not carried)
=================================  ==========================================================

Tying, as transformers 5 does it: ``tie_word_embeddings=true`` ties the output projection to the
decoder's table and, with ``share_encoder_decoder_embeddings``, both tables to ``model.shared``
(one tensor: ``share_embeddings=True, tie_output=True``); ``tie_word_embeddings=false`` ties
nothing, whatever ``share_encoder_decoder_embeddings`` says: the encoder and decoder then embed
with their own ``embed_tokens`` (``model.shared``, when present, is never used and is not imported).

The positional tables are not saved by transformers (``_keys_to_ignore_on_save``); when a file
holds them (older saves, and this project's exports) they are checked and never imported. Note
that transformers builds them through float32 even in a float64 model (``torch.FloatTensor``), so
a float64 Marian computes with float32-rounded positions unless its file holds exact ones.

Differences in the inputs, not the model: transformers attends to every source position unless
given ``attention_mask`` (a tokenizer passes ``src != pad``: the project's source mask), and to
every earlier target position unless given ``decoder_attention_mask`` (the project masks target
padding, column 0 excepted when it is the pad start token). An all-padding source row depends on
transformers' attention implementation: ``"sdpa"`` (its default on CPU) gives that row a zero
context, as this project does (docs/design.md, convention 3; measured with torch 2.13), while
``"eager"`` adds ``finfo.min`` to every score of the row, which then attends *uniformly* to its
padding. A boolean mask cannot express a uniform row, so the eager result cannot be reproduced
here. Marian's tokenizer ends every source with EOS, so it never produces such a row.
"""
from __future__ import annotations

import numpy as np

from ..config import TransformerConfig
from .common import ExpectedTable, ImporterError, Renames, SourceImport, n_heads_problem
from .hf import Settings, activation, bart_layers, not_pad, read_pretrained, tied_copy, token_id

# MarianConfig's defaults (transformers 5): what from_pretrained uses for an absent key.
DEFAULTS = {
    "vocab_size": 58101, "decoder_vocab_size": None, "max_position_embeddings": 1024,
    "encoder_layers": 12, "encoder_ffn_dim": 4096, "encoder_attention_heads": 16,
    "decoder_layers": 12, "decoder_ffn_dim": 4096, "decoder_attention_heads": 16,
    "activation_function": "gelu", "d_model": 1024, "dropout": 0.1, "decoder_start_token_id": 58100,
    "scale_embedding": False, "pad_token_id": 58100, "eos_token_id": 0, "bos_token_id": None,
    "share_encoder_decoder_embeddings": True, "tie_word_embeddings": True,
}
# Keys of transformers 4's BART-derived MarianConfig that transformers 5 no longer reads: accepted
# with the value Marian always computed, refused with any other.
LEGACY = {"normalize_before": False, "add_final_layer_norm": False, "normalize_embedding": False,
          "static_position_embeddings": True, "add_bias_logits": False}
TABLE = ExpectedTable(layout="halves", describe="Marian's sinusoidal table ([sin | cos] of "
                      "p / 10000^(2i/d), p from 0)")
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def from_marian(path, *, dtype=None, rename: Renames = None, allow_nonfinite: bool = False
                ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import a ``MarianMTModel.save_pretrained`` directory (see the module docstring for the map).

    Args:
        path: the directory (``config.json`` + ``model.safetensors``).
        dtype: ``"float32"``/``"float64"`` to cast to; default the file's dtype.
        rename: source key prefixes to map first, ``{OLD: NEW}`` (e.g. ``{"": "model."}`` for a
            file saved from ``MarianModel`` with the head's tensors added by hand).
        allow_nonfinite: import NaN/Inf values instead of refusing them.

    Returns:
        ``(config, weights)``; ``weights`` follows `shared.weights.weight_schema(config)`.

    Raises:
        FileNotFoundError: no such path.
        ImporterError: every problem found (files, settings, keys, shapes), naming each.
    """
    source = f"from_marian({str(path)!r})"
    hf, state_dict = read_pretrained(path, "marian", source)
    imp = SourceImport(source, state_dict, dtype, allow_nonfinite, rename, buffers=POSITIONS)
    s = Settings(hf, "config.json", DEFAULTS, imp)
    for key, value in LEGACY.items():
        s.fixed(key, value, "transformers 5 ignores it and computes this")
    d, n_enc, n_dec = s.integer("d_model"), s.integer("encoder_layers"), s.integer("decoder_layers")
    for alias, key in (("hidden_size", "d_model"), ("num_hidden_layers", "encoder_layers"),
                       ("num_attention_heads", "encoder_attention_heads")):
        if alias in hf:
            s.same(alias, key, "transformers' alias")
    n_heads = s.same_integer("decoder_attention_heads", "encoder_attention_heads",
                             "the project has one head count for both stacks")
    d_ff = s.same_integer("decoder_ffn_dim", "encoder_ffn_dim", "the project has one d_ff for both stacks")
    if (text := n_heads_problem(n_heads, d)) is not None and n_heads is not None:
        s.problem("encoder_attention_heads", text)
    src_vocab = s.integer("vocab_size")
    # absent or null: the source vocabulary's (MarianConfig's rule); else a positive int like it
    tgt_vocab = s.integer("decoder_vocab_size") if s.get("decoder_vocab_size") is not None else src_vocab
    share, tie = s.flag("share_encoder_decoder_embeddings"), s.flag("tie_word_embeddings")
    if share and tgt_vocab is not None and tgt_vocab != src_vocab:
        # transformers then sizes the decoder's table by one and the output layer by the other
        s.problem("decoder_vocab_size", f"expected vocab_size = {src_vocab} with "
                  f"share_encoder_decoder_embeddings, got {tgt_vocab}")
    max_len = s.integer("max_position_embeddings")
    pad_id = token_id(s, "pad_token_id", min(src_vocab or 0, tgt_vocab or 0) or None)
    eos_id = token_id(s, "eos_token_id", tgt_vocab)
    start = token_id(s, "decoder_start_token_id", tgt_vocab)
    not_pad(s, "eos_token_id", eos_id, pad_id)  # here, not as bos_id below, which copies it
    bos = s.get("bos_token_id")
    bos_id = bos if isinstance(bos, int) and not isinstance(bos, bool) and bos != pad_id else eos_id
    act, scale, dropout = activation(s), s.flag("scale_embedding"), s.get("dropout")
    s.leftovers()
    if None in (d, n_enc, n_dec, d_ff, src_vocab, tgt_vocab, share, tie, max_len):
        raise ImporterError(source, imp.problems)

    max_len = imp.positional(list(POSITIONS), max_len, d, TABLE)
    tied = bool(tie)  # transformers 5 ties tables only when tie_word_embeddings is true
    if share and tied:
        imp.expect("model.shared.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
        for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight", "lm_head.weight"):
            tied_copy(imp, key, "model.shared.weight", "tie_word_embeddings")
    else:
        imp.expect("model.encoder.embed_tokens.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
        imp.expect("model.decoder.embed_tokens.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
        if "model.shared.weight" in imp.sd:
            imp.ignored.add("model.shared.weight")  # a module transformers 5 builds but, untied, never uses
        if tied:
            tied_copy(imp, "lm_head.weight", "model.decoder.embed_tokens.weight", "tie_word_embeddings")
        else:
            imp.expect("lm_head.weight", (tgt_vocab, d), ("generator.kernel", np.transpose))
    imp.expect("final_logits_bias", (1, tgt_vocab), ("generator.bias", lambda a: a[0]))
    bart_layers(imp, "model.encoder", "model.decoder", n_enc, n_dec, d, d_ff)
    imp.check_keys("hint: only bias keys are missing: Marian layers always have biases")
    config = imp.config(
        s.sources(src_vocab="vocab_size", tgt_vocab="decoder_vocab_size"),
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=False, norm_style="standard", norm_eps=1e-5, final_norm=False,
        share_embeddings=bool(share and tied), tie_output=tied, pad_id=pad_id, bos_id=bos_id,
        eos_id=eos_id, dtype=imp.dtype, activation=act, positional="sinusoidal", pe_layout="halves",
        pe_timescale="paper", pe_offset=0, embed_scale=scale,
        decoder_start_id=None if start == bos_id else start)
    return imp.finish(config)
