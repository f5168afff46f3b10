"""Ways people change a built model, the same change in both backends, for
parity_tests/test_adapted_layers.py and `parity_tests.measure_lora_bounds`.

* A low-rank adapter (LoRA) on every attention and feed-forward projection, ``kernel + a @ b``
  with ``a (in, r)``, ``b (r, out)``: in torch a PEFT-style wrapper module (`torch_wrap`) or a
  ``torch.nn.utils.parametrize`` parametrization (`torch_parametrize`); in Keras
  ``Dense.enable_lora`` (`keras_lora`, ``lora_alpha = rank``: the product added as it is).
* Keras' int8 quantization (`keras_int8`).
* LoRA fine-tuning, the same steps in both backends (`lora_training_differences`).

Import it freely: it imports a framework only when that framework is installed.
"""
from __future__ import annotations

import gc

import numpy as np

from parity_tests.backends import HAVE_TF, HAVE_TORCH
from parity_tests.matrix import VARIANTS, copy_batches
from shared import tasks
from shared.tolerances import max_rel_diff
from shared.weights import random_weights

RANK = 2

if HAVE_TORCH:
    import torch
    from torch import nn
    from torch.nn.utils import parametrize

    class LowRankAdapter(nn.Module):
        """A LoRA adapter as PEFT wraps a projection: ``base(x) + (x @ a) @ b``, ``a (in, r)``,
        ``b (r, out)``; the base Linear is called as it is."""

        def __init__(self, base: nn.Linear, a: np.ndarray, b: np.ndarray):
            super().__init__()
            self.base = base
            self.a, self.b = nn.Parameter(torch.tensor(a)), nn.Parameter(torch.tensor(b))  # copies

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.base(x) + (x @ self.a) @ self.b

    class LowRankDelta(nn.Module):
        """The same adapter as a parametrization of the weight ``(out, in)``: ``w + (a @ b).T``."""

        def __init__(self, a: np.ndarray, b: np.ndarray):
            super().__init__()
            self.a, self.b = nn.Parameter(torch.tensor(a)), nn.Parameter(torch.tensor(b))  # copies

        def forward(self, weight: torch.Tensor) -> torch.Tensor:
            return weight + (self.a @ self.b).t()


def one_layer_config(variant: str, **changes):
    """A tiny variant with one encoder and one decoder layer: every code path of a layer, and a
    TF trace of half the cost (a trace costs about a second a layer pair)."""
    return VARIANTS[variant].replace(n_encoder_layers=1, n_decoder_layers=1, **changes)


def layer_at(model, path: str):
    """The layer at a canonical path (``decoder.layers.0.self_attn.query``): the same attributes
    in both backends (docs/design.md, the mirror rule)."""
    for part in path.split("."):
        model = model[int(part)] if part.isdigit() else getattr(model, part)
    return model


def adapter_factors(config, seed: int = 1) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{projection path: (a (in, r), b (r, out))}`` for every attention and feed-forward
    projection, in ``config.dtype``, large enough to change the decoded tokens. Multiples of 1/16
    up to 1/4: ``a @ b`` is then exact in float32 too, as Keras computes it (``enable_lora``
    makes float32 factors even for a float64 layer), so every backend's adapted kernel is
    `fold_adapters`'."""
    weights, rng = random_weights(config, 0), np.random.default_rng(seed)
    factors = {}
    for name, kernel in weights.items():
        if name.endswith(".kernel") and ".layers." in name:
            fan_in, fan_out = kernel.shape
            factors[name[:-len(".kernel")]] = tuple(
                (rng.integers(-4, 5, shape) / 16).astype(config.dtype)
                for shape in ((fan_in, RANK), (RANK, fan_out)))
    return factors


def fold_adapters(weights: dict, factors: dict) -> dict:
    """The canonical weights with each adapter folded into its kernel: ``kernel + a @ b``."""
    folded = dict(weights)
    for path, (a, b) in factors.items():
        folded[f"{path}.kernel"] = weights[f"{path}.kernel"] + a @ b
    return folded


