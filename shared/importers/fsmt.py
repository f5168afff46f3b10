"""Hugging Face FSMT (fairseq's WMT19 models) -> ``(TransformerConfig, canonical weights)``.
NumPy + safetensors.

Reads what ``FSMTForConditionalGeneration.save_pretrained(DIR)`` writes (``config.json``,
``model.safetensors``), never a pickle. What transformers 5 computes, in the project's terms:

=================================  ==========================================================
FSMT (transformers)                project config
=================================  ==========================================================
post-norm layers, torch LayerNorm  ``norm_first=False``, ``final_norm=False``,
(eps 1e-5, not configurable)       ``norm_style="standard"``, ``norm_eps=1e-5``
fairseq's sinusoidal table:        ``pe_layout="halves"``, ``pe_timescale="t2t"``,
``[sin | cos]``, tensor2tensor      ``pe_offset=pad_token_id + 1``
frequencies, first position pad+1
``src_vocab_size``,                ``src_vocab``, ``tgt_vocab`` (separate tables)
``tgt_vocab_size``
``tie_word_embeddings``            ``share_embeddings`` and ``tie_output`` (transformers ties
                                   the encoder table and the output projection to the decoder's
                                   table; needs equal vocabularies)
``decoder.output_projection``      ``generator.kernel``; ``generator.bias`` is zero (FSMT has
(no bias)                          no output bias)
``decoder_start_token_id`` (eos)   ``decoder_start_id`` (None when it equals ``bos_token_id``;
                                   refused when it is pad: see below)
``pad/bos/eos_token_id``           ``pad_id``, ``bos_id``, ``eos_id``
``scale_embedding``                ``embed_scale``
``activation_function``            ``activation`` (relu, gelu, swish/silu)
``max_position_embeddings``        ``max_len``
=================================  ==========================================================

The stored tables (``model.{encoder,decoder}.embed_positions.weight``, ``max_position_embeddings
+ pad_token_id + 1`` rows) are checked and never imported: row ``r`` is position ``r``, row
``pad_token_id`` is zero.

**Positions skip padding.** fairseq numbers the tokens of a row by a running count of its non-pad
tokens (``make_positions``: ``cumsum(ids != pad) * (ids != pad) + pad``), and a pad token gets the
zero row. The project numbers positions by index. The two agree exactly on every real token of a
**right-padded** row (all padding after the last real token), which is what tokenizers produce for
the source and what a decoder sees; they differ
* at the padding positions themselves (a zero table row there, the table row of the index here):
  padding is never attended to in either, so only the outputs *at* padded target positions differ
  (the loss ignores them);
* for every token after a **left or inner** pad, which fairseq shifts and the project does not.
  The project cannot express that (its positions are indices): such batches are not supported.
  A target that starts with pad is one of them, so ``decoder_start_token_id == pad_token_id`` is
  refused (found by random configurations against transformers: logits 0.2 to 1.4 of their scale
  off).

Inputs: transformers masks the source only when given ``attention_mask`` (pass ``src != pad``),
and the decoder's padding keys by default; call the forward with ``use_cache=False`` for a full
target (with the cache on, transformers 5 builds no causal mask for it). An all-padding source row
attends uniformly there (``masked_fill`` with ``finfo.min``) and has zero attention here
(docs/design.md, convention 3); a boolean mask cannot express it. The tokenizer ends every source
with EOS, so it never produces such a row.

**Which transformers.** The import follows FSMT's forward pass (fairseq's computation), which
transformers 5.17 and 5.23 compute alike (the float32 logits of the uncached forward agree with
this import in both). Their cached decoding differs: up to 5.17 (and by its source back to 5.0.0),
a decoding step with ``past_key_values`` embeds the positions of the tokens it is given, one new
token, as if they started the sequence (``embed_positions(input_ids)``, the cache's length
ignored), so every generated token is decoded at the first position; ``generate()`` there is not
FSMT's own forward pass (the suite with 5.17: greedy tokens differ on 47 of 72, float64 cached
logits by up to 0.97). transformers 5.18 passes ``past_key_values_length`` and agrees with the
forward pass (5.23: to 3e-16). The import does not reproduce the old behaviour; the interop tests
compare against ``generate()`` and cached logits only on transformers >= 5.18 and skip there,
naming the versions, before it (parity_tests/hf_models.py, `test_cached_decoding_is_the_forward_pass`).
"""
from __future__ import annotations

import numpy as np

from ..config import TransformerConfig
from .common import ExpectedTable, ImporterError, Renames, SourceImport, n_heads_problem
from .hf import Settings, activation, bart_layers, not_pad, read_pretrained, tied_copy, token_id

# FSMTConfig's defaults (transformers 5): what from_pretrained uses for an absent key.
DEFAULTS = {
    "src_vocab_size": 42024, "tgt_vocab_size": 42024, "activation_function": "relu", "d_model": 1024,
    "max_position_embeddings": 1024, "encoder_ffn_dim": 4096, "encoder_layers": 12,
    "encoder_attention_heads": 16, "decoder_ffn_dim": 4096, "decoder_layers": 12,
    "decoder_attention_heads": 16, "dropout": 0.1, "decoder_start_token_id": 2,
    "scale_embedding": True, "tie_word_embeddings": False, "pad_token_id": 1, "bos_token_id": 0,
    "eos_token_id": 2,
}
IGNORED_HERE = ("langs",)  # the tokenizer's languages
POSITIONS = ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight")


