"""State dicts of two well-known PyTorch layouts -> ``(TransformerConfig, canonical weights)``.

NumPy only: the caller converts the state dict to ``{name: numpy array}`` first (for torch,
``{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}``).

An importer converts or refuses; it never guesses. Whatever decides the computation and is *not*
stored in a state dict (norm placement, layer-norm eps, activation, special token ids, head count) is
a keyword argument, and whatever *is* stored is checked: every key must be known and present with the
shape the inferred sizes imply, every tensor must be finite float of one dtype, and a positional
encoding buffer must be the interleaved table of `shared.positional`. All problems are reported
together in one `ImporterError`; nothing is returned partially.

A positional buffer is checked, not imported: the canonical model adds the exact float64 table. A
buffer built in float32 differs from it by float32 rounding (up to about 1e-7 * position), which is
below what a float32 model resolves; float64 parity needs a buffer built in float64. Its dtype may
differ from the weights' (a float32 model whose buffer was built in float64 is accepted).

An all-padding source row (a legal input) is where the sources and this project part:
convention 3 of docs/design.md gives its attention rows zero weights and a zero output. The
Annotated Transformer replaces masked scores by -1e9 (``masked_fill``), so such a row attends
*uniformly* to the padding positions (all its scores are equal); nn.Transformer's ``-inf`` gives
NaN outside its fused fast path. Neither is reproducible here: a boolean mask can allow or forbid
keys, and allowing them gives the softmax of the real scores, which is neither uniform nor NaN.
Every other row, and every row of a source with at least one real token, computes the same
function (`twins convert` prints this note for these sources).

Both importers keep a separate canonical copy of every source tensor (``share_embeddings`` and
``tie_output`` stay False): a source that ties, e.g., the generator to the target embedding holds
equal tensors under both names, and two equal copies compute identically.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import TransformerConfig
from ..weights import PROJECTIONS
from .common import ImporterError, Renames, SourceImport, n_heads_problem


# -- PyTorch nn.Transformer (the translation tutorial's Seq2SeqTransformer) -----------------------
def from_nn_transformer(state_dict: Mapping[str, np.ndarray], *, n_heads: int, norm_first: bool,
                        pad_id: int, bos_id: int, eos_id: int, norm_eps: float = 1e-5,
                        activation: str = "relu", max_len: int | None = None, dropout: float = 0.1,
                        dtype=None, allow_nonfinite: bool = False, rename: Renames = None
                        ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import the ``Seq2SeqTransformer`` of PyTorch's translation tutorial.

    Layout: ``transformer.*`` (an ``nn.Transformer``; ``batch_first`` is not in the weights and
    does not matter), ``src_tok_emb.embedding.weight`` / ``tgt_tok_emb.embedding.weight`` (token
    embeddings the model multiplies by ``sqrt(emb_size)``, as the canonical model does),
    ``positional_encoding.pos_embedding`` (the tutorial's interleaved table, ``(max_len, 1, d)``;
    ``(1, max_len, d)`` and ``(max_len, d)`` are accepted too) and ``generator.weight/bias``.

    Mapping: ``self_attn`` / ``multihead_attn`` -> ``self_attn`` / ``cross_attn``, their packed
    ``in_proj_weight/bias`` split in the order query, key, value, ``out_proj`` -> ``output``;
    ``linear1/linear2`` -> ``ffn.inner/outer``; encoder ``norm1/norm2`` -> ``self_attn_norm/ffn_norm``,
    decoder ``norm1/2/3`` -> ``self_attn_norm/cross_attn_norm/ffn_norm``; every Linear transposed
    from torch's (out, in) to (in, out). ``nn.Transformer`` always ends each stack with a layer norm
    (``transformer.encoder.norm``, ``transformer.decoder.norm``), in post-norm too: the config says
    ``final_norm=True`` for both placements. Layer norms are torch's: ``norm_style="standard"``.

    Args:
        state_dict: ``{name: numpy array}``, all float32 or all float64 (float16 with ``dtype``).
        n_heads: attention heads (not stored; must divide d_model).
        norm_first: the ``norm_first`` the model was built with (not stored; ``nn.Transformer``'s
            default is False, post-norm). Required: a wrong value loads silently and computes
            something else.
        pad_id, bos_id, eos_id: the special ids (the tutorial uses 1, 2, 3).
        norm_eps: ``layer_norm_eps`` (not stored); nn.Transformer's default 1e-5.
        activation: the FFN activation (not stored, cannot be detected from the weights):
            ``"relu"`` (nn.Transformer's default) or ``"gelu"`` (its exact, erf GELU); anything
            else is refused.
        max_len: needed only when the state dict holds no positional table (a non-persistent
            buffer); it declares that the model adds the interleaved sinusoidal encoding.
            With a table, defaults to its length and may not exceed it.
        dropout: recorded in the config for further training; not used in inference.
        dtype: ``"float32"``/``"float64"`` to cast to; default the source's dtype.
        allow_nonfinite: import NaN/Inf values instead of refusing them.
        rename: source key prefixes to map first, ``{OLD: NEW}`` (e.g. ``{"src_tok_emb.":
            "src_tok_emb.embedding."}`` for a tutorial whose ``TokenEmbedding`` subclasses
            ``nn.Embedding``); when keys are missing, the error lists unexpected keys that look
            like them and the prefixes that would map them.

    Bias-less models (``nn.Transformer(bias=False)``) are refused: their keys are missing.

    Returns:
        ``(config, weights)``; ``weights`` follows `shared.weights.weight_schema(config)`.

    Raises:
        ImporterError: every problem found, naming the keys.
    """
    imp = SourceImport("from_nn_transformer", state_dict, dtype, allow_nonfinite, rename,
                       buffers=["positional_encoding.pos_embedding"])
    if activation not in ("relu", "gelu"):  # nn.Transformer's two by name; its "gelu" is the exact one
        imp.problem(f"activation: expected 'relu' or 'gelu' (nn.Transformer's activations by name; a "
                    f"callable one is not in the state dict), got {activation!r}")
    if not isinstance(norm_first, bool):
        imp.problem(f"norm_first: expected a bool, got {norm_first!r}")
    enc, dec = "transformer.encoder", "transformer.decoder"
    d = imp.size("d_model", [("src_tok_emb.embedding.weight", 1), ("tgt_tok_emb.embedding.weight", 1),
                             (f"{enc}.norm.weight", 0), ("generator.weight", 1)])
    d_ff = imp.size("d_ff", [(f"{enc}.layers.0.linear1.weight", 0), (f"{dec}.layers.0.linear1.weight", 0)])
    src_vocab = imp.size("src_vocab", [("src_tok_emb.embedding.weight", 0)])
    tgt_vocab = imp.size("tgt_vocab", [("tgt_tok_emb.embedding.weight", 0), ("generator.weight", 0),
                                       ("generator.bias", 0)])
    n_enc, n_dec = imp.layer_count(f"{enc}.layers"), imp.layer_count(f"{dec}.layers")
    if (text := n_heads_problem(n_heads, d)) is not None:
        imp.problem(text)
    max_len = imp.positional(["positional_encoding.pos_embedding"], max_len, d)
    imp.hint_layout([
        (lambda k: ".sublayer." in k or ".linears." in k,
         "hint: these look like Annotated Transformer keys: use from_annotated"),
        (lambda k: k.startswith(("encoder.layers.", "decoder.layers.")) and k.endswith("in_proj_weight"),
         "hint: keys of a bare nn.Transformer: this layout expects it under 'transformer.' beside "
         "the embeddings and generator of the tutorial's Seq2SeqTransformer"),
    ])
    if None in (d, d_ff, src_vocab, tgt_vocab):
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        parts = [(slice(i * d, (i + 1) * d), p) for i, p in enumerate(PROJECTIONS[:3])]  # q, k, v rows
        imp.expect(f"{src}.in_proj_weight", (3 * d, d),
                   *[(f"{dst}.{p}.kernel", lambda a, s=s: a[s].T) for s, p in parts])
        imp.expect(f"{src}.in_proj_bias", (3 * d,),
                   *[(f"{dst}.{p}.bias", lambda a, s=s: a[s]) for s, p in parts])
        imp.linear(f"{src}.out_proj", f"{dst}.output", d, d)

    def ffn(src: str, dst: str) -> None:
        imp.linear(f"{src}.linear1", f"{dst}.inner", d, d_ff)
        imp.linear(f"{src}.linear2", f"{dst}.outer", d_ff, d)

    imp.expect("src_tok_emb.embedding.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
    imp.expect("tgt_tok_emb.embedding.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
    for i in range(n_enc):
        s, t = f"{enc}.layers.{i}", f"encoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        ffn(s, f"{t}.ffn")
        for n, name in ((1, "self_attn_norm"), (2, "ffn_norm")):
            imp.norm(f"{s}.norm{n}", f"{t}.{name}", d, "weight", "bias")
    imp.norm(f"{enc}.norm", "encoder.final_norm", d, "weight", "bias")
    for i in range(n_dec):
        s, t = f"{dec}.layers.{i}", f"decoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        attention(f"{s}.multihead_attn", f"{t}.cross_attn")
        ffn(s, f"{t}.ffn")
        for n, name in ((1, "self_attn_norm"), (2, "cross_attn_norm"), (3, "ffn_norm")):
            imp.norm(f"{s}.norm{n}", f"{t}.{name}", d, "weight", "bias")
    imp.norm(f"{dec}.norm", "decoder.final_norm", d, "weight", "bias")
    imp.linear("generator", "generator", d, tgt_vocab)
    imp.check_keys("hint: only bias keys are missing: a model built with bias=False cannot be imported "
                   "(the canonical model has a bias in every layer)")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=norm_first, norm_style="standard", norm_eps=norm_eps, final_norm=True,
        activation=activation, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, dtype=imp.dtype)
    return imp.finish(config)


# -- The Annotated Transformer (Harvard NLP) EncoderDecoder ---------------------------------------
def from_annotated(state_dict: Mapping[str, np.ndarray], *, n_heads: int, pad_id: int, bos_id: int,
                   eos_id: int, norm_eps: float = 1e-6, max_len: int | None = None,
                   dropout: float = 0.1, dtype=None, allow_nonfinite: bool = False,
                   rename: Renames = None) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import the Annotated Transformer's ``EncoderDecoder`` (``make_model``).

    Layout: ``{encoder,decoder}.layers.{i}.self_attn.linears.{0,1,2,3}`` (query, key, value,
    output), decoder ``src_attn`` (-> ``cross_attn``), ``feed_forward.w_1/w_2`` (-> ``ffn.inner/
    outer``), ``sublayer.{j}.norm.a_2/b_2`` (gain/offset of the j-th sublayer's norm: encoder
    self_attn, ffn; decoder self_attn, cross_attn, ffn), ``{encoder,decoder}.norm.a_2/b_2`` (final
    norms), ``{src,tgt}_embed.0.lut.weight`` (embeddings, multiplied by sqrt(d_model) in the model),
    ``{src,tgt}_embed.1.pe`` (interleaved positional tables ``(1, max_len, d)``, checked; max_len is
    the shorter one), ``generator.proj.weight/bias``. Every Linear is transposed to (in, out).

    The model is pre-norm with its own LayerNorm, ``a_2 * (x - mean) / (std + eps) + b_2`` with the
    unbiased std: ``norm_first=True``, ``norm_style="annotated"``, final norms, eps 1e-6.

    Its ``Generator`` returns ``log_softmax(proj(x))``; the canonical model returns the logits
    ``proj(x)``: apply log_softmax to compare with the Generator's output (argmax is the same).

    Args:
        n_heads: attention heads (``h``; not stored; must divide d_model).
        pad_id, bos_id, eos_id: the special ids the model was trained with (not stored).
        norm_eps: the LayerNorm eps (not stored); the Annotated default 1e-6.
        max_len, dropout, dtype, allow_nonfinite, rename: as in `from_nn_transformer`.

    Raises:
        ImporterError: every problem found, naming the keys.
    """
    imp = SourceImport("from_annotated", state_dict, dtype, allow_nonfinite, rename,
                       buffers=["src_embed.1.pe", "tgt_embed.1.pe"])
    d = imp.size("d_model", [("src_embed.0.lut.weight", 1), ("tgt_embed.0.lut.weight", 1),
                             ("encoder.norm.a_2", 0), ("generator.proj.weight", 1)])
    d_ff = imp.size("d_ff", [("encoder.layers.0.feed_forward.w_1.weight", 0),
                             ("decoder.layers.0.feed_forward.w_1.weight", 0)])
    src_vocab = imp.size("src_vocab", [("src_embed.0.lut.weight", 0)])
    tgt_vocab = imp.size("tgt_vocab", [("tgt_embed.0.lut.weight", 0), ("generator.proj.weight", 0),
                                       ("generator.proj.bias", 0)])
    n_enc, n_dec = imp.layer_count("encoder.layers"), imp.layer_count("decoder.layers")
    if (text := n_heads_problem(n_heads, d)) is not None:
        imp.problem(text)
    max_len = imp.positional(["src_embed.1.pe", "tgt_embed.1.pe"], max_len, d)
    imp.hint_layout([(lambda k: k.startswith("transformer.") or k.endswith("in_proj_weight"),
                      "hint: these look like nn.Transformer keys: use from_nn_transformer")])
    if None in (d, d_ff, src_vocab, tgt_vocab):
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        for j, p in enumerate(PROJECTIONS):  # linears 0..3 are query, key, value, output
            imp.linear(f"{src}.linears.{j}", f"{dst}.{p}", d, d)

    def layer(src: str, dst: str, sublayers: tuple[str, ...]) -> None:
        for j, name in enumerate(sublayers):
            if name != "ffn":
                attention(f"{src}.{'src_attn' if name == 'cross_attn' else name}", f"{dst}.{name}")
            imp.norm(f"{src}.sublayer.{j}.norm", f"{dst}.{name}_norm", d, "a_2", "b_2")
        imp.linear(f"{src}.feed_forward.w_1", f"{dst}.ffn.inner", d, d_ff)
        imp.linear(f"{src}.feed_forward.w_2", f"{dst}.ffn.outer", d_ff, d)

    imp.expect("src_embed.0.lut.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
    imp.expect("tgt_embed.0.lut.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
    for i in range(n_enc):
        layer(f"encoder.layers.{i}", f"encoder.layers.{i}", ("self_attn", "ffn"))
    imp.norm("encoder.norm", "encoder.final_norm", d, "a_2", "b_2")
    for i in range(n_dec):
        layer(f"decoder.layers.{i}", f"decoder.layers.{i}", ("self_attn", "cross_attn", "ffn"))
    imp.norm("decoder.norm", "decoder.final_norm", d, "a_2", "b_2")
    imp.linear("generator.proj", "generator", d, tgt_vocab)
    imp.check_keys("hint: only bias keys are missing: layers without bias cannot be imported")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=True, norm_style="annotated", norm_eps=norm_eps, final_norm=True,
        pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, dtype=imp.dtype)
    return imp.finish(config)
