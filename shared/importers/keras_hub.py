"""KerasHub seq2seq models (``TokenAndPositionEmbedding``, ``TransformerEncoder``,
``TransformerDecoder``, a final ``Dense``), as the keras.io example "English-to-Spanish translation
with KerasHub" builds them, from the variables of a ``.weights.h5`` or ``.keras`` file ->
``(TransformerConfig, canonical weights)``. NumPy only: read the file with
`shared.importers.read_keras_file` (h5py) first.

What the layers compute (keras-hub 0.32), and the config that says so:

* ``TokenAndPositionEmbedding``: token table plus a learned position table, no scaling:
  ``positional="learned"``, ``embed_scale=False``, ``max_len`` = the table's rows (both sides equal).
* ``TransformerEncoder`` / ``TransformerDecoder``: ``MultiHeadAttention`` with
  ``key_dim = hidden // num_heads``, ``LayerNormalization(epsilon=layer_norm_epsilon)`` (default
  1e-5), post-norm by default or pre-norm (``normalize_first``) *without* a final norm
  (``final_norm=False``), feed-forward ``Dense(intermediate, activation)``, ``Dense(hidden)``.
* The final ``Dense(vocab)`` (the example's has ``activation="softmax"``): the generator; the
  canonical model returns its logits, ``log_softmax`` of which is ``log`` of the example's output.
* Masks. With ``mask_zero=True`` (pad id 0) Keras propagates the padding mask: the encoder masks
  padded keys (and padded queries, whose outputs no real position reads), the decoder masks padded
  keys and future positions, the cross-attention padded source keys: the canonical masks
  (convention 2). Without ``mask_zero`` (the keras.io code as written) nothing is masked but the
  future: ``mask_padding=False``. One exception, not representable: with ``mask_zero=True``, dropout
  0 (the layers' default) and a source that is *all* padding, Keras' fused attention gives every
  query uniform weights over the padded keys where the canonical model gives zero weights
  (convention 3); a source with at least one real token computes identically.

What a ``.weights.h5`` does not store is an argument: ``mask_zero`` (required: a wrong value loads
silently and computes something else), ``normalize_first``, ``layer_norm_epsilon``, ``activation``
(default: the layers' defaults False, 1e-5, relu). A ``.keras`` file's config stores them all; pass
it as ``keras_config`` and any argument given must agree with it.

Layout: in a functional model the layers are groups named by class with a counter
(``transformer_encoder``, ``transformer_encoder_1``, ...; stacking order), at the top level or
inside a nested model (the example's decoder is a ``keras.Model`` of its own, ``functional``). The
target embedding is the one beside the decoder layers; in a flat model holding both embeddings,
the one whose vocabulary is the final Dense's (refused when the two vocabularies are equal).
"""
from __future__ import annotations

import re
from typing import Any, Mapping

import numpy as np

from ..config import TransformerConfig
from .common import ImporterError, SourceImport
from .keras_file import layer_configs, unaccounted_layers
from .keras_layers import attention_sizes, dense, layer_norm, multi_head_attention

ENCODER, DECODER = "transformer_encoder", "transformer_decoder"
EMBEDDING, DENSE = "token_and_position_embedding", "dense"
_GROUP = re.compile(rf"^(?P<parent>(?:.*/)?)(?P<base>{ENCODER}|{DECODER}|{EMBEDDING}|{DENSE})"
                    r"(?:_(?P<index>\d+))?/")
# The .keras layer classes this importer maps (every other layer must compute the identity at
# inference, `keras_file.unaccounted_layers`).
KERAS_HUB_LAYERS = ("TokenAndPositionEmbedding", "TransformerEncoder", "TransformerDecoder", "Dense")
_ACTIVATIONS = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
KERAS_HUB_DEFAULTS = dict(normalize_first=False, norm_eps=1e-5, activation="relu")


