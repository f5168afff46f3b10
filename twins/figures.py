"""`twins figures --out DIR`: the pictures of the sources, drawn from this project's code (matplotlib,
headless).

Always written:

* ``positional_encoding.png``: the interleaved sinusoidal table (`shared.positional`) as a heatmap,
  and a few of its columns against position;
* ``masks.png``: for a small padded batch of the dates task, the source padding mask, the subsequent
  mask and the combined target mask (`shared.masks`; True = may attend);
* ``noam.png``: the Noam learning rate (`shared.schedule`) for the sources' (d_model, warmup) pairs,
  and for the demo tasks' settings.

With ``--checkpoint DIR`` (runs of `twins train`; repeat it) or ``--log FILE`` (their
train_log.json files):

* ``training_<task>.png``: loss and held-out exact match against the step, every run of a task on
  one plot (a torch run and a TF run from the same seed side by side);
* ``attention_<task>.png`` (``--checkpoint`` only, the first run of each task): the same weights
  loaded in torch_impl and in tf_impl, the same input, the attention weights of the last layer's
  encoder self-attention, decoder self-attention and cross-attention, every head, torch beside TF;
  the largest difference between the two is in the title.
"""
from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np

from shared import formats
from shared.checks import int_argument
from shared.paths import kind, replaced
from shared.saving import write_atomically
from shared import tasks as data
from shared.masks import make_src_mask, make_tgt_mask, subsequent_mask
from shared.positional import positional_encoding
from shared.schedule import noam_lr

from . import demo_tasks as tasks

STATIC = ("positional_encoding.png", "masks.png", "noam.png")
COLORS = {"torch": "#ee4c2c", "tf": "#1f77b4"}  # PyTorch orange-red, TensorFlow blue


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", help="folder for the PNG files")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="PATH",
                        help="a run directory of `twins train` (repeatable): its training curve, and "
                             "for the first run of each task the attention figure; or a demo model "
                             "in any readable format (`twins convert --list-formats`): its attention")
    parser.add_argument("--log", action="append", default=[], metavar="FILE",
                        help="a train_log.json (repeatable): its training curve")
    parser.add_argument("--input", action="append", default=[], metavar="TEXT",
                        help="the input of the attention figure of its task (default: an example)")
    parser.add_argument("--dpi", type=dpi, default=110, metavar=f"[{DPI_MIN}, {DPI_MAX}]",
                        help="dots per inch of the PNG files (default 110)")


# Print quality is 300 dpi; 600 leaves room. Beyond it a figure's pixels alone outgrow the memory
# (the attention figure of a model of 8 heads is 13 x 30 inches: 5000 dpi would be 10**10 pixels).
DPI_MIN, DPI_MAX = 20, 600
# The most pixels a PNG is drawn at (4 bytes each in matplotlib's canvas: 1 GiB): a figure of many
# heads is tall, so a model's own n_heads can outgrow the memory at an allowed --dpi.
MAX_PIXELS = 2**28


def dpi(text: str) -> int:
    """``--dpi``: an int in [`DPI_MIN`, `DPI_MAX`], refused while the command line is parsed."""
    return int_argument(text, DPI_MIN, DPI_MAX)


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def _save(fig, path: Path, dpi: int) -> Path:
    """Draw ``fig`` into the PNG ``path``, atomically (a FIFO, device or directory there is refused,
    `shared.saving.write_atomically`), after checking its size in pixels against `MAX_PIXELS`."""
    try:
        width, height = (float(x) * dpi for x in fig.get_size_inches())
        if width * height > MAX_PIXELS:
            raise ValueError(f"--dpi {dpi}: {path.name} would be {width:.0f} x {height:.0f} pixels, "
                             f"expected at most {MAX_PIXELS} pixels; lower --dpi")
        write_atomically(path, lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight",
                                                       format="png"), suffix=".png")
    finally:
        _pyplot().close(fig)
    return path


# -- static figures -------------------------------------------------------------------------------
def positional_figure(path: Path, dpi: int, max_len: int = 100, d_model: int = 128) -> Path:
    plt = _pyplot()
    pe = positional_encoding(max_len, d_model)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.6), gridspec_kw={"width_ratios": [1.25, 1]},
                                   layout="constrained")
    im = ax1.imshow(pe, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, origin="upper")
    ax1.set_xlabel("dimension i (even: sin, odd: cos)")
    ax1.set_ylabel("position p")
    ax1.set_title(f"Positional encoding, max_len={max_len}, d_model={d_model} (interleaved)")
    fig.colorbar(im, ax=ax1, label="PE[p, i]")
    for i in (10, 11, 24, 40):
        wavelength = 2 * np.pi * 10000 ** ((i - i % 2) / d_model)
        ax2.plot(np.arange(max_len), pe[:, i],
                 label=f"dim {i} ({'sin' if i % 2 == 0 else 'cos'}, wavelength {wavelength:.0f})")
    ax2.set_xlabel("position p")
    ax2.set_ylabel("value")
    ax2.set_title("Four columns: wavelengths grow geometrically with i")
    ax2.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncol=2, fontsize=8, frameon=False)
    ax2.grid(alpha=0.3)
    return _save(fig, path, dpi)


