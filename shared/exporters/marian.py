"""``(TransformerConfig, canonical weights)`` -> a Hugging Face Marian directory. NumPy + safetensors.

Writes ``config.json``, ``generation_config.json`` and ``model.safetensors`` such that
``transformers.MarianMTModel.from_pretrained(DIR)`` loads every tensor it has (no missing, no
unused key) and computes the project's logits. The inverse of `shared.importers.from_marian`:
project -> Marian -> project gives back every tensor byte for byte, and the same config.

What Marian cannot express is refused, each setting named (`marian_problems`): transformers'
Marian layers are post-norm with torch's LayerNorm at eps 1e-5 (not configurable), add the
``[sin | cos]`` table of the paper's frequencies from position 0, have heads of ``d_model /
n_heads`` and no final norms. Everything else maps (the importer's table, read backwards):

* the activation (relu, gelu, swish), ``embed_scale`` (``scale_embedding``), the special ids,
  ``start_id`` (``decoder_start_token_id``), ``max_len`` (``max_position_embeddings``), ``dropout``
  (also written as ``attention_dropout`` and ``activation_dropout``: the project drops out at all
  three sites with one rate);
* ``generator.bias`` -> ``final_logits_bias``; the generator kernel -> ``lm_head.weight``, or
  tied (``tie_word_embeddings``);
* ``share_embeddings`` with ``tie_output`` -> one ``model.shared`` table. transformers 5 shares
  tables only together with the output projection, so shared embeddings with an untied generator
  are written as two equal tables (``share_encoder_decoder_embeddings=false``): the same function,
  which re-imports as two tables (the one case whose round trip is not the identity);
* the positional tables are written too (``model.{encoder,decoder}.embed_positions.weight``,
  the project's table in the model's dtype): transformers would otherwise rebuild them through
  float32, which a float64 model must not.

``generation_config.json`` makes ``generate`` decode greedily as the project does: no forced EOS
at the length limit, and pad never generated (``bad_words_ids``); beam search as the project's also
takes ``length_penalty=0.0`` at the call (`generation_config`).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ..checks import check_config
from ..config import TransformerConfig
from ..paths import check_path
from ..positional import positional_table
from ..saving import replace_directory, umask
from ..weights import PROJECTIONS, check_weights, tgt_embedding_name
from .common import ExportError, check_replaceable

FILES = {"config.json", "generation_config.json", "model.safetensors"}
NORM_EPS = 1e-5  # torch nn.LayerNorm's default, which MarianConfig cannot change


def marian_problems(config: TransformerConfig) -> list[str]:
    """Every setting of ``config`` that transformers' Marian cannot compute, each with the reason."""
    problems = []

    def refuse(field: str, expected: str, why: str) -> None:
        problems.append(f"{field}: expected {expected} ({why}), got {getattr(config, field)!r}")

    if config.norm_style != "standard":
        refuse("norm_style", "'standard'", "Marian's layer norm is torch's, with the biased variance")
    if config.norm_eps != NORM_EPS:
        refuse("norm_eps", f"{NORM_EPS}", "Marian's nn.LayerNorm uses torch's default eps; "
               "MarianConfig has no setting for it")
    if not config.mask_padding:
        refuse("mask_padding", "True", "Marian masks the source's pad tokens; MarianConfig has no "
               "setting to attend them")
    if config.norm_first:
        refuse("norm_first", "False", "Marian's layers are post-norm")
    if config.final_norm:
        refuse("final_norm", "False", "Marian has no layer norm after each stack")
    if config.positional != "sinusoidal":
        refuse("positional", "'sinusoidal'", "Marian adds a fixed sinusoidal table, not learned weights")
    else:
        if config.pe_layout != "halves":
            refuse("pe_layout", "'halves'", "Marian's table is [sin | cos]")
        if config.pe_timescale != "paper":
            refuse("pe_timescale", "'paper'", "Marian's frequencies are 10000^(-2i/d)")
        if config.pe_offset != 0:
            refuse("pe_offset", "0", "Marian's positions start at 0")
    if config.head_dim is not None and config.head_dim * config.n_heads != config.d_model:
        refuse("head_dim", f"None or d_model / n_heads = {config.d_model / config.n_heads:g}",
               "Marian's heads split d_model")
    return problems


def marian_config(config: TransformerConfig) -> dict:
    """The ``config.json`` of the Marian model that computes ``config``."""
    shared = config.share_embeddings and config.tie_output  # one table (module docstring)
    return {
        "model_type": "marian", "architectures": ["MarianMTModel"], "is_encoder_decoder": True,
        "vocab_size": config.src_vocab, "decoder_vocab_size": config.tgt_vocab,
        "d_model": config.d_model, "encoder_layers": config.n_encoder_layers,
        "decoder_layers": config.n_decoder_layers, "encoder_attention_heads": config.n_heads,
        "decoder_attention_heads": config.n_heads, "encoder_ffn_dim": config.d_ff,
        "decoder_ffn_dim": config.d_ff, "activation_function": config.activation,
        "max_position_embeddings": config.max_len, "scale_embedding": config.embed_scale,
        "share_encoder_decoder_embeddings": shared, "tie_word_embeddings": config.tie_output,
        "pad_token_id": config.pad_id, "eos_token_id": config.eos_id, "bos_token_id": config.bos_id,
        "decoder_start_token_id": config.start_id, "forced_eos_token_id": None,
        "dropout": config.dropout, "attention_dropout": config.dropout,
        "activation_dropout": config.dropout, "dtype": config.dtype,
    }


