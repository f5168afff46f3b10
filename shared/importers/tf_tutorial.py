"""The ``Transformer`` of the TensorFlow text tutorial "Neural machine translation with a Transformer
and Keras", from the variables of its ``.weights.h5`` -> ``(TransformerConfig, canonical weights)``.
NumPy only: read the file with `shared.importers.read_keras_file` (h5py) first.

What the tutorial's code computes, and the config that says so:

* ``PositionalEmbedding``: ``Embedding(vocab, d, mask_zero=True)`` times ``sqrt(d)`` plus a fixed
  table ``concat([sin(p * f), cos(p * f)])`` with ``f_i = 1 / 10000**(i / (d/2))`` = ``10000^(-2i/d)``,
  the paper's frequencies in ``[sin | cos]`` halves: ``pe_layout="halves"``, ``pe_timescale="paper"``,
  ``embed_scale=True``. The table (2048 rows) is a constant, not a variable: ``max_len`` defaults to
  2048. ``mask_zero=True`` fixes ``pad_id = 0``.
* ``MultiHeadAttention(num_heads, key_dim=d_model)``: heads of width ``d_model`` (read off the kernel
  shapes): ``head_dim = d_model`` (a config field since issue 11).
* Post-norm sublayers ``LayerNormalization(x + sublayer(x))`` with Keras' default epsilon 1e-3
  (``norm_eps``, not stored), no final norm; ``FeedForward`` = ``Dense(dff, relu)``, ``Dense(d)``;
  ``final_layer`` = ``Dense(target_vocab)`` returning logits.

**Padding under Keras 3.** The tutorial relies on Keras masks propagating from the embedding
(``mask_zero=True``) through every layer. In Keras 3, ``MultiHeadAttention`` removes the mask from its
input tensors and ``Add`` drops a mask when one input has none, so the mask reaches only the first
self-attention of each stack (key, query and causal masks there); later encoder layers and every
cross-attention attend to padding. Keras 2 (``tf.keras``, for which the tutorial was written)
propagated the masks everywhere. The import computes the tutorial's stated model, padding masked as
keys in every attention (docs/design.md, convention 2). The two agree exactly on unpadded input (one
sentence at a time, as the tutorial's ``Translator`` runs) and differ on padded batches run by Keras 3;
which Keras trained the weights is not stored, so this cannot be refused from the file.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from ..config import TransformerConfig
from .common import ImporterError, SourceImport
from .keras_layers import attention_sizes, dense, layer_norm, list_indices, list_name, multi_head_attention

# What `twins convert --from tf-tutorial` prints (the docstring's "Padding under Keras 3").
KERAS3_PADDING = ("under Keras 3 the tutorial's masks reach only the first self-attention of each "
                  "stack (MultiHeadAttention and Add drop them), so Keras 3 lets later layers and "
                  "every cross-attention attend to padding; the import masks padding in every "
                  "attention, as the tutorial states (and Keras 2 ran). The two agree exactly on "
                  "unpadded input (one sentence at a time) and differ on padded batches run by Keras 3")
KERAS_LAYER_NORM_EPS = 1e-3  # keras.layers.LayerNormalization's default, which the tutorial keeps
TUTORIAL_MAX_LEN = 2048  # positional_encoding(length=2048, ...) in PositionalEmbedding
ENC, DEC = "encoder/enc_layers/", "decoder/dec_layers/"


def from_tf_tutorial(weights: Mapping[str, np.ndarray], *, bos_id: int, eos_id: int,
                     norm_eps: float = KERAS_LAYER_NORM_EPS, max_len: int = TUTORIAL_MAX_LEN,
                     dropout: float = 0.1, dtype=None, allow_nonfinite: bool = False
                     ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import the tutorial's ``Transformer`` from its variables ``{h5 path: array}``.

    Layout (``save_weights`` of the tutorial's classes): ``encoder/pos_embedding/embedding/vars/0``
    and ``decoder/pos_embedding/...`` (token tables), ``encoder/enc_layers/encoder_layer[_N]/``
    ``self_attention/{mha,layernorm}`` and ``ffn/{seq/layers/dense, seq/layers/dense_1, layer_norm}``,
    ``decoder/dec_layers/decoder_layer[_N]/{causal_self_attention, cross_attention, ffn}``,
    ``final_layer/vars/{0,1}``. The head count and ``key_dim`` are read from the attention kernels.

    Args:
        weights: the file's variables, all float32 or all float64.
        bos_id, eos_id: the ``[START]`` / ``[END]`` ids of the target tokenizer (the tutorial's are
            2 and 3); not stored. ``pad_id`` is 0 (``mask_zero=True``).
        norm_eps: the LayerNormalization epsilon (not stored); Keras' default 1e-3, the tutorial's.
        max_len: rows of the positional table the model may use (not stored); the tutorial's 2048.
        dropout: recorded for further training; unused in inference.
        dtype, allow_nonfinite: as `shared.importers.from_nn_transformer`.

    Raises:
        ImporterError: every problem found, naming the variables.
    """
    imp = SourceImport("from_tf_tutorial", weights, dtype, allow_nonfinite)
    d = imp.size("d_model", [("encoder/pos_embedding/embedding/vars/0", 1),
                             ("decoder/pos_embedding/embedding/vars/0", 1), ("final_layer/vars/0", 0)])
    src_vocab = imp.size("src_vocab", [("encoder/pos_embedding/embedding/vars/0", 0)])
    tgt_vocab = imp.size("tgt_vocab", [("decoder/pos_embedding/embedding/vars/0", 0),
                                       ("final_layer/vars/0", 1), ("final_layer/vars/1", 0)])
    d_ff = imp.size("d_ff", [(f"{ENC}encoder_layer/ffn/seq/layers/dense/vars/0", 1),
                             (f"{DEC}decoder_layer/ffn/seq/layers/dense/vars/0", 1)])
    heads, key_dim = attention_sizes(imp, f"{ENC}encoder_layer/self_attention/mha/query_dense/vars/0")
    encoders, decoders = list_indices(imp.sd, ENC, "encoder_layer"), list_indices(imp.sd, DEC, "decoder_layer")
    if not encoders or not decoders:
        imp.problem(f"no layers: expected variables under {ENC}encoder_layer/ and {DEC}decoder_layer/")
    imp.hint_layout([(lambda k: "transformer_encoder" in k or "transformer_decoder" in k,
                      "hint: these look like KerasHub TransformerEncoder/Decoder variables: use "
                      "from_keras_hub (twins convert --from keras-hub)")])
    if None in (d, src_vocab, tgt_vocab, d_ff, heads) or not encoders or not decoders:
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        multi_head_attention(imp, f"{src}/mha", dst, d, heads, key_dim)
        layer_norm(imp, f"{src}/layernorm", f"{dst}_norm", d)

    def ffn(src: str, dst: str) -> None:
        dense(imp, f"{src}/seq/layers/dense", f"{dst}.inner", d, d_ff)
        dense(imp, f"{src}/seq/layers/dense_1", f"{dst}.outer", d_ff, d)
        layer_norm(imp, f"{src}/layer_norm", f"{dst}_norm", d)

    imp.expect("encoder/pos_embedding/embedding/vars/0", (src_vocab, d), ("src_embed.embeddings", np.asarray))
    imp.expect("decoder/pos_embedding/embedding/vars/0", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
    n_enc = imp.planned_layers(f"{ENC}encoder_layer*", encoders)  # a gap: missing variables of that layer
    n_dec = imp.planned_layers(f"{DEC}decoder_layer*", decoders)
    if not (n_enc and n_dec):  # more indices than layers held: refused, nothing to plan
        raise ImporterError(imp.source, imp.problems)
    for i in range(n_enc):
        src = f"{ENC}{list_name('encoder_layer', i)}"
        attention(f"{src}/self_attention", f"encoder.layers.{i}.self_attn")
        ffn(f"{src}/ffn", f"encoder.layers.{i}.ffn")
    for i in range(n_dec):
        src = f"{DEC}{list_name('decoder_layer', i)}"
        attention(f"{src}/causal_self_attention", f"decoder.layers.{i}.self_attn")
        attention(f"{src}/cross_attention", f"decoder.layers.{i}.cross_attn")
        ffn(f"{src}/ffn", f"decoder.layers.{i}.ffn")
    dense(imp, "final_layer", "generator", d, tgt_vocab)
    imp.check_keys("")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout,
        max_len=max_len, norm_first=False, norm_style="standard", norm_eps=norm_eps, final_norm=False,
        pad_id=0, bos_id=bos_id, eos_id=eos_id, dtype=imp.dtype, pe_layout="halves",
        pe_timescale="paper", head_dim=None if heads * key_dim == d else key_dim)
    return imp.finish(config)