def _groups(keys) -> dict[str, dict[str, int]]:
    """``{class base: {group path: index}}`` of the layer groups present among ``keys`` (the index
    is the Keras counter within the group's parent: stacking order)."""
    out: dict[str, dict[str, int]] = {}
    for key in keys:
        if m := _GROUP.match(key):
            out.setdefault(m.group("base"), {})[key[: m.end() - 1]] = int(m.group("index") or 0)
    return out


def _stack(imp: SourceImport, base: str, groups: dict[str, int]) -> list[str]:
    """The groups of one layer class in stacking order; one parent, consecutive counters."""
    parents = {path.rpartition("/")[0] for path in groups}
    if len(parents) > 1:
        imp.problem(f"{base}: expected every layer in one model, found them in {sorted(parents)}")
    order = sorted(groups, key=groups.get)
    indices = [groups[p] for p in order]
    if indices != list(range(len(indices))):
        imp.problem(f"{base}: expected consecutive layers {base}, {base}_1, ..., got indices "
                    f"{indices} (a layer is missing)")
    return order


def from_keras_hub(weights: Mapping[str, np.ndarray], *, bos_id: int, eos_id: int, pad_id: int = 0,
                   mask_zero: bool | None = None, normalize_first: bool | None = None,
                   norm_eps: float | None = None, activation: str | None = None,
                   keras_config: dict | None = None, dropout: float = 0.0, dtype=None,
                   allow_nonfinite: bool = False) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import a KerasHub encoder-decoder from its variables ``{h5 path: array}``.

    Args:
        weights: the file's variables, all float32 or all float64.
        bos_id, eos_id: the ``[START]`` / ``[END]`` ids (not stored).
        pad_id: the ``[PAD]`` id; must be 0 with ``mask_zero`` (Keras masks id 0).
        mask_zero: the ``mask_zero`` of both ``TokenAndPositionEmbedding`` layers; required without
            ``keras_config``.
        normalize_first, norm_eps, activation: the encoder/decoder layers' ``normalize_first``,
            ``layer_norm_epsilon`` and ``activation`` (``relu``, ``gelu`` exact, ``swish``/``silu``);
            default: from ``keras_config``, else KerasHub's defaults (False, 1e-5, relu).
        keras_config: the parsed ``config.json`` of a ``.keras`` file (`KerasFile.config`).
        dropout, dtype, allow_nonfinite: as `shared.importers.from_nn_transformer`.

    Raises:
        ImporterError: every problem found, naming the variables or settings.
    """
    imp = SourceImport("from_keras_hub", weights, dtype, allow_nonfinite)
    groups = _groups(imp.sd)
    encoders = _stack(imp, ENCODER, groups.get(ENCODER, {}))
    decoders = _stack(imp, DECODER, groups.get(DECODER, {}))
    embeddings, denses = list(groups.get(EMBEDDING, {})), list(groups.get(DENSE, {}))
    if not encoders or not decoders:
        imp.problem(f"no layers: expected {ENCODER} and {DECODER} groups (KerasHub layers), "
                    f"found {sorted(groups) or 'none'}")
    if len(embeddings) != 2:
        imp.problem(f"expected two {EMBEDDING} groups (source and target), got {sorted(embeddings)}")
    if len(denses) != 1:
        imp.problem(f"expected one final Dense group ({DENSE}), got {sorted(denses)}")
    imp.hint_layout([(lambda k: k.startswith(("encoder/enc_layers/", "decoder/dec_layers/")),
                      "hint: these look like the TensorFlow tutorial's variables: use "
                      "from_tf_tutorial (twins convert --from tf-tutorial)")])
    if imp.problems:
        raise ImporterError(imp.source, imp.problems)
    (generator,) = denses
    first_enc, first_dec = encoders[0], decoders[0]
    d = imp.size("d_model", [(f"{first_enc}/_self_attention_layer_norm/vars/0", 0)])
    d_ff = imp.size("d_ff", [(f"{first_enc}/_feedforward_intermediate_dense/vars/0", 1)])
    tgt_vocab = imp.size("tgt_vocab", [(f"{generator}/vars/0", 1)])
    heads, key_dim = attention_sizes(imp, f"{first_enc}/_self_attention_layer/query_dense/vars/0")
    src_embed, tgt_embed = _sides(imp, embeddings, first_dec, tgt_vocab)
    if src_embed is None:  # refused (the sizes read from it would only repeat that, as 'None/...')
        raise ImporterError(imp.source, imp.problems)
    src_vocab = imp.size("src_vocab", [(f"{src_embed}/token_embedding/vars/0", 0)])
    max_len = imp.size("max_len", [(f"{src_embed}/position_embedding/vars/0", 0)])
    if None in (d, d_ff, tgt_vocab, heads, src_vocab, max_len) or imp.problems:
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        multi_head_attention(imp, f"{src}_layer", dst, d, heads, key_dim)
        layer_norm(imp, f"{src}_layer_norm", f"{dst}_norm", d)

    def layer(src: str, dst: str, sublayers: tuple[str, ...]) -> None:
        for source, name in sublayers:
            attention(f"{src}/_{source}", f"{dst}.{name}")
        dense(imp, f"{src}/_feedforward_intermediate_dense", f"{dst}.ffn.inner", d, d_ff)
        dense(imp, f"{src}/_feedforward_output_dense", f"{dst}.ffn.outer", d_ff, d)
        layer_norm(imp, f"{src}/_feedforward_layer_norm", f"{dst}.ffn_norm", d)

    for side, group in (("src_embed", src_embed), ("tgt_embed", tgt_embed)):
        vocab = src_vocab if side == "src_embed" else tgt_vocab
        imp.expect(f"{group}/token_embedding/vars/0", (vocab, d), (f"{side}.embeddings", np.asarray))
        imp.expect(f"{group}/position_embedding/vars/0", (max_len, d), (f"{side}.positions", np.asarray))
    for number, group in enumerate(encoders):
        layer(group, f"encoder.layers.{number}", (("self_attention", "self_attn"),))
    for number, group in enumerate(decoders):
        layer(group, f"decoder.layers.{number}",
              (("self_attention", "self_attn"), ("cross_attention", "cross_attn")))
    dense(imp, generator, "generator", d, tgt_vocab)
    imp.check_keys("")
    given = dict(mask_zero=mask_zero, normalize_first=normalize_first, norm_eps=norm_eps,
                 activation=activation)
    settings = _settings(imp, given, keras_config)  # after the variables: all problems reported together
    if settings["mask_zero"] and pad_id != 0:
        imp.problem(f"pad_id: expected 0 with mask_zero=True (Keras masks id 0), got {pad_id}")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=heads, d_ff=d_ff,
        n_encoder_layers=len(encoders), n_decoder_layers=len(decoders), dropout=dropout,
        max_len=max_len, norm_first=settings["normalize_first"], norm_style="standard",
        norm_eps=settings["norm_eps"], final_norm=False, pad_id=pad_id, bos_id=bos_id, eos_id=eos_id,
        dtype=imp.dtype, activation=settings["activation"], positional="learned", embed_scale=False,
        head_dim=None if heads * key_dim == d else key_dim, mask_padding=bool(settings["mask_zero"]))
    return imp.finish(config)


def _sides(imp: SourceImport, groups: list[str], first_decoder: str, tgt_vocab: int | None
           ) -> tuple[str | None, str | None]:
    """(source, target) embedding groups: the target is beside the decoder layers; in a flat model
    with both there, the one whose vocabulary is the generator's."""
    parent = first_decoder.rpartition("/")[0]
    beside = [g for g in groups if g.rpartition("/")[0] == parent]
    if len(beside) == 1:
        (tgt,) = beside
        return next(g for g in groups if g != tgt), tgt
    vocab = {g: getattr(imp.sd.get(f"{g}/token_embedding/vars/0"), "shape", (None,))[0] for g in groups}
    matching = [g for g in groups if vocab[g] == tgt_vocab]
    if len(matching) == 1:
        (tgt,) = matching
        return next(g for g in groups if g != tgt), tgt
    imp.problem(f"cannot tell the source embedding from the target one: {groups} sit in one model "
                f"with vocabularies {list(vocab.values())} and the final Dense has {tgt_vocab} outputs; "
                "build the decoder as a model of its own (the keras.io example's layout) to import it")
    return None, None


