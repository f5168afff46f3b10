"""tf_impl.Transformer forward vs the same model built from Keras' own layers, in one process.

Preset ``base`` (float32), inference (``training=False``), batch 8, 64 source and 64 target tokens
with padding (rows of 64 down to 36 real tokens) and the causal target mask. The Keras-native model
is built from ``keras.layers.MultiHeadAttention``, ``LayerNormalization`` (epsilon from the config,
not Keras' 1e-3) and ``Dense`` in the paper's post-norm, and shares our embedding (x sqrt(d_model)),
positional encoding and tied generator layers, so the work is the same. Our weights are copied into
it and the two outputs compared first, so the timed work is provably the same maths.

Each model is wrapped the same way, ``tf.function(jit_compile=True)`` (XLA) and plain
``tf.function``; after warm-up the calls are interleaved (A, B, A, B, ...) so drift in the machine's
speed hits both, and the medians and their ratio are printed. If ``torch_impl`` imports, it runs on
the same weights and inputs (``torch.inference_mode``) and is timed in the same rounds.

Under XLA the two models compile to the same program (the same 133 dots and 359 fusions in the
optimised HLO, TF 2.21 CPU): the ratio there is about 1.0 by construction, and what is left to
compare is the layer norms' fusions and noise. Without XLA, graph-mode kernels differ (Keras' MHA
runs einsums and an additive-mask ``Softmax`` layer, ours a boolean ``where`` around ``softmax``).

    python3 dev.py bench tf_vs_keras_native [--repeats N] [--warmup N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

import tf_impl  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.weights import random_weights  # noqa: E402

BATCH, SRC_LEN, TGT_LEN = 8, 64, 64


class NativeEncoderLayer(keras.layers.Layer):
    """Post-norm encoder layer from Keras layers: norm(x + drop(mha(x))), norm(x + drop(ffn(x)))."""

    def __init__(self, c: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.attn = keras.layers.MultiHeadAttention(c.n_heads, c.d_k, dropout=c.dropout)
        self.norm1 = keras.layers.LayerNormalization(epsilon=c.norm_eps)
        self.inner = keras.layers.Dense(c.d_ff, activation="relu")
        self.outer = keras.layers.Dense(c.d_model)
        self.norm2 = keras.layers.LayerNormalization(epsilon=c.norm_eps)
        self.drop = keras.layers.Dropout(c.dropout)

    def call(self, x, mask, training=False):
        attn = self.attn(x, x, attention_mask=mask, training=training)
        x = self.norm1(x + self.drop(attn, training=training))
        ffn = self.outer(self.drop(self.inner(x), training=training))
        return self.norm2(x + self.drop(ffn, training=training))


class NativeDecoderLayer(keras.layers.Layer):
    """Post-norm decoder layer: masked self-attention, cross-attention, feed-forward."""

    def __init__(self, c: TransformerConfig, **kwargs):
        super().__init__(**kwargs)
        self.self_attn = keras.layers.MultiHeadAttention(c.n_heads, c.d_k, dropout=c.dropout)
        self.norm1 = keras.layers.LayerNormalization(epsilon=c.norm_eps)
        self.cross_attn = keras.layers.MultiHeadAttention(c.n_heads, c.d_k, dropout=c.dropout)
        self.norm2 = keras.layers.LayerNormalization(epsilon=c.norm_eps)
        self.inner = keras.layers.Dense(c.d_ff, activation="relu")
        self.outer = keras.layers.Dense(c.d_model)
        self.norm3 = keras.layers.LayerNormalization(epsilon=c.norm_eps)
        self.drop = keras.layers.Dropout(c.dropout)

    def call(self, x, memory, src_mask, tgt_mask, training=False):
        def drop(y):
            return self.drop(y, training=training)

        x = self.norm1(x + drop(self.self_attn(x, x, attention_mask=tgt_mask, training=training)))
        x = self.norm2(x + drop(self.cross_attn(x, memory, attention_mask=src_mask, training=training)))
        return self.norm3(x + drop(self.outer(drop(self.inner(x)))))


class KerasNative(keras.Model):
    """Keras-native layers between our embedding/positional/generator layers (shared, not copied)."""

    def __init__(self, ours: tf_impl.Transformer, **kwargs):
        super().__init__(**kwargs)
        c = self.c = ours.config
        self.src_embed, self.tgt_embed = ours.src_embed, ours.tgt_embed
        self.positional, self.generator = ours.positional, ours.generator
        self.enc = [NativeEncoderLayer(c) for _ in range(c.n_encoder_layers)]
        self.dec = [NativeDecoderLayer(c) for _ in range(c.n_decoder_layers)]

    def call(self, src, tgt, training=False):
        t = tf.shape(tgt)[1]
        src_keys = (src != self.c.pad_id)[:, None, :]  # (B, 1, S): Keras MHA, True = may attend
        causal = tf.range(t)[:, None] >= tf.range(t)[None, :]  # (T, T)
        tgt_mask = tf.logical_and((tgt != self.c.pad_id)[:, None, :], causal)  # (B, T, T)
        x = self.positional(self.src_embed(src), training=training)
        for layer in self.enc:
            x = layer(x, src_keys, training=training)
        y = self.positional(self.tgt_embed(tgt), training=training)
        for layer in self.dec:
            y = layer(y, x, src_keys, tgt_mask, training=training)
        return self.generator(y)


def copy_weights(ours: tf_impl.Transformer, native: KerasNative) -> None:
    """Our (d, d) Dense kernels into Keras MHA's EinsumDense layout: (d, H, d_k) for q/k/v and
    (H, d_k, d) for the output; a reshape, since both split d as (head, d_k) in that order."""
    c = ours.config
    h, dk, d = c.n_heads, c.d_k, c.d_model

    def attn(dst: keras.layers.MultiHeadAttention, src) -> None:
        for mine, theirs in ((src.query, dst._query_dense), (src.key, dst._key_dense),
                             (src.value, dst._value_dense)):
            theirs.kernel.assign(tf.reshape(mine.kernel, (d, h, dk)))
            theirs.bias.assign(tf.reshape(mine.bias, (h, dk)))
        dst._output_dense.kernel.assign(tf.reshape(src.output.kernel, (h, dk, d)))
        dst._output_dense.bias.assign(src.output.bias)

    def norm(dst, src) -> None:
        dst.gamma.assign(src.gamma)
        dst.beta.assign(src.beta)

    def ffn(dst, src) -> None:
        for a, b in ((dst.inner, src.inner), (dst.outer, src.outer)):
            a.kernel.assign(b.kernel)
            a.bias.assign(b.bias)

    for dst, src in zip(native.enc, ours.encoder.layers):
        attn(dst.attn, src.self_attn)
        norm(dst.norm1, src.self_attn_norm)
        ffn(dst, src.ffn)
        norm(dst.norm2, src.ffn_norm)
    for dst, src in zip(native.dec, ours.decoder.layers):
        attn(dst.self_attn, src.self_attn)
        norm(dst.norm1, src.self_attn_norm)
        attn(dst.cross_attn, src.cross_attn)
        norm(dst.norm2, src.cross_attn_norm)
        ffn(dst, src.ffn)
        norm(dst.norm3, src.ffn_norm)


def inputs(c: TransformerConfig) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    src = rng.integers(3, c.src_vocab, (BATCH, SRC_LEN))
    tgt = rng.integers(3, c.tgt_vocab, (BATCH, TGT_LEN))
    tgt[:, 0] = c.bos_id
    for row in range(BATCH):  # 64, 60, ..., 36 real tokens
        src[row, SRC_LEN - 4 * row:] = c.pad_id
        tgt[row, TGT_LEN - 4 * row:] = c.pad_id
    return src, tgt


def torch_runner(config: TransformerConfig, weights: dict, src: np.ndarray, tgt: np.ndarray):
    """torch_impl on the same weights and inputs, or None with the reason printed."""
    try:
        import torch
        import torch_impl
        model = torch_impl.Transformer(config)
        model.import_weights(weights)
        model.eval()
    except Exception as err:  # noqa: BLE001 - any failure only skips this comparison
        print(f"torch_impl: skipped ({type(err).__name__}: {err})")
        return None
    s, t = torch.from_numpy(src), torch.from_numpy(tgt)

    def run():
        with torch.inference_mode():
            return model(s, t).numpy()

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    return run


def time_once(fn) -> float:
    start = time.perf_counter()
    out = fn()
    if hasattr(out, "numpy"):
        out.numpy()  # wait for the result
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--no-torch", action="store_true", help="skip the torch_impl comparison")
    args = parser.parse_args(argv)
    keras.utils.set_random_seed(0)
    config = TransformerConfig.preset("base")
    weights = random_weights(config, 0)
    ours = tf_impl.Transformer(config)
    ours.import_weights(weights)
    native = KerasNative(ours)
    src, tgt = inputs(config)
    native(src, tgt)  # builds the Keras layers, then our weights go in
    copy_weights(ours, native)
    s, t = tf.constant(src), tf.constant(tgt)
    print(f"tensorflow {tf.__version__}, keras {keras.__version__}, "
          f"oneDNN opts env={os.environ.get('TF_ENABLE_ONEDNN_OPTS', 'unset')}; preset base float32, "
          f"batch {BATCH}, src {SRC_LEN} / tgt {TGT_LEN} tokens with padding "
          f"({int((src != config.pad_id).sum())} / {src.size} real source tokens), "
          f"{config.n_encoder_layers}+{config.n_decoder_layers} layers")

    calls = {}
    for compiled, label in ((True, "xla"), (False, "tf.function")):
        for name, model in (("tf_impl", ours), ("keras-native", native)):
            fn = tf.function(lambda a, b, m=model: m(a, b, training=False), jit_compile=compiled)
            calls[f"{name} [{label}]"] = lambda fn=fn: fn(s, t)
    torch_fn = None if args.no_torch else torch_runner(config, weights, src, tgt)
    if torch_fn is not None:
        calls["torch_impl [eager, inference_mode]"] = torch_fn

    real = tgt != config.pad_id  # compare where targets are real
    reference = calls["tf_impl [xla]"]().numpy()
    for name, fn in calls.items():
        out = np.asarray(fn())
        diff = float(np.abs(out - reference)[real].max())
        print(f"same maths: max |{name} - tf_impl [xla]| on real target positions = {diff:.2e} "
              f"(logit scale {np.abs(reference).max():.2f})")
    for _ in range(args.warmup):
        for fn in calls.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):  # interleaved: A, B, C, ..., A, B, C, ...
        for name, fn in calls.items():
            times[name].append(time_once(fn))

    med = {name: statistics.median(v) for name, v in times.items()}
    for name in calls:
        print(f"{name:36s} median {med[name] * 1e3:8.1f} ms  (min {min(times[name]) * 1e3:.1f}, "
              f"max {max(times[name]) * 1e3:.1f})")
    for label in ("xla", "tf.function"):
        ours, theirs = f"tf_impl [{label}]", f"keras-native [{label}]"
        print(f"ratio tf_impl / keras-native [{label}] = {med[ours] / med[theirs]:.3f} (target <= 1.0); "
              f"of the minima {min(times[ours]) / min(times[theirs]):.3f} (steadier on a busy machine)")
    if torch_fn is not None:
        for label in ("xla", "tf.function"):
            print(f"ratio torch_impl / tf_impl [{label}] = "
                  f"{med['torch_impl [eager, inference_mode]'] / med[f'tf_impl [{label}]']:.3f}")


if __name__ == "__main__":
    main()
