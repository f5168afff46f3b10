"""Export to CTranslate2: a model directory that ``ctranslate2.Translator(DIR)`` loads and runs as
this project's model (log-probs within `shared.tolerances` ``("float32", "ctranslate2:reference")``,
greedy tokens identical). NumPy at import; ``ctranslate2`` only inside `build_spec` / `to_ctranslate2`.

The model is described through CTranslate2's own Python spec API (``ctranslate2.specs``: a
``TransformerSpec`` of a ``TransformerEncoderSpec`` and a ``TransformerDecoderSpec``), every field
set from the config, none left to a CTranslate2 default that could differ:

=========================  =====================================================================
config                     CTranslate2
=========================  =====================================================================
``norm_first``             ``pre_norm`` of both stacks (a model variable ``*/pre_norm``)
``final_norm``             the stack's ``layer_norm``, present or not; CTranslate2 applies it after
                           the last layer in either placement, so post-norm + final norm
                           (``nn.Transformer``) works: the spec is built pre-norm (which declares
                           it) and ``pre_norm`` is then set to ``norm_first``
``norm_eps``               ``layer_norm_epsilon`` in config.json (float32 there; the default
                           would be 1e-5)
``norm_style="annotated"`` refused: CTranslate2's layer norm is the standard one
``mask_padding=False``     refused: CTranslate2 masks a batch's padding by length
``activation``             ``Activation.RELU`` / ``GELU`` (exact erf) / ``SWISH``
``embed_scale``            ``scale_embeddings`` (True: sqrt(d_model); False: none)
sinusoidal positions       ``position_encodings.encodings`` = `shared.positional.positional_table`
                           (layout, timescale and offset included; row p is position p); the
                           table CTranslate2 would build itself is another one
learned positions          the same variable, holding ``src_embed`` / ``tgt_embed.positions``
``max_len``                the rows of that table: a longer input is an error in CTranslate2 too
``head_dim``               ``head_dim`` of every attention layer
q/k/v/output               fused ``linear_0`` (q|k|v for self-attention; q, then k|v for cross),
                           ``linear_1`` / ``linear_2``, kernels transposed to ``(out, in)``
``share_embeddings``,      the same arrays in several variables; CTranslate2 stores one and
``tie_output``             aliases the others
``generator.bias``         ``decoder.projection.bias``
``decoder_start_id``       ``decoder_start_token`` (may be pad); ``bos_id``/``eos_id`` likewise
``dtype="float64"``        refused: CTranslate2 computes in float32 at most
=========================  =====================================================================

**Vocabularies: token = its id in decimal.** Entry ``i`` of the source and target vocabularies is
``str(i)``, so a model is called on ids: ``[[str(i) for i in row] for row in ids]``, and the
tokens it returns map back with ``int``. CTranslate2 needs an unknown token and appends one when the
vocabulary lacks it (an id past the model's outputs), so ``unk_token`` is pad's name: an unknown
string reads as pad, and ``disable_unk=True`` keeps pad from being generated, exactly this
project's rule (`shared.decoding`). `source_tokens`, `score` and `greedy` do the conversions.

**Where CTranslate2's semantics differ**, and the calls under which they coincide (`GREEDY`,
`SCORE`): it masks padding by length, not by ``pad_id``, so sources and targets carry no pad
(trailing pads are stripped; an inner pad is refused); it translates a source whose content is
empty by its rule (`ct2_skips`: ``[]``, ``[BOS]``, ``[EOS]``, ``[BOS, EOS]``, ``[EOS, x]``, ...)
as the empty hypothesis without running the model (refused here); by default it truncates inputs
at 1024 tokens (``max_input_length=0``), forbids EOS as the first token (``min_decoding_length=1``;
0 here), drops the EOS from results (``return_end_token``) and may generate pad (``disable_unk``).
``max_decoding_length`` counts new tokens with EOS, as ``max_len`` does here. ``score_batch``
prepends the start token and appends EOS: the log-probs of the target tokens, then of EOS.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from ..checks import check_config, too_long_message
from ..decoding_args import check_max_len
from ..config import TransformerConfig
from ..paths import check_path
from ..positional import positional_table
from ..saving import replace_directory
from .common import ExportError, check_replaceable
from ..weights import check_weights, tgt_embedding_name, tgt_positions_name

ACTIVATIONS = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}  # -> ctranslate2 Activation
MODEL_FILES = frozenset({"model.bin", "config.json", "shared_vocabulary.json",
                         "source_vocabulary.json", "target_vocabulary.json"})
# Options under which translate_batch / score_batch compute what this project's greedy decoding and
# log-probs do (module docstring). ``max_decoding_length`` is the caller's ``max_len``.
GREEDY = dict(beam_size=1, min_decoding_length=0, return_end_token=True, disable_unk=True,
              max_input_length=0)
SCORE = dict(max_input_length=0)


def refusals(config: TransformerConfig) -> list[str]:
    """The settings of ``config`` CTranslate2 cannot compute, each with the reason; [] if none."""
    out = []
    if config.norm_style != "standard":
        out.append(f"norm_style={config.norm_style!r}: CTranslate2's layer norm is the standard one, "
                   "(x - mean) / sqrt(var + eps) with the biased variance; the annotated "
                   "(x - mean) / (std + eps) with the unbiased std is another function")
    if not config.mask_padding:
        out.append("mask_padding=False: CTranslate2 masks a batch's padding by length, and this "
                   "model attends its pad tokens as ordinary ones; a source padded to a batch's "
                   "length would be another source")
    if config.dtype != "float32":
        out.append(f"dtype={config.dtype!r}: CTranslate2 stores and computes float32 at most (its "
                   "spec would cast float64 weights silently); convert a float32 copy: "
                   "config.replace(dtype='float32') and every weight .astype(numpy.float32)")
    return out


def token(i: int) -> str:
    """The vocabulary entry of id ``i``: the id in decimal."""
    return str(int(i))


def vocabulary(size: int) -> list[str]:
    return [token(i) for i in range(size)]


# -- the spec -------------------------------------------------------------------------------------
def _linear(spec, weights: Mapping[str, np.ndarray], *prefixes: str) -> None:
    """``spec.weight (out, in)`` / ``spec.bias`` from the canonical ``(in, out)`` kernels of
    ``prefixes``, fused along the output axis (CTranslate2's fused q|k|v projections)."""
    spec.weight = np.ascontiguousarray(np.concatenate([weights[f"{p}.kernel"] for p in prefixes], 1).T)
    spec.bias = np.concatenate([weights[f"{p}.bias"] for p in prefixes])


def _norm(spec, weights: Mapping[str, np.ndarray], prefix: str) -> None:
    spec.gamma = weights[f"{prefix}.gamma"]
    spec.beta = weights[f"{prefix}.beta"]


def _attention(spec, weights, prefix: str, norm: str, self_attention: bool) -> None:
    if self_attention:  # linear_0 = q|k|v, linear_1 = output
        _linear(spec.linear[0], weights, *(f"{prefix}.{p}" for p in ("query", "key", "value")))
    else:  # linear_0 = q (on the decoder state), linear_1 = k|v (on the memory), linear_2 = output
        _linear(spec.linear[0], weights, f"{prefix}.query")
        _linear(spec.linear[1], weights, f"{prefix}.key", f"{prefix}.value")
    _linear(spec.linear[-1], weights, f"{prefix}.output")
    _norm(spec.layer_norm, weights, norm)


def _ffn(spec, weights, prefix: str) -> None:
    _linear(spec.linear_0, weights, f"{prefix}.ffn.inner")
    _linear(spec.linear_1, weights, f"{prefix}.ffn.outer")
    _norm(spec.layer_norm, weights, f"{prefix}.ffn_norm")


def _stack_common(spec, config: TransformerConfig, table: np.ndarray, positions: np.ndarray,
                  final_norm: str, weights) -> None:
    spec.pre_norm = config.norm_first  # built pre-norm (it declares the final norm), see docstring
    spec.scale_embeddings = config.embed_scale
    spec.position_encodings.encodings = np.ascontiguousarray(positions)  # row p = position p
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = table
    if config.final_norm:
        _norm(spec.layer_norm, weights, final_norm)


def build_spec(config: TransformerConfig, weights: Mapping[str, np.ndarray]):
    """A validated ``ctranslate2.specs.TransformerSpec`` holding ``weights`` (checked against
    ``config`` first); `ExportError` naming every setting CTranslate2 cannot compute."""
    check_config(config)  # before its fields are read (an AttributeError named nothing)
    problems = refusals(config)
    if problems:
        raise ExportError("to_ctranslate2: config", problems)
    w = check_weights(config, weights, source="to_ctranslate2: weights")
    from ctranslate2.specs import common_spec, transformer_spec

    activation = getattr(common_spec.Activation, ACTIVATIONS[config.activation])
    common = dict(pre_norm=True, no_final_norm=not config.final_norm, activation=activation,
                  head_dim=config.head_dim)
    encoder = transformer_spec.TransformerEncoderSpec(config.n_encoder_layers, config.n_heads, **common)
    decoder = transformer_spec.TransformerDecoderSpec(config.n_decoder_layers, config.n_heads, **common)
    if config.positional == "sinusoidal":
        src_pos = tgt_pos = positional_table(config).astype(np.float32)
    else:
        src_pos, tgt_pos = w["src_embed.positions"], w[tgt_positions_name(config)]
    tgt_table = w[tgt_embedding_name(config)]
    _stack_common(encoder, config, w["src_embed.embeddings"], src_pos, "encoder.final_norm", w)
    _stack_common(decoder, config, tgt_table, tgt_pos, "decoder.final_norm", w)
    for i, layer in enumerate(encoder.layer):
        p = f"encoder.layers.{i}"
        _attention(layer.self_attention, w, f"{p}.self_attn", f"{p}.self_attn_norm", True)
        _ffn(layer.ffn, w, p)
    for i, layer in enumerate(decoder.layer):
        p = f"decoder.layers.{i}"
        _attention(layer.self_attention, w, f"{p}.self_attn", f"{p}.self_attn_norm", True)
        _attention(layer.attention, w, f"{p}.cross_attn", f"{p}.cross_attn_norm", False)
        _ffn(layer.ffn, w, p)
    decoder.projection.weight = tgt_table if config.tie_output else np.ascontiguousarray(
        w["generator.kernel"].T)  # (tgt_vocab, d_model)
    decoder.projection.bias = w["generator.bias"]
    decoder.start_from_zero_embedding = False  # the start token is embedded like any other

    spec = transformer_spec.TransformerSpec(encoder, decoder)
    spec.register_source_vocabulary(vocabulary(config.src_vocab))
    spec.register_target_vocabulary(vocabulary(config.tgt_vocab))
    c = spec.config
    c.layer_norm_epsilon = float(config.norm_eps)
    c.bos_token, c.eos_token = token(config.bos_id), token(config.eos_id)
    c.decoder_start_token = token(config.start_id)
    c.unk_token = token(config.pad_id)  # see the module docstring: unknown reads as pad
    c.add_source_bos = c.add_source_eos = False
    spec.validate()
    spec.optimize(quantization=None)  # aliases shared tables; weights stay float32 as given
    return spec


def is_model_config(header) -> bool:
    """Whether ``header``, a parsed ``config.json``, is a CTranslate2 model's (what
    ``ModelSpec.save`` writes: the special tokens as strings, ``decoder_start_token``), not this
    project's (``format_version``) nor a transformers one (``model_type``): the directory holding
    it may be replaced by a new export (`check_replaceable`)."""
    return (isinstance(header, dict) and "decoder_start_token" in header
            and all(isinstance(header.get(k), str) for k in ("unk_token", "bos_token", "eos_token"))
            and "format_version" not in header and "model_type" not in header)


def to_ctranslate2(config: TransformerConfig, weights: Mapping[str, np.ndarray],
                   path: str | os.PathLike) -> Path:
    """Write the CTranslate2 model directory ``path`` (``model.bin``, ``config.json``, the
    vocabulary files), crash-safely: ``path`` is the old directory or the complete new one, and a
    failure (a refusal, CTranslate2's own) leaves nothing behind. An existing CTranslate2 model
    directory at ``path`` (only its files, its ``config.json`` a CTranslate2 one:
    `is_model_config`) is replaced; any other existing file or directory is refused
    (``FileExistsError``, nothing changed).
    Load it with ``ctranslate2.Translator(path, compute_type="float32")``; call it as `score` and
    `greedy` do (module docstring)."""
    check_path(path)
    check_config(config)
    path = Path(path)
    check_replaceable(path, MODEL_FILES, "a CTranslate2 model directory", is_model_config)
    spec = build_spec(config, weights)  # every refusal before anything is written
    return replace_directory(path, lambda staging: spec.save(str(staging)))


# -- calling the exported model on ids ------------------------------------------------------------
def ct2_skips(config: TransformerConfig, row: Sequence[int]) -> bool:
    """True when CTranslate2 returns the empty hypothesis for source ``row`` without running the
    model: no content once a leading BOS and a trailing EOS (or an EOS before a last token, a
    language code) are discounted (its ``get_source_length``). Its length is a ``size_t``: a
    count below 0 (``[bos, eos, x]`` with BOS equal to EOS) wraps to a huge one, and that row
    runs; only a count of exactly 0 is skipped."""
    n = len(row)
    if n == 1:
        n -= row[0] in (config.bos_id, config.eos_id)
    elif n >= 2:
        n -= row[0] == config.bos_id
        n -= 1 if row[-1] == config.eos_id else 2 if row[-2] == config.eos_id else 0
    return n == 0


def _unpadded(config: TransformerConfig, row: list[int]) -> list[int]:
    """``row`` without its trailing pads (CTranslate2 masks padding by length)."""
    end = len(row)
    while end and row[end - 1] == config.pad_id:
        end -= 1
    return row[:end]


def skipped_rows(config: TransformerConfig, src) -> list[int]:
    """The rows of ``src`` (B, S), padded at the end, that CTranslate2 would not run (`ct2_skips`)."""
    return [b for b, row in enumerate(np.asarray(src).tolist()) if ct2_skips(config, _unpadded(config, row))]


def _rows(config: TransformerConfig, ids, name: str, vocab: int, source: bool) -> list[list[int]]:
    """Rows of ``ids`` (B, L) with trailing pads removed; a pad inside a row (CTranslate2 would
    attend to it) and, for a source, a row CTranslate2 would not run (`ct2_skips`) are refused."""
    a = np.asarray(ids)
    if a.ndim != 2 or a.dtype.kind not in "iu":
        raise ValueError(f"{name}: expected integer ids of shape (batch, length), got "
                         f"{a.dtype} {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= vocab):
        raise ValueError(f"{name}: expected ids in [0, {vocab}), got {a.min()}..{a.max()}")
    # else CTranslate2's "No position encodings are defined for positions >= ..."
    if source and a.shape[1] > config.max_len:
        raise ValueError(too_long_message(name, config.max_len, a.shape[1]))
    if not source and a.shape[1] >= config.max_len:  # fed after the start token
        raise ValueError(f"{name}: expected at most config.max_len - 1 = {config.max_len - 1} tokens "
                         f"(they follow the start token), got {a.shape[1]}")
    rows = []
    for b, row in enumerate(a.tolist()):
        row = _unpadded(config, row)
        if config.pad_id in row:
            raise ValueError(f"{name}[{b}]: pad_id={config.pad_id} before the end of the row; "
                             "CTranslate2 masks padding by length only, it would attend to it")
        if source and ct2_skips(config, row):
            raise ValueError(f"{name}[{b}]: {row} has no content by CTranslate2's rule (ct2_skips); "
                             "it returns the empty hypothesis without running the model")
        rows.append(row)
    return rows


def source_tokens(config: TransformerConfig, src) -> list[list[str]]:
    """``src`` (B, S) ids, padded at the end -> CTranslate2 source tokens (`_rows` refusals)."""
    return [[token(i) for i in row] for row in _rows(config, src, "src", config.src_vocab, True)]


def score(translator, config: TransformerConfig, src, tgt) -> np.ndarray:
    """Per-token log-probs from ``translator.score_batch``: ``tgt`` (B, T) target tokens without
    the start token, padded at the end -> (B, T + 1) float32: column t the log-prob of ``tgt[t]``
    given the tokens before it, then EOS's after the row's last token, 0 after that."""
    target = _rows(config, tgt, "tgt", config.tgt_vocab, False)
    results = translator.score_batch(source_tokens(config, src), [[token(i) for i in r] for r in target],
                                     **SCORE)
    out = np.zeros((len(target), np.shape(tgt)[1] + 1), np.float32)
    for b, result in enumerate(results):
        out[b, : len(result.log_probs)] = result.log_probs
    return out


def project_scores(logits_fn, config: TransformerConfig, src, tgt) -> np.ndarray:
    """What `score` returns, computed by this project: ``logits_fn(src, tgt_in)`` (any
    implementation's forward) teacher-forced from the start token on ``tgt`` + EOS; log-softmax in
    float64; (B, T + 1), 0 after EOS."""
    tgt = np.asarray(tgt)
    lengths = (tgt != config.pad_id).sum(1)
    full = np.concatenate([tgt, np.full((len(tgt), 1), config.pad_id)], 1)  # tokens, EOS, pad
    full[np.arange(len(tgt)), lengths] = config.eos_id
    tgt_in = np.concatenate([np.full((len(tgt), 1), config.start_id), full[:, :-1]], 1)
    logits = np.asarray(logits_fn(src, tgt_in), np.float64)
    z = logits - logits.max(-1, keepdims=True)
    lp = z - np.log(np.exp(z).sum(-1, keepdims=True))
    out = np.take_along_axis(lp, full[..., None], -1)[..., 0]
    out[np.arange(full.shape[1]) > lengths[:, None]] = 0.0
    return out


def greedy(translator, config: TransformerConfig, src, max_len: int) -> tuple[np.ndarray, np.ndarray]:
    """``translator.translate_batch`` under `GREEDY`, laid out as this project's greedy decoding:
    tokens (B, max_len) int64, EOS included, pad after; lengths (B,) generated tokens with EOS."""
    check_max_len(max_len, config.max_len)  # else CTranslate2's "No position encodings ..."
    results = translator.translate_batch(source_tokens(config, src), max_decoding_length=max_len,
                                         **GREEDY)
    tokens = np.full((len(results), max_len), config.pad_id, np.int64)
    lengths = np.zeros(len(results), np.int64)
    for b, result in enumerate(results):
        hyp = [int(t) for t in result.hypotheses[0]]
        tokens[b, : len(hyp)], lengths[b] = hyp, len(hyp)
    return tokens, lengths