def _bool_panel(ax, mask: np.ndarray, title: str, xlabels, ylabels, xlabel: str, ylabel: str):
    from matplotlib.colors import ListedColormap
    ax.imshow(mask.astype(float), cmap=ListedColormap(["#d9d9d9", "#2ca02c"]), vmin=0, vmax=1,
              aspect="equal")
    ax.set_xticks(range(len(xlabels)), xlabels, fontsize=8)
    ax.set_yticks(range(len(ylabels)), ylabels, fontsize=8)
    ax.set_xticks(np.arange(-0.5, len(xlabels)), minor=True)
    ax.set_yticks(np.arange(-0.5, len(ylabels)), minor=True)
    ax.grid(which="minor", color="white", linewidth=1)
    ax.tick_params(which="minor", length=0)
    ax.set_title(title, fontsize=10)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)


def masks_figure(path: Path, dpi: int) -> Path:
    plt = _pyplot()
    from matplotlib.patches import Patch
    texts = ["2/2/19", "dec 31 1999", "jan 1 2000"]
    src = tasks.pad([data.encode_text(t) for t in texts])
    targets = [data.encode_text(t) for t in ("2019-02-02", "1999", "2000-01-01")]
    _, tgt_in, _ = data.batch_sequences([[4]] * 3, targets)
    item = 1  # a target shorter than the batch's: padding shows in the combined mask
    src_mask = make_src_mask(src, data.PAD_ID)[:, 0, 0, :]  # (B, S)
    sub = subsequent_mask(tgt_in.shape[1])[0, 0]
    tgt_mask = make_tgt_mask(tgt_in, data.PAD_ID)[item, 0]
    tgt_labels = [_token(t) for t in tgt_in[item]]
    fig, axes = plt.subplots(1, 3, figsize=(16, 5.2), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    _bool_panel(axes[0], src_mask, "Source padding mask (B, 1, 1, S), shown (B, S)",
                [str(i) for i in range(src.shape[1])], [repr(t) for t in texts], "key position",
                "batch item")
    n = tgt_in.shape[1]
    _bool_panel(axes[1], sub, f"Subsequent mask ({n}, {n})", range(n), range(n), "key position",
                "query position")
    _bool_panel(axes[2], tgt_mask, f"Target mask = padding AND subsequent\n(item {item}: "
                f"{data.decode_text(targets[item])!r} + padding)", tgt_labels, tgt_labels,
                "key token", "query token")
    fig.legend(handles=[Patch(color="#2ca02c", label="True: may attend"),
                        Patch(color="#d9d9d9", label="False: blocked (weight exactly 0)")],
               loc="lower center", ncol=2, frameon=False, bbox_to_anchor=(0.5, -0.04))
    fig.suptitle("Masks are boolean, True = may attend (docs/design.md, convention 2)", y=1.0)
    return _save(fig, path, dpi)


def noam_figure(path: Path, dpi: int) -> Path:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.6))
    steps = np.arange(1, 20001)
    for d, w in ((512, 4000), (512, 8000), (256, 4000)):
        ax1.plot(steps, noam_lr(steps, d, w), label=f"d_model={d}, warmup={w}")
    ax1.set_title("Noam schedule, factor 1 (the sources' three curves)")
    for name, s in tasks.SPECS.items():
        d = s.model["d_model"]
        steps = np.arange(1, s.steps + 1)
        ax2.plot(steps, noam_lr(steps, d, s.warmup, s.factor),
                 label=f"{name}: d_model={d}, warmup={s.warmup}, factor={s.factor}")
    ax2.set_title("The demo tasks' schedules (their default steps)")
    for ax in (ax1, ax2):
        ax.set_xlabel("step")
        ax.set_ylabel("learning rate")
        ax.ticklabel_format(axis="y", style="sci", scilimits=(0, 0))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=9)
    fig.suptitle("lr = factor * d_model^-0.5 * min(step^-0.5, step * warmup^-1.5)", y=1.01)
    return _save(fig, path, dpi)