def _settings(imp: SourceImport, given: dict[str, Any], keras_config: dict | None) -> dict[str, Any]:
    """The settings a weights file does not store: from the ``.keras`` config, the arguments (which
    must agree with it), or KerasHub's defaults; ``mask_zero`` has no default."""
    stored = _from_config(imp, keras_config) if keras_config is not None else {}
    out = {}
    for name, value in given.items():
        if name in stored and value is not None and value != stored[name]:
            imp.problem(f"{name}: the .keras config says {stored[name]!r}, the argument {value!r}")
        out[name] = stored.get(name, value if value is not None else KERAS_HUB_DEFAULTS.get(name))
    if out["mask_zero"] is None:
        imp.problem("mask_zero: required (not stored in a .weights.h5): the mask_zero the "
                    "TokenAndPositionEmbedding layers were built with (the keras.io example's code "
                    "leaves it False); a wrong value loads silently and masks differently")
    elif not isinstance(out["mask_zero"], bool):
        imp.problem(f"mask_zero: expected a bool, got {out['mask_zero']!r}")
    if not isinstance(out["normalize_first"], bool):
        imp.problem(f"normalize_first: expected a bool, got {out['normalize_first']!r}")
    if out["activation"] not in _ACTIVATIONS:
        imp.problem(f"activation: expected one of {sorted(_ACTIVATIONS)}, got {out['activation']!r}")
    else:
        out["activation"] = _ACTIVATIONS[out["activation"]]
    return out