def generation_config(config: TransformerConfig) -> dict:
    """Greedy decoding in transformers as in the project: start token, EOS, pad never generated, no
    EOS forced at the length limit.

    Beam search as the project's default (GNMT alpha 0, hypotheses ranked by their log-probability)
    also needs ``length_penalty=0.0`` at the call: transformers' default 1.0 divides by the length.
    It is not written here: with ``num_beams`` unset, transformers 5.17 to 5.22 refuse to
    ``save_pretrained`` a generation config that holds a ``length_penalty`` other than 1.0, so a
    loaded export could not be saved again. Another alpha has no transformers equivalent."""
    return {"decoder_start_token_id": config.start_id, "bos_token_id": config.bos_id,
            "eos_token_id": config.eos_id, "pad_token_id": config.pad_id,
            "forced_eos_token_id": None, "bad_words_ids": [[config.pad_id]]}


def marian_tensors(config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The ``model.safetensors`` tensors: torch layout (Linear weights ``(out, in)``), contiguous."""
    out: dict[str, np.ndarray] = {}
    short = dict(zip(PROJECTIONS, ("q_proj", "k_proj", "v_proj", "out_proj")))

    def linear(src: str, dst: str) -> None:
        out[f"{dst}.weight"] = weights[f"{src}.kernel"].T  # (in, out) -> torch's (out, in)
        out[f"{dst}.bias"] = weights[f"{src}.bias"]

    def norm(src: str, dst: str) -> None:
        out[f"{dst}.weight"], out[f"{dst}.bias"] = weights[f"{src}.gamma"], weights[f"{src}.beta"]

    def layer(stack: str, i: int, sublayers: tuple[tuple[str, str], ...]) -> None:
        s, t = f"{stack}.layers.{i}", f"model.{stack}.layers.{i}"
        for ours, theirs in sublayers:
            for p in PROJECTIONS:
                linear(f"{s}.{ours}.{p}", f"{t}.{theirs}.{short[p]}")
            norm(f"{s}.{ours}_norm", f"{t}.{theirs}_layer_norm")
        linear(f"{s}.ffn.inner", f"{t}.fc1")
        linear(f"{s}.ffn.outer", f"{t}.fc2")
        norm(f"{s}.ffn_norm", f"{t}.final_layer_norm")

    if config.share_embeddings and config.tie_output:
        out["model.shared.weight"] = weights["src_embed.embeddings"]
    else:
        out["model.encoder.embed_tokens.weight"] = weights["src_embed.embeddings"]
        out["model.decoder.embed_tokens.weight"] = weights[tgt_embedding_name(config)]
        if not config.tie_output:
            out["lm_head.weight"] = weights["generator.kernel"].T
    out["final_logits_bias"] = weights["generator.bias"][None, :]  # (1, tgt_vocab)
    table = positional_table(config).astype(config.dtype)
    out["model.encoder.embed_positions.weight"] = table
    out["model.decoder.embed_positions.weight"] = table
    for i in range(config.n_encoder_layers):
        layer("encoder", i, (("self_attn", "self_attn"),))
    for i in range(config.n_decoder_layers):
        layer("decoder", i, (("self_attn", "self_attn"), ("cross_attn", "encoder_attn")))
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def to_marian(path, config: TransformerConfig, weights: Mapping[str, np.ndarray]) -> Path:
    """Write the Marian directory ``path`` computing ``(config, weights)``, crash-safely.

    Raises:
        ExportError: every setting Marian cannot express (nothing is written).
        WeightsError: weights that do not fit ``config`` (or are not finite).
        FileExistsError: ``path`` exists and is not an earlier export (only `FILES`).
    """
    from safetensors.numpy import save_file

    check_path(path)
    check_config(config)
    problems = marian_problems(config)
    if problems:
        raise ExportError(f"to_marian({str(path)!r})", problems)
    weights = check_weights(config, weights, source="to_marian: weights")
    path = Path(path)
    # Not a neutral checkpoint or an ONNX export (format_version), nor a Marian model transformers
    # saved (save_pretrained writes transformers_version; this export does not): the same three
    # files, a user's model, which a replace would delete
    check_replaceable(path, FILES, "a Marian export", lambda c: c.get("model_type") == "marian"
                      and "format_version" not in c and "transformers_version" not in c)
    tensors = marian_tensors(config, weights)

    def fill(staging: Path) -> None:
        for name, content in (("config.json", marian_config(config)),
                              ("generation_config.json", generation_config(config))):
            (staging / name).write_text(json.dumps(content, indent=2, sort_keys=True) + "\n",
                                        encoding="utf-8")
        # transformers reads safetensors whose metadata says which framework wrote the layout
        save_file(tensors, str(staging / "model.safetensors"), metadata={"format": "pt"})
        os.chmod(staging / "model.safetensors", 0o666 & ~umask())  # safetensors writes it owner-only

    return replace_directory(path, fill)