# -- training curves ------------------------------------------------------------------------------
def _label(log: dict, where: str) -> str:
    backends = []
    for seg in log.get("segments", []):
        if not backends or backends[-1] != seg["backend"]:
            backends.append(seg["backend"])
    secs = sum(seg.get("seconds", 0.0) for seg in log.get("segments", []))
    return f"{' then '.join(backends) or '?'} ({where}, seed {log.get('seed')}, {secs:.0f} s)"


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window < 2:
        return values
    kernel = np.ones(window) / window
    head = np.array([values[: i + 1].mean() for i in range(window - 1)])
    return np.concatenate([head, np.convolve(values, kernel, mode="valid")])


def training_figure(path: Path, dpi: int, task: str, runs: list[tuple[str, dict]]) -> Path:
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.6))
    styles = ["-", "--", ":", "-."]
    for i, (where, log) in enumerate(runs):
        backend = log["segments"][0]["backend"] if log.get("segments") else "torch"
        color = COLORS.get(backend) if sum(1 for _, l in runs if l.get("segments") and
                                           l["segments"][0]["backend"] == backend) == 1 else None
        steps = np.asarray(log["history"]["step"])
        loss = np.asarray(log["history"]["loss"], dtype=float)
        window = max(1, len(steps) // 100)
        label = _label(log, where)
        ax1.plot(steps, _smooth(loss, window), styles[i % 4], color=color, label=label, linewidth=1.4)
        evals = log.get("evals", [])
        if evals:
            ax2.plot([e["step"] for e in evals], [100 * e["accuracy"] for e in evals],
                     styles[i % 4], marker="o", markersize=4, color=color, label=label)
    ax1.set_ylim(bottom=0)
    ax1.set_xlabel("step")
    smoothing = runs[0][1].get("settings", {}).get("smoothing")
    ax1.set_ylabel("training loss (moving mean)")
    if smoothing:
        ax1.set_ylabel(f"training loss, label smoothing {smoothing} (moving mean)")
    ax1.set_title(f"{task}: training loss")
    n = runs[0][1].get("evals", [{}])[-1].get("n", "?") if runs[0][1].get("evals") else "?"
    ax2.set_xlabel("step")
    ax2.set_ylabel("exact match (%)")
    ax2.set_ylim(-2, 102)
    ax2.set_title(f"{task}: held-out exact match (greedy, {n} examples)")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return _save(fig, path, dpi)


# -- attention ------------------------------------------------------------------------------------
def _token(t: int) -> str:
    t = int(t)
    if t < len(data.SPECIALS):
        return data.SPECIALS[t].strip("<>").upper()
    return data.VOCAB[t] if data.VOCAB[t] != " " else "␣"


def _copy_token(t: int) -> str:
    return _token(t) if int(t) < len(data.SPECIALS) else str(int(t))


def attention_figure(path: Path, dpi: int, task: str, checkpoint: str, text: str | None) -> Path:
    from .backends import make_adapter
    from .runs import read_log
    plt = _pyplot()
    config, weights = formats.read(checkpoint)
    tasks.resolve_task(task, read_log(checkpoint), config)
    spec = tasks.spec(task)
    text = text or spec.example[0]
    src = tasks.pad([tasks.parse_input(task, text)])
    backends = {name: make_adapter(name, config, weights) for name in ("torch", "tf")}
    tokens = backends["torch"].greedy(src, spec.target_len + 1).tokens[0]
    out = tasks.strip(tokens)
    tgt = np.array([[data.BOS_ID, *out]], dtype=np.int64)  # the decoder input that produced `out`
    traces = {name: b.trace(src, tgt) for name, b in backends.items()}
    name_of = _copy_token if task == "copy" else _token
    src_labels = [name_of(t) for t in src[0]]
    in_labels = [name_of(t) for t in tgt[0]]
    layer_e, layer_d = config.n_encoder_layers - 1, config.n_decoder_layers - 1
    kinds = [(f"encoder.layers.{layer_e}.self_attn.weights", "encoder self-attention", src_labels,
              src_labels),
             (f"decoder.layers.{layer_d}.self_attn.weights", "decoder self-attention", in_labels,
              in_labels),
             (f"decoder.layers.{layer_d}.cross_attn.weights", "cross-attention", in_labels, src_labels)]
    heads = config.n_heads
    diff = max(float(np.abs(traces["torch"][k] - traces["tf"][k]).max()) for k, *_ in kinds)
    cols = 1 if heads == 1 else 2
    rows = -(-heads // cols)
    panel = 2.3 if task == "copy" else 2.9
    fig = plt.figure(figsize=(2 * cols * panel + 1.6, len(kinds) * (rows * panel * 0.8 + 0.8)),
                     layout="constrained")
    blocks = fig.subfigures(len(kinds), 1)
    for block, (key, what, ylabels, xlabels) in zip(np.atleast_1d(blocks), kinds):
        block.suptitle(f"{what}, layer {key.split('.')[2]}: {len(ylabels)} queries x {len(xlabels)} "
                       "keys", fontsize=11, fontweight="bold")
        axes = block.subplots(rows, 2 * cols, squeeze=False,
                              gridspec_kw={"wspace": 0.15 if task == "copy" else 0.1})
        for b, name in enumerate(("torch", "tf")):
            weights_ = traces[name][key][0]  # (H, Q, K)
            for h in range(rows * cols):
                ax = axes[h // cols, b * cols + h % cols]
                if h >= heads:
                    ax.axis("off")
                    continue
                im = ax.imshow(weights_[h], cmap="viridis", vmin=0, vmax=1, aspect="auto")
                ax.set_xticks(range(len(xlabels)), xlabels, fontsize=6,
                              rotation=90 if task == "copy" else 0)
                ax.set_yticks(range(len(ylabels)), ylabels, fontsize=6)
                ax.tick_params(length=1.5, pad=1)
                ax.set_title(f"{'PyTorch' if name == 'torch' else 'TensorFlow'}, head {h}", fontsize=8,
                             color=COLORS[name])
                if h % cols == 0:
                    ax.set_ylabel("query: " + ("decoder input" if "decoder" in key else "source"),
                                  fontsize=7)
                if h // cols == rows - 1:
                    ax.set_xlabel("key: " + ("source" if "encoder" in key or "cross" in key
                                             else "decoder input"), fontsize=7)
        block.colorbar(im, ax=axes, shrink=0.8, label="attention weight", pad=0.01)
    shown = text if task == "dates" else " ".join(str(t) for t in src[0])
    result = data.decode_text(out) if task == "dates" else " ".join(map(str, out))
    fig.suptitle(f"{task}: the same weights ({Path(checkpoint).name}) in PyTorch and TensorFlow, "
                 f"last layer of each stack\ninput {shown!r} -> {result!r}; largest |torch - tf| over "
                 f"these weights: {diff:.1e}", fontsize=12)
    return _save(fig, path, dpi)


# -- the command ----------------------------------------------------------------------------------
def run(args) -> int:
    from .runs import read_log, read_log_file
    # (label, checkpoint or None, train log or None: a model without a run, task)
    runs: list[tuple[str, str | None, dict | None, str]] = []
    for ckpt in args.checkpoint:
        p = Path(ckpt)
        if not p.exists():
            raise FileNotFoundError(f"--checkpoint {ckpt!r}: no such file or directory")
        log = read_log(p) if p.is_dir() else None
        # a model without a run: its attention only, its task told by its vocabulary
        task = log["task"] if log else tasks.infer_task(formats.read(ckpt)[0])
        runs.append((p.name, ckpt, log, task))
    for file in args.log:
        p = Path(file)
        if not p.is_file():
            raise FileNotFoundError(f"--log {file!r}: no such file")
        log = read_log_file(p)
        runs.append((p.parent.name, None, log, log.get("task")))
    inputs: dict[str, str] = {}
    for text in args.input:  # an input goes to the task it parses for (dates text or copy ids)
        task = "copy" if all(t.isdigit() for t in text.split()) and text.strip() else "dates"
        inputs[task] = text
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r}: expected a directory, got {kind(out.stat().st_mode)}")
    # (file name, its drawing): every destination is checked before the first one is drawn
    plan = [(STATIC[0], positional_figure), (STATIC[1], masks_figure), (STATIC[2], noam_figure)]
    for task in tasks.TASKS:
        mine = [(label, ckpt, log) for label, ckpt, log, of in runs if of == task]
        curves = [(label, log) for label, _, log in mine if log is not None]
        if curves:
            plan.append((f"training_{task}.png", partial(training_figure, task=task, runs=curves)))
        first = next((ckpt for _, ckpt, _ in mine if ckpt), None)
        if first:
            plan.append((f"attention_{task}.png", partial(attention_figure, task=task,
                                                          checkpoint=first, text=inputs.get(task))))
    for name, _ in plan:  # a FIFO, device or directory in the way: refused before anything is drawn
        replaced(out / name, directory=False)
    out.mkdir(parents=True, exist_ok=True)
    written = [draw(out / name, args.dpi) for name, draw in plan]
    for path in written:
        print(path)
    return 0
