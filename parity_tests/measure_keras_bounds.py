"""The measurement behind the ``keras-source:*`` float32 bounds of `shared.tolerances`.

Builds float32 Keras source models with random weights (`parity_tests.keras_source_models`): the
TensorFlow tutorial's Transformer (1-3 layers, d 8-32, dropout 0 and 0.1) and KerasHub models
(nested and flat, mask_zero on and off, pre/post-norm, relu/gelu/swish), saves and imports each,
and prints the largest scaled difference (what the bounds compare) of the reference, torch_impl
and tf_impl against the source: logits for the tutorial on unpadded batches, log-probabilities at
the real target positions for KerasHub on padded batches. Not a test (pytest does not collect it);
rerun by hand:

    PYTHONPATH=$PWD .venv/bin/python -m parity_tests.measure_keras_bounds [--seeds 4]
"""
from __future__ import annotations

import argparse
import tempfile
import warnings

import numpy as np

from parity_tests import keras_source_models as K
from parity_tests.backends import Backend
from shared import reference as R
from shared.importers import from_keras_hub, from_tf_tutorial, read_keras_file
from shared.loss import log_softmax
from shared.tolerances import max_rel_diff

TORCH, TF = Backend("torch", "eager", "cpu"), Backend("tf", "eager", "/CPU:0")
TUTORIAL = [(2, 8, 2, 12, 12, 10, 0.1), (1, 16, 4, 32, 20, 15, 0.0), (3, 32, 2, 64, 30, 25, 0.1)]
HUB = [(8, 2, 12, 9, 12, True, False, "swish", 0.1, 1, 1), (16, 4, 32, 20, 15, False, True, "gelu", 0.0, 2, 2),
       (32, 2, 64, 30, 25, True, True, "relu", 0.0, 2, 3)]


def runs(config, weights, src, tgt) -> dict[str, np.ndarray]:
    return {"reference": R.forward(weights, config, src, tgt),
            "torch": TORCH.logits(TORCH.build(config, weights), src, tgt),
            "tf": TF.logits(TF.build(config, weights), src, tgt)}


def tutorial(seed: int, path: str, worst: dict) -> None:
    for layers, d, heads, ff, vs, vt, dropout in TUTORIAL:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = K.TutorialTransformer(num_layers=layers, d_model=d, num_heads=heads, dff=ff,
                                          input_vocab_size=vs, target_vocab_size=vt, dropout_rate=dropout)
            model((np.ones((1, 2), np.int32), np.ones((1, 2), np.int32)))
            K.randomize(model, seed)
            model.save_weights(path)
            config, weights = from_tf_tutorial(read_keras_file(path).weights, bos_id=2, eos_id=3)
            rng = np.random.default_rng(seed)
            src, tgt = rng.integers(1, vs, (3, 9)), rng.integers(1, vt, (3, 7))
            tgt[:, 0] = 2
            expected = np.asarray(model((src, tgt)))
        for impl, logits in runs(config, weights, src, tgt).items():
            key = f"tutorial {impl}"
            worst[key] = max(worst.get(key, 0.0), max_rel_diff(logits, expected))


def keras_hub(seed: int, path: str, worst: dict) -> None:
    for d, heads, ff, vs, vt, mask_zero, first, act, dropout, n_enc, n_dec in HUB:
        model = K.keras_hub_model(vs, vt, 12, d, heads, ff, n_enc, n_dec, mask_zero=mask_zero,
                                  nested=seed % 2 == 0, activation=act, dropout=dropout,
                                  normalize_first=first)
        K.randomize(model, seed)
        model.save_weights(path)
        config, weights = from_keras_hub(read_keras_file(path).weights, bos_id=2, eos_id=3,
                                         mask_zero=mask_zero, normalize_first=first, activation=act)
        rng = np.random.default_rng(seed)
        src, tgt = rng.integers(1, vs, (3, 9)), rng.integers(1, vt, (3, 7))
        tgt[:, 0] = 2
        src[1, 5:], tgt[2, 4:] = 0, 0
        expected = np.log(np.asarray(model([src, tgt])).astype(np.float64))
        real = (tgt != 0) | (not mask_zero)
        for impl, logits in runs(config, weights, src, tgt).items():
            key = f"keras-hub {impl}"
            got = log_softmax(logits.astype(np.float64))
            worst[key] = max(worst.get(key, 0.0), max_rel_diff(got[real], expected[real]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    args = parser.parse_args()
    worst: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            tutorial(seed, f"{tmp}/t.weights.h5", worst)
            keras_hub(seed, f"{tmp}/h.weights.h5", worst)
    for key, value in sorted(worst.items()):
        print(f"{key:<22} max rel diff {value:.2e}")


if __name__ == "__main__":
    main()