def from_fsmt(path, *, dtype=None, rename: Renames = None, allow_nonfinite: bool = False
              ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import an ``FSMTForConditionalGeneration.save_pretrained`` directory (module docstring:
    the map, and the inputs on which the two compute the same: right-padded ones).

    Args:
        path: the directory (``config.json`` + ``model.safetensors``).
        dtype: ``"float32"``/``"float64"`` to cast to; default the file's dtype.
        rename: source key prefixes to map first, ``{OLD: NEW}``.
        allow_nonfinite: import NaN/Inf values instead of refusing them.

    Returns:
        ``(config, weights)``; ``weights`` follows `shared.weights.weight_schema(config)`.

    Raises:
        FileNotFoundError: no such path.
        ImporterError: every problem found (files, settings, keys, shapes), naming each.
    """
    source = f"from_fsmt({str(path)!r})"
    hf, state_dict = read_pretrained(path, "fsmt", source)
    imp = SourceImport(source, state_dict, dtype, allow_nonfinite, rename, buffers=POSITIONS)
    s = Settings(hf, "config.json", DEFAULTS, imp)
    s.used.update(IGNORED_HERE)
    d, n_enc, n_dec = s.integer("d_model"), s.integer("encoder_layers"), s.integer("decoder_layers")
    for alias, key in (("hidden_size", "d_model"), ("num_hidden_layers", "encoder_layers"),
                       ("num_attention_heads", "encoder_attention_heads"), ("vocab_size", "tgt_vocab_size")):
        if alias in hf:
            s.same(alias, key, "transformers' alias")
    n_heads = s.same_integer("decoder_attention_heads", "encoder_attention_heads",
                             "the project has one head count for both stacks")
    d_ff = s.same_integer("decoder_ffn_dim", "encoder_ffn_dim", "the project has one d_ff for both stacks")
    if (text := n_heads_problem(n_heads, d)) is not None and n_heads is not None:
        s.problem("encoder_attention_heads", text)
    src_vocab, tgt_vocab = s.integer("src_vocab_size"), s.integer("tgt_vocab_size")
    tie = s.flag("tie_word_embeddings")
    if tie and src_vocab != tgt_vocab:
        s.problem("tie_word_embeddings", f"expected false with src_vocab_size={src_vocab} != "
                  f"tgt_vocab_size={tgt_vocab} (transformers would tie tables of two sizes)")
    max_len = s.integer("max_position_embeddings")
    pad_id = token_id(s, "pad_token_id", min(src_vocab or 0, tgt_vocab or 0) or None)
    bos_id = token_id(s, "bos_token_id", tgt_vocab)
    eos_id = token_id(s, "eos_token_id", tgt_vocab)
    start = token_id(s, "decoder_start_token_id", tgt_vocab)
    # fairseq counts non-pad tokens for positions: a pad start token would take the zero table
    # row and be masked as a key, and every later target token would sit one position earlier
    # than its index, which the project's index positions cannot express.
    not_pad(s, "decoder_start_token_id", start, pad_id, "fairseq positions skip pad tokens: a pad "
            "start token would shift every target position by one")
    act, scale, dropout = activation(s), s.flag("scale_embedding"), s.get("dropout")
    s.leftovers()
    if None in (d, n_enc, n_dec, d_ff, src_vocab, tgt_vocab, tie, max_len, pad_id):
        raise ImporterError(source, imp.problems)

    table = ExpectedTable(layout="halves", timescale="t2t", zero_row=pad_id, extra_rows=pad_id + 1,
                          describe=f"fairseq's sinusoidal table ([sin | cos], tensor2tensor "
                                   f"frequencies, row r = position r, row {pad_id} (pad) zero)")
    max_len = imp.positional(list(POSITIONS), max_len, d, table)
    if tie:
        imp.expect("model.decoder.embed_tokens.weight", (tgt_vocab, d), ("src_embed.embeddings", np.asarray))
        for key in ("model.encoder.embed_tokens.weight", "model.decoder.output_projection.weight"):
            tied_copy(imp, key, "model.decoder.embed_tokens.weight", "tie_word_embeddings")
    else:
        imp.expect("model.encoder.embed_tokens.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
        imp.expect("model.decoder.embed_tokens.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
        imp.expect("model.decoder.output_projection.weight", (tgt_vocab, d),
                   ("generator.kernel", np.transpose),
                   ("generator.bias", lambda a: np.zeros(a.shape[0], a.dtype)))
    bart_layers(imp, "model.encoder", "model.decoder", n_enc, n_dec, d, d_ff)
    imp.check_keys("hint: only bias keys are missing: FSMT layers always have biases")
    if tie:  # no output projection of its own: the zero bias comes from the tied table's size
        imp.outputs["model.decoder.embed_tokens.weight"].append(
            ("generator.bias", lambda a: np.zeros(a.shape[0], a.dtype)))
    config = imp.config(
        s.sources(src_vocab="src_vocab_size", tgt_vocab="tgt_vocab_size"),
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=False, norm_style="standard", norm_eps=1e-5, final_norm=False,
        share_embeddings=tie, tie_output=tie, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
        dtype=imp.dtype, activation=act, positional="sinusoidal", pe_layout="halves",
        pe_timescale="t2t", pe_offset=pad_id + 1, embed_scale=scale,
        decoder_start_id=None if start == bos_id else start)
    return imp.finish(config)
