"""torch_impl's forward pass through its modules, for the benchmarks that set it beside the model's
own pass (`step_ops.py --forward`, `torch_vs_nn_transformer.py`'s "torch_impl (modules)")."""
from __future__ import annotations


def modules_pass(model, src, tgt):
    """``model``'s forward (``(B, S)``, ``(B, T)`` ids -> ``(B, T, V)`` logits) through its
    modules, as a pass with gradients runs it and as every pass ran before the inference pass:
    the embeddings, ``encoder``, ``decoder`` and the generator's own product (`Generator._linear`)
    called directly under the model's autocast, so the per-call casts and stacking of the weights
    happen. The model's ``forward`` in eval without gradients takes the kept weights instead
    (`torch_impl.cache._inferring`)."""
    from torch_impl.precision import autocast

    src_mask, tgt_mask = model._src_mask(src, None), model._tgt_mask(tgt, None)
    with autocast(model):
        memory = model.encoder(model.positional(model.src_embed(src), model.src_embed.positions), src_mask)
        hidden = model.decoder(model.positional(model.tgt_embed(tgt), model.tgt_embed.positions), memory,
                               src_mask, tgt_mask)
        return model.generator._linear(hidden)
