"""torch_impl.Transformer forward vs torch.nn.Transformer doing the same work, in one process.

Preset ``base`` (float32), eval, ``torch.inference_mode()``, batch 8, 64 source and 64 target tokens
with padding (rows of 64 down to 36 real tokens) and the causal target mask. ``nn.Transformer`` gets
the very same embedding (x sqrt(d_model)), positional encoding and tied generator modules, is built
with ``batch_first=True, norm_first=False``, the same d_ff, dropout and eps, and no final norms (the
paper's post-norm has none; ``nn.Transformer`` adds them unless given its own stacks). Our weights
are copied into it and the two outputs compared first, so the timed work is provably the same maths.
Forward passes also time "torch_impl (modules)": the same model through its modules (what a pass
with gradients runs), against its own forward, which in eval without gradients runs on weights laid
out and kept for inference (`torch_impl.cache.StepWeights`); and "torch_impl (frozen, grad on)":
its forward with gradients on, the model frozen (a teacher in a student's step), which takes the
kept weights too.

The two are interleaved after warm-up (A, B, A, B, ...) so drift in the machine's speed hits both;
the medians, their ratio, the median of each round's ratio, and achieved GFLOP/s against a plain
matmul measured in the same run are printed. FLOPs are counted analytically (2*m*n*k per matmul,
attention included, padded tokens included, since both models compute them unless nn's
nested-tensor fast path skips them).

    python3 dev.py bench torch_vs_nn_transformer [--repeats N] [--threads N] [--device cpu|cuda]
        [--precision float32|bfloat16|float16] [--batch B] [--length L] [--train]
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _torch_passes

import torch_impl  # noqa: E402
from shared import TransformerConfig  # noqa: E402
from shared.threads import thread_count  # noqa: E402
from _cuda import cuda_missing  # noqa: E402
from _torch_passes import modules_pass  # noqa: E402

BATCH, SRC_LEN, TGT_LEN = 8, 64, 64  # --batch, --length change them


class FrozenPass(nn.Module):
    """torch_impl's forward with gradients on, the model frozen (``requires_grad_(False)``): a
    teacher called inside a student's training step. It takes the inference pass too (nothing
    to record: `torch_impl.cache._inferring`); before 2026-11-25 it ran the modules."""

    def __init__(self, ours: torch_impl.Transformer):
        super().__init__()
        self.ours = ours

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode(False), torch.enable_grad():
            return self.ours(src, tgt)


class ModulesPass(nn.Module):
    """torch_impl's forward through its modules (`_torch_passes.modules_pass`), as a pass with
    gradients runs it, so the per-call casts and stacking of the weights are timed too; the
    model's own ``forward`` takes the kept weights in eval without gradients
    (`torch_impl.cache._inferring`)."""

    def __init__(self, ours: torch_impl.Transformer):
        super().__init__()
        self.ours = ours

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        return modules_pass(self.ours, src, tgt)


class NNTransformerBaseline(nn.Module):
    """``nn.Transformer`` between our embedding/positional/generator modules (shared, not copied)."""

    def __init__(self, ours: torch_impl.Transformer, nested: bool = True):
        super().__init__()
        c = ours.config
        self.pad_id = c.pad_id
        self.src_embed, self.tgt_embed = ours.src_embed, ours.tgt_embed
        self.positional, self.generator = ours.positional, ours.generator

        def enc_layer():
            return nn.TransformerEncoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, batch_first=True,
                                              norm_first=False, layer_norm_eps=c.norm_eps)

        def dec_layer():
            return nn.TransformerDecoderLayer(c.d_model, c.n_heads, c.d_ff, c.dropout, batch_first=True,
                                              norm_first=False, layer_norm_eps=c.norm_eps)

        self.core = nn.Transformer(
            c.d_model, c.n_heads, batch_first=True, norm_first=False,
            custom_encoder=nn.TransformerEncoder(enc_layer(), c.n_encoder_layers, norm=None,
                                                 enable_nested_tensor=nested),
            custom_decoder=nn.TransformerDecoder(dec_layer(), c.n_decoder_layers, norm=None))

    def forward(self, src: torch.Tensor, tgt: torch.Tensor) -> torch.Tensor:
        t = tgt.shape[1]
        src_pad, tgt_pad = src == self.pad_id, tgt == self.pad_id  # nn convention: True = blocked
        causal = torch.ones(t, t, dtype=torch.bool, device=tgt.device).triu(1)  # True = blocked
        x = self.positional(self.src_embed(src))
        y = self.positional(self.tgt_embed(tgt))
        h = self.core(x, y, tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
                      memory_key_padding_mask=src_pad)
        return self.generator(h)


def copy_weights(ours: torch_impl.Transformer, base: NNTransformerBaseline) -> None:
    """Our q/k/v/output projections, FFN and norms into nn's packed layout (in_proj = [q; k; v])."""
    def attn(dst: nn.MultiheadAttention, src) -> None:
        dst.in_proj_weight.copy_(torch.cat([src.query.weight, src.key.weight, src.value.weight]))
        dst.in_proj_bias.copy_(torch.cat([src.query.bias, src.key.bias, src.value.bias]))
        dst.out_proj.weight.copy_(src.output.weight)
        dst.out_proj.bias.copy_(src.output.bias)

    def norm(dst: nn.LayerNorm, src) -> None:
        dst.weight.copy_(src.gamma)
        dst.bias.copy_(src.beta)

    def ffn(dst, src) -> None:
        for a, b in ((dst.linear1, src.inner), (dst.linear2, src.outer)):
            a.weight.copy_(b.weight)
            a.bias.copy_(b.bias)

    with torch.no_grad():
        for dst, src in zip(base.core.encoder.layers, ours.encoder.layers):
            attn(dst.self_attn, src.self_attn)
            norm(dst.norm1, src.self_attn_norm)
            ffn(dst, src.ffn)
            norm(dst.norm2, src.ffn_norm)
        for dst, src in zip(base.core.decoder.layers, ours.decoder.layers):
            attn(dst.self_attn, src.self_attn)
            norm(dst.norm1, src.self_attn_norm)
            attn(dst.multihead_attn, src.cross_attn)
            norm(dst.norm2, src.cross_attn_norm)
            ffn(dst, src.ffn)
            norm(dst.norm3, src.ffn_norm)