def torch_wrap(model, factors) -> None:
    """Each projection replaced by a `LowRankAdapter` around it."""
    for path, (a, b) in factors.items():
        parent, name = path.rsplit(".", 1)
        setattr(layer_at(model, parent), name, LowRankAdapter(layer_at(model, path), a, b))


def torch_parametrize(model, factors) -> None:
    """Each projection's weight parametrized by a `LowRankDelta`."""
    for path, (a, b) in factors.items():
        parametrize.register_parametrization(layer_at(model, path), "weight", LowRankDelta(a, b))


def keras_lora(model, factors) -> None:
    """``enable_lora`` on each projection, its factors assigned."""
    for path, (a, b) in factors.items():
        dense = layer_at(model, path)
        dense.enable_lora(RANK)  # lora_alpha = rank: the product is added as it is
        dense.lora_kernel_a.assign(a)
        dense.lora_kernel_b.assign(b)


def keras_int8(model, factors=None) -> None:
    """``model.quantize("int8")``. Keras deletes each replaced kernel with a full ``gc.collect()``,
    which in a long test process (every object the earlier tests left) takes about a second a
    layer: the objects alive before are frozen out of those collections meanwhile."""
    gc.freeze()
    try:
        model.quantize("int8")
    finally:
        gc.unfreeze()


# -- LoRA fine-tuning in both backends -----------------------------------------------------------
def lora_training_differences(variant: str, seed: int, steps: int, warmup: int = 10,
                              factor: float = 0.1):
    """LoRA fine-tuning of one float32 model in both backends: every projection adapted
    (`torch_wrap`, `keras_lora`), its kernel frozen and everything else trained (what
    ``enable_lora`` leaves trainable: biases, norms, embeddings, the generator, the factors),
    ``steps`` Adam + Noam steps (`torch_impl.training`, `tf_impl.training`) on copy batches,
    dropout 0. Yields, after each step, ``{"loss", "factors", "biases"}``: the largest scaled
    difference (`shared.tolerances.max_rel_diff`) of the losses, of every LoRA factor and of every
    projection's bias but the attention keys' (gradient-free: test_training_parity's docstring);
    and ``"moved"``: how far torch's factors have moved from their start, on the same scale."""
    from parity_tests.tf_support import build as tf_build
    from parity_tests.torch_support import build as torch_build
    from tf_impl import training as tf_training
    from torch_impl import training as torch_training

    config = one_layer_config(variant, dtype="float32", dropout=0.0, src_vocab=tasks.COPY_VOCAB,
                              tgt_vocab=tasks.COPY_VOCAB)
    weights, factors = random_weights(config, seed), adapter_factors(config, seed)
    torch_model, keras_model = torch_build(config, weights).train(), tf_build(config, weights)
    torch_wrap(torch_model, factors)
    keras_lora(keras_model, factors)  # freezes each kernel
    for path in factors:
        layer_at(torch_model, path).base.weight.requires_grad_(False)
    torch_opt = torch_training.make_optimizer(torch_model, warmup=warmup, factor=factor)
    keras_opt = tf_training.make_optimizer(keras_model, warmup=warmup, factor=factor)
    for batch in copy_batches(steps, seed):
        a = torch_training.train_step(torch_model, torch_opt, batch)
        b = tf_training.train_step(keras_model, keras_opt, batch)
        worst = {"loss": max_rel_diff(np.float64(b.loss), np.float64(a.loss)), "factors": 0.0, "biases": 0.0,
                 "moved": 0.0}
        for path, start in factors.items():
            adapter, dense = layer_at(torch_model, path), layer_at(keras_model, path)
            worst["moved"] = max(worst["moved"], max_rel_diff(adapter.a.detach().numpy(), start[0]),
                                 max_rel_diff(adapter.b.detach().numpy(), start[1]))
            for mine, theirs in ((adapter.a, dense.lora_kernel_a), (adapter.b, dense.lora_kernel_b)):
                worst["factors"] = max(worst["factors"], max_rel_diff(theirs.numpy(), mine.detach().numpy()))
            if not path.endswith(".key"):
                worst["biases"] = max(worst["biases"],
                                      max_rel_diff(dense.bias.numpy(), adapter.base.bias.detach().numpy()))
        yield worst
