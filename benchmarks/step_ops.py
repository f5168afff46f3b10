"""What one cached decoding step of torch_impl asks of the device: its operations, by name.

On a GPU a cached step is bound by kernel launches, not arithmetic (docs/performance.md, "GPU"):
the CUDA graph that replays it (`torch_impl.graphs`) still runs one kernel per operation, a few
microseconds each at batch 1. This counts the operations of the step that graph records
(`Transformer._step_logits` with the position as a 0-d tensor), as torch dispatches them, split
into those that launch work (a kernel on CUDA, a loop on the CPU) and views (metadata only, no
kernel). The count is a property of the code, not of the machine: it is the same on the CPU and
on a GPU for the same precision and layout (a packed oneDNN product is one operation, as an addmm
is), and it is exact, so it can be compared across commits where timings cannot.

    python3 dev.py bench step_ops [--preset base] [--batch 1] [--precision float32|bfloat16|float16]
                                  [--device cpu|cuda] [--forward LENGTH]

Printed: the number of launching operations and of views, then each operation's count.

``--forward LENGTH`` counts one forward pass instead (``LENGTH`` source and target tokens), in
eval without gradients, two ways: torch_impl's inference pass (the weights kept for it) and the
same model through its modules (the pass with gradients runs them; also what every forward ran
before the inference pass): products, conversions (``_to_copy``: autocast's casts of weights and
activations), concatenations (the stacking of query, key and value weights) and every launching
operation, the count issue 28 profiled on the GPU.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _torch_passes, _cuda

from _cuda import cuda_missing  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.config import PRESETS  # noqa: E402


def _aliases(func, args, out) -> bool:
    """Whether ``func`` returned a view of its input: a view op whose output shares the input's
    memory (``to`` is a view op only when it has nothing to convert)."""
    import torch
    first, result = args[0] if args else None, out[0] if isinstance(out, (tuple, list)) else out
    if not (func.is_view and isinstance(first, torch.Tensor) and isinstance(result, torch.Tensor)):
        return False
    try:
        return result.untyped_storage().data_ptr() == first.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (oneDNN's packed)
        return False


def _counted(fn) -> collections.Counter:
    """``Counter({(op name, is_view): count})`` of the operations ``fn()`` dispatches."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Count(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = collections.Counter()

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            self.ops[(str(func.overloadpacket).removeprefix("aten."), _aliases(func, args, out))] += 1
            return out

    with Count() as count:
        fn()
    return count.ops


def _model(preset: str, precision: str, device: str):
    import torch

    import torch_impl
    from torch_impl.precision import set_precision
    config = TransformerConfig.preset(preset)
    torch.manual_seed(0)
    model = torch_impl.Transformer(config).to(device).eval()
    set_precision(model, precision)
    return model


def step_ops(preset: str, batch: int, precision: str, device: str) -> collections.Counter:
    """``Counter({(op name, is_view): count})`` of one graph-ready cached step (position 3 of a
    16-position cache, 32-token sources) of a seed-0 model."""
    import torch

    from torch_impl.precision import autocast

    model = _model(preset, precision, device)
    src = torch.randint(4, model.config.src_vocab, (batch, 32), device=device)

    # no_grad, not inference_mode: composite operations (SDPA, layer_norm) then show the
    # operations they are made of, as their kernels run
    with torch.no_grad(), autocast(model):
        mask = model._src_mask(src, None)
        cache = model._init_cache(model._encode_for_decoding(src, mask), mask, 16, 1)
        tokens = torch.zeros(batch, dtype=torch.int64, device=device)
        position = torch.tensor(3, device=device)
        model._step_logits(tokens, cache, position)  # first call: weights prepared, nothing counted
        return _counted(lambda: model._step_logits(tokens, cache, position))


def forward_ops(preset: str, batch: int, length: int, precision: str, device: str) -> dict:
    """``{"inference": Counter, "modules": Counter}`` (as `_counted`) of one forward pass of
    ``batch`` rows of ``length`` source and target tokens in eval without gradients: the model's
    own (its inference pass, after a first call that prepares its weights) and its modules'."""
    import torch
    from _torch_passes import modules_pass

    model = _model(preset, precision, device)
    src = torch.randint(4, model.config.src_vocab, (batch, length), device=device)
    tgt = torch.randint(4, model.config.tgt_vocab, (batch, length), device=device)

    with torch.no_grad():  # not inference_mode: composites show their parts, as in `step_ops`
        model(src, tgt)  # first call: weights prepared, nothing counted
        return {"inference": _counted(lambda: model(src, tgt)),
                "modules": _counted(lambda: modules_pass(model, src, tgt))}


PRODUCTS = ("addmm", "mm", "bmm", "linear", "matmul", "mkldnn._linear_pointwise", "_addmm_activation",
            "baddbmm", "_scaled_dot_product_flash_attention_for_cpu",
            "_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention")


def _forward_report(ops: dict) -> None:
    print(f"{'':12s} {'launching':>9s} {'products':>8s} {'_to_copy':>8s} {'cat':>4s} {'views':>6s}")
    for path, count in ops.items():
        launching = sum(n for (_, view), n in count.items() if not view)
        views = sum(n for (_, view), n in count.items() if view)
        products = sum(n for (name, view), n in count.items() if not view and name in PRODUCTS)
        print(f"{path:12s} {launching:9d} {products:8d} {count[('_to_copy', False)]:8d} "
              f"{count[('cat', False)]:4d} {views:6d}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="base", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--forward", type=int, metavar="LENGTH", default=None,
                        help="count one forward pass of LENGTH-token sources and targets instead")
    args = parser.parse_args(argv)
    if args.device.startswith("cuda") and (why := cuda_missing()):
        parser.error(f"--device {args.device}: {why}")
    if args.forward:
        print(f"preset {args.preset}, batch {args.batch} x {args.forward} tokens, {args.precision}, "
              f"{args.device}: one forward pass in eval without gradients")
        _forward_report(forward_ops(args.preset, args.batch, args.forward, args.precision, args.device))
        return 0
    ops = step_ops(args.preset, args.batch, args.precision, args.device)
    launching = sum(n for (_, view), n in ops.items() if not view)
    views = sum(n for (_, view), n in ops.items() if view)
    print(f"preset {args.preset}, batch {args.batch}, {args.precision}, {args.device}: one cached "
          f"step (as its CUDA graph records it): {launching} launching operations, {views} views")
    for (name, view), n in sorted(ops.items(), key=lambda item: (item[0][1], -item[1], item[0][0])):
        print(f"  {n:4d}  {name}{'  (view)' if view else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