def model_flops(c: TransformerConfig, b: int, s: int, t: int) -> int:
    """Multiply-add FLOPs (2 per MAC) of one forward, attention matmuls included."""
    d, f, v = c.d_model, c.d_ff, c.tgt_vocab
    enc = 4 * 2 * b * s * d * d + 2 * 2 * b * s * s * d + 2 * 2 * b * s * d * f
    dec = (4 * 2 * b * t * d * d + 2 * 2 * b * t * t * d  # self-attention
           + 2 * 2 * b * t * d * d + 2 * 2 * b * s * d * d + 2 * 2 * b * t * s * d  # cross-attention
           + 2 * 2 * b * t * d * f)  # feed-forward
    return c.n_encoder_layers * enc + c.n_decoder_layers * dec + 2 * b * t * d * v


def inputs(c: TransformerConfig) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    src = torch.randint(3, c.src_vocab, (BATCH, SRC_LEN), generator=g)
    tgt = torch.randint(3, c.tgt_vocab, (BATCH, TGT_LEN), generator=g)
    tgt[:, 0] = c.bos_id
    for row in range(BATCH):  # 64, 60, ..., 36 real tokens at length 64 (at most half padding)
        pad = 4 * row % (SRC_LEN // 2)
        src[row, SRC_LEN - pad:] = c.pad_id
        tgt[row, TGT_LEN - pad:] = c.pad_id
    return src, tgt


def forward(model: nn.Module, src: torch.Tensor, tgt: torch.Tensor, autocast) -> None:
    with torch.inference_mode(), autocast:
        model(src, tgt)


def training_steps(models: dict, src: torch.Tensor, tgt: torch.Tensor, pad_id: int, autocast) -> dict:
    """One training step per model (train mode, the loss on float32 logits, backward, Adam), as
    callables; each model its own optimizer (the shared embedding and generator get both's steps,
    which changes the numbers, not the work)."""
    target = tgt.roll(-1, dims=1)
    steps = {}
    for name, model in models.items():
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

        def step(model=model, optimizer=optimizer) -> None:
            optimizer.zero_grad(set_to_none=True)
            with autocast:
                logits = model(src, tgt)
            loss = nn.functional.cross_entropy(logits.float().flatten(0, 1), target.flatten(),
                                               ignore_index=pad_id)
            loss.backward()
            optimizer.step()
        steps[name] = step
    return steps


def time_once(fn, sync=lambda: None) -> float:
    sync()
    start = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> None:
    global BATCH, SRC_LEN, TGT_LEN
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=15, help="timed calls of each model")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--threads", type=thread_count, default=None,
                        help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"],
                        help="cpu or cuda (TF32 off, as in the parity tests)")
    parser.add_argument("--precision", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="both models under torch.autocast in this dtype (torch_impl.precision)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=64, help="source and target tokens")
    parser.add_argument("--train", action="store_true", help="time training steps, not forward passes")
    args = parser.parse_args(argv)
    BATCH, SRC_LEN, TGT_LEN = args.batch, args.length, args.length
    if args.device == "cuda":
        if why := cuda_missing():
            parser.error(f"--device cuda: {why}")
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    warnings.filterwarnings("ignore", message=".*nested tensors is in prototype stage.*")
    config = TransformerConfig.preset("base")
    ours = torch_impl.Transformer(config).eval()
    torch_impl.precision.set_precision(ours, args.precision)  # its kept weights in this precision
    models = {"torch_impl": ours}
    if not args.train:  # a training step has only the modules' pass
        models["torch_impl (modules)"] = ModulesPass(ours)
        ours.requires_grad_(False)  # forward passes only: frozen, as a teacher is
        models["torch_impl (frozen, grad on)"] = FrozenPass(ours)
    for label, nested in (("nn.Transformer", True), ("nn.Transformer (no nested)", False)):
        models[label] = NNTransformerBaseline(ours, nested=nested).eval()
        copy_weights(ours, models[label])
    src, tgt = inputs(config)
    for model in models.values():
        model.to(args.device)
    src, tgt = src.to(args.device), tgt.to(args.device)
    autocast = (torch.autocast(args.device, dtype=getattr(torch, args.precision))
                if args.precision != "float32" else contextlib.nullcontext())
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)
    where = torch.cuda.get_device_name() if args.device == "cuda" else "CPU"
    print(f"torch {torch.__version__} on {args.device} ({where}), "
          f"precision {args.precision}, {torch.get_num_threads()} threads, "
          f"mkldnn={torch.backends.mkldnn.is_available()}, mha fast path enabled="
          f"{torch.backends.mha.get_fastpath_enabled()}; preset base float32, batch {BATCH}, src {SRC_LEN} / "
          f"tgt {TGT_LEN} tokens with padding ({int((src != config.pad_id).sum())} / {src.numel()} real "
          f"source tokens), {config.n_encoder_layers}+{config.n_decoder_layers} layers")

    flops = model_flops(config, BATCH, SRC_LEN, TGT_LEN)
    x = torch.randn(BATCH * TGT_LEN, config.d_model, device=args.device)
    w = torch.randn(config.d_model, config.d_ff, device=args.device)
    mm_flops = 2 * x.shape[0] * x.shape[1] * w.shape[1]
    with torch.inference_mode(), autocast:
        a = ours(src, tgt)
        real = tgt != config.pad_id  # compare where targets are real
        for label, model in list(models.items())[1:]:
            try:
                diff = (a - model(src, tgt)).abs()[real].max().item()
            except RuntimeError as error:  # nn's fused encoder under CPU autocast: "expected Float"
                if args.train:  # the fused path is eval's only; its training steps still run
                    print(f"same maths not checked for {label} (its eval pass raised: "
                          f"{str(error).splitlines()[0]}); its training steps are timed")
                else:
                    print(f"skipped {label}: {str(error).splitlines()[0]}")
                    del models[label]
                continue
            print(f"same maths: max |torch_impl - {label}| on real target positions = {diff:.2e} "
                  f"(logit scale {a.abs().max().item():.2f})")
        if "nn.Transformer" in models:
            encoder = models["nn.Transformer"].core.encoder
            print("nn.Transformer encoder in eval/no-grad: fused fast path "
                  "(torch._transformer_encoder_layer_fwd) "
                  f"{'with' if encoder.use_nested_tensor else 'without'} nested tensors, which skip "
                  "padded source tokens; the decoder has no fast path. '(no nested)' computes every "
                  "token, as we do.")
    times: dict[str, list[float]] = {name: [] for name in [*models, "matmul"]}
    work = training_steps(models, src, tgt, config.pad_id, autocast) if args.train else {
        name: (lambda m=model: forward(m, src, tgt, autocast)) for name, model in models.items()}
    for _ in range(args.warmup):
        for step in work.values():
            step()
    for _ in range(args.repeats):  # interleaved: A, B, C, matmul, A, B, C, ...
        for name, step in work.items():
            times[name].append(time_once(step, sync))
        times["matmul"].append(min(time_once(lambda: x @ w, sync) for _ in range(5)))

    med = {name: statistics.median(t) for name, t in times.items()}
    if args.train:  # a training step: forward, backward (twice the forward's products) and Adam
        flops *= 3
        print("timed: training steps (train mode, cross-entropy on float32 logits, backward, Adam)")
    print(f"model FLOPs per {'training step' if args.train else 'forward'} (analytic, every token "
          f"counted): {flops / 1e9:.1f} GFLOP")
    for name in models:
        print(f"{name:28s} median {med[name] * 1e3:8.1f} ms  {flops / med[name] / 1e9:6.1f} GFLOP/s  "
              f"(min {min(times[name]) * 1e3:.1f}, max {max(times[name]) * 1e3:.1f})")
    print(f"{'matmul ' + str(tuple(x.shape)) + ' @ ' + str(tuple(w.shape)):28s} median "
          f"{med['matmul'] * 1e3:8.2f} ms  {mm_flops / med['matmul'] / 1e9:6.1f} GFLOP/s")
    for label in list(models)[1:]:
        # per round too: a slow spell of the machine (bfloat16 training steps on an H100 ranged
        # 44 to 67 ms in one run) then hits both calls of the round, not one model's median
        rounds = statistics.median(a / b for a, b in zip(times["torch_impl"], times[label]))
        print(f"ratio torch_impl / {label} = {med['torch_impl'] / med[label]:.3f} of the medians, "
              f"{rounds:.3f} the median of the rounds' ratios (target <= 1.0)")


if __name__ == "__main__":
    main()