def _activation_name(value: Any) -> Any:
    """A serialized Keras activation: a name, or ``{"class_name": "function", "config": name}``."""
    if isinstance(value, dict):
        return value.get("config")
    return value


def _from_config(imp: SourceImport, config: dict) -> dict[str, Any]:
    """Settings read from a ``.keras`` config; every layer of a kind must agree, and every layer
    is mapped or known not to change inference."""
    for problem in unaccounted_layers(config, KERAS_HUB_LAYERS):
        imp.problem(problem)
    found: dict[str, set] = {}

    def add(name: str, layer: dict, key: str, value, kinds: tuple, expected: str) -> None:
        """One layer's setting, of the JSON type it must have (a list or an object there would be
        neither a setting nor hashable)."""
        if isinstance(value, kinds) and not (bool not in kinds and isinstance(value, bool)):
            found.setdefault(name, set()).add(value)
        else:
            imp.problem(f"{layer.get('name')!r}: {key}: expected {expected}, got {value!r}")

    for cls in ("TransformerEncoder", "TransformerDecoder"):
        for layer in layer_configs(config, cls):
            add("normalize_first", layer, "normalize_first", layer.get("normalize_first", False), (bool,),
                "true or false")
            add("norm_eps", layer, "layer_norm_epsilon", layer.get("layer_norm_epsilon", 1e-5), (int, float),
                "a number")
            add("activation", layer, "activation", _activation_name(layer.get("activation", "relu")), (str,),
                "an activation's name")
    for layer in layer_configs(config, "TokenAndPositionEmbedding"):
        add("mask_zero", layer, "mask_zero", layer.get("mask_zero", False), (bool,), "true or false")
    for layer in layer_configs(config, "Dense"):
        act = _activation_name(layer.get("activation"))
        if act not in (None, "linear", "softmax"):
            imp.problem(f"Dense {layer.get('name')!r}: activation {act!r}; expected softmax or none "
                        "(the generator's logits or their softmax)")
    out = {}
    for name, values in found.items():
        if len(values) > 1:
            imp.problem(f"{name}: the .keras config's layers disagree ({sorted(map(str, values))}); "
                        "the canonical model has one value")
        else:
            (out[name],) = values
    if not found:
        imp.problem("keras_config: no KerasHub TransformerEncoder/Decoder layers in the .keras config")
    return out
