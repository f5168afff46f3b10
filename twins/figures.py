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

Nothing is written until everything has been read and checked (docs/design.md, section "Saving
and recovery"; docs/usage.md, "How every command behaves"): every --checkpoint and --log is read
and its fields checked, every --input parsed for its task and model, the attention computed in
both backends, and every destination checked (what is there is a regular file or nothing, and
none is a file the command reads: a PNG drawn over its own --log, or through a link over a
checkpoint's weights, destroyed it); only then is the --out directory made. Each figure's size in
pixels is checked before the first PNG is written, and the set is written at once: each PNG is
drawn into a temporary file before the first replaces anything, so a failure part-way (a full
disk) leaves every file as it was. Figures may be written into a run directory (a resumed run
keeps them): only the files a checkpoint is read from are kept from them.
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import numpy as np

from shared.checks import int_argument
from shared.paths import check_source, kind, replaced
from shared.saving import write_all_atomically
from shared import tasks as data
from shared.masks import make_src_mask, make_tgt_mask, subsequent_mask
from shared.positional import positional_encoding
from shared.schedule import noam_lr

from . import arguments
from . import demo_tasks as tasks
from . import loading

STATIC = ("positional_encoding.png", "masks.png", "noam.png")
COLORS = {"torch": "#ee4c2c", "tf": "#1f77b4"}  # PyTorch orange-red, TensorFlow blue


def add_arguments(parser) -> None:
    parser.add_argument("--out", required=True, metavar="DIR", type=arguments.path,
                        help="folder for the PNG files")
    parser.add_argument("--checkpoint", action="append", default=[], metavar="PATH", type=arguments.path,
                        help="a run directory of `twins train` (repeatable): its training curve, and "
                             "for the first run of each task the attention figure; or a demo model "
                             "in any readable format (`twins convert --list-formats`): its attention")
    parser.add_argument("--log", action="append", default=[], metavar="FILE", type=arguments.path,
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


def _check_size(name: str, figsize: tuple[float, float], dpi: int) -> None:
    """Refuse a figure of ``figsize`` inches whose pixels at ``dpi`` outgrow `MAX_PIXELS`, before
    it is built (a figure of many heads is tall)."""
    width, height = (float(x) * dpi for x in figsize)
    if width * height > MAX_PIXELS:
        raise ValueError(f"--dpi {dpi}: {name} would be {width:.0f} x {height:.0f} pixels, "
                         f"expected at most {MAX_PIXELS} pixels; lower --dpi")


def _save_all(figures: list[tuple[Path, object]], dpi: int) -> list[Path]:
    """Draw each ``(path, fig)`` into its PNG, the set at once: every PNG is drawn into a temporary
    file before the first replaces anything, so a failure part-way (a full disk) leaves every file
    as it was (a FIFO, device or directory there is refused; `shared.saving.write_all_atomically`)."""
    def draw(fig):
        return lambda tmp: fig.savefig(tmp, dpi=dpi, bbox_inches="tight", format="png")
    return write_all_atomically([(path, draw(fig)) for path, fig in figures], suffix=".png")


# -- static figures -------------------------------------------------------------------------------
def positional_figure(name: str, dpi: int, max_len: int = 100, d_model: int = 128):
    figsize = (13, 4.6)
    _check_size(name, figsize, dpi)
    plt = _pyplot()
    pe = positional_encoding(max_len, d_model)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize, gridspec_kw={"width_ratios": [1.25, 1]},
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
    return fig


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


def masks_figure(name: str, dpi: int):
    figsize = (16, 5.2)
    _check_size(name, figsize, dpi)
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
    fig, axes = plt.subplots(1, 3, figsize=figsize, gridspec_kw={"width_ratios": [1.6, 1, 1]})
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
    return fig


def noam_figure(name: str, dpi: int):
    figsize = (13, 4.6)
    _check_size(name, figsize, dpi)
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
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
    return fig


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


def training_figure(name: str, dpi: int, task: str, runs: list[tuple[str, dict]]):
    figsize = (13, 4.6)
    _check_size(name, figsize, dpi)
    plt = _pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=figsize)
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
    return fig


# -- attention ------------------------------------------------------------------------------------
def _token(t: int) -> str:
    t = int(t)
    if t < len(data.SPECIALS):
        return data.SPECIALS[t].strip("<>").upper()
    return data.VOCAB[t] if data.VOCAB[t] != " " else "␣"


def _copy_token(t: int) -> str:
    return _token(t) if int(t) < len(data.SPECIALS) else str(int(t))


def attention_data(task: str, checkpoint: str, config, weights, text: str | None,
                   src_ids: list[int]) -> dict:
    """What the attention figure of ``task`` shows, computed before anything is written: the model
    of ``checkpoint`` (``config``, ``weights``, checked for the task) in torch_impl and in tf_impl,
    greedy on ``src_ids`` (``text``, or the task's example when None), and the attention weights
    of the last layer of each stack."""
    from .backends import make_adapter
    spec = tasks.spec(task)
    text = text or spec.example[0]
    src = tasks.pad([src_ids])
    backends = {name: make_adapter(name, config, weights) for name in ("torch", "tf")}
    tokens = backends["torch"].greedy(src, spec.target_len + 1).tokens[0]
    out = tasks.strip(tokens)
    tgt = np.array([[data.BOS_ID, *out]], dtype=np.int64)  # the decoder input that produced `out`
    layer_e, layer_d = config.n_encoder_layers - 1, config.n_decoder_layers - 1
    keys = (f"encoder.layers.{layer_e}.self_attn.weights", f"decoder.layers.{layer_d}.self_attn.weights",
            f"decoder.layers.{layer_d}.cross_attn.weights")
    traces = {}
    for name, b in backends.items():
        trace = b.trace(src, tgt)
        traces[name] = {k: np.asarray(trace[k]) for k in keys}  # the rest of the pass is not drawn
    return {"task": task, "checkpoint": checkpoint, "heads": config.n_heads, "text": text, "src": src,
            "tgt": tgt, "out": out, "keys": keys, "traces": traces}


def _attention_layout(task: str, heads: int) -> tuple[tuple[float, float], int, int]:
    """(figsize in inches, rows, cols) of the attention figure of ``heads`` heads: three blocks
    (encoder self-attention, decoder self-attention, cross-attention), torch's heads beside TF's."""
    cols = 1 if heads == 1 else 2
    rows = -(-heads // cols)
    panel = 2.3 if task == "copy" else 2.9
    return (2 * cols * panel + 1.6, 3 * (rows * panel * 0.8 + 0.8)), rows, cols


def attention_figure(name: str, dpi: int, found: dict):
    """The attention figure of `attention_data`'s ``found``."""
    task, heads, traces = found["task"], found["heads"], found["traces"]
    src, tgt, out, text = found["src"], found["tgt"], found["out"], found["text"]
    figsize, rows, cols = _attention_layout(task, heads)
    _check_size(name, figsize, dpi)
    plt = _pyplot()
    name_of = _copy_token if task == "copy" else _token
    src_labels = [name_of(t) for t in src[0]]
    in_labels = [name_of(t) for t in tgt[0]]
    key_e, key_d, key_c = found["keys"]
    kinds = [(key_e, "encoder self-attention", src_labels, src_labels),
             (key_d, "decoder self-attention", in_labels, in_labels),
             (key_c, "cross-attention", in_labels, src_labels)]
    diff = max(float(np.abs(traces["torch"][k] - traces["tf"][k]).max()) for k, *_ in kinds)
    fig = plt.figure(figsize=figsize, layout="constrained")
    blocks = fig.subfigures(len(kinds), 1)
    for block, (key, what, ylabels, xlabels) in zip(np.atleast_1d(blocks), kinds):
        block.suptitle(f"{what}, layer {key.split('.')[2]}: {len(ylabels)} queries x {len(xlabels)} "
                       "keys", fontsize=11, fontweight="bold")
        axes = block.subplots(rows, 2 * cols, squeeze=False,
                              gridspec_kw={"wspace": 0.15 if task == "copy" else 0.1})
        for b, backend in enumerate(("torch", "tf")):
            weights_ = traces[backend][key][0]  # (H, Q, K)
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
                ax.set_title(f"{'PyTorch' if backend == 'torch' else 'TensorFlow'}, head {h}",
                             fontsize=8, color=COLORS[backend])
                if h % cols == 0:
                    ax.set_ylabel("query: " + ("decoder input" if "decoder" in key else "source"),
                                  fontsize=7)
                if h // cols == rows - 1:
                    ax.set_xlabel("key: " + ("source" if "encoder" in key or "cross" in key
                                             else "decoder input"), fontsize=7)
        block.colorbar(im, ax=axes, shrink=0.8, label="attention weight", pad=0.01)
    shown = text if task == "dates" else " ".join(str(t) for t in src[0])
    result = data.decode_text(out) if task == "dates" else " ".join(map(str, out))
    fig.suptitle(f"{task}: the same weights ({Path(found['checkpoint']).name}) in PyTorch and "
                 f"TensorFlow, last layer of each stack\ninput {shown!r} -> {result!r}; largest "
                 f"|torch - tf| over these weights: {diff:.1e}", fontsize=12)
    return fig


# -- reading and checking the inputs --------------------------------------------------------------
def _usable(log: dict, where: str) -> dict:
    """A log `twins.runs.log_problems` has checked, whose task is also one of the demos' (the
    figures of a task are drawn by its name)."""
    if log.get("task") not in tasks.TASKS:
        problem = f"task: expected one of {list(tasks.TASKS)}, got {log.get('task')!r}"[:200]
        raise ValueError(f"{where}: not a usable train log: {problem}")
    return log


def _read_log_option(file: str) -> dict:
    """The train log of ``--log FILE``, every problem naming --log: not a regular file (a
    directory, a device, a FIFO), missing, or not a usable train log."""
    from .runs import read_log_file
    check_source(file, "--log", directory=False)
    if not Path(file).exists():
        raise FileNotFoundError(f"--log {file!r}: no such file")
    try:
        log = read_log_file(file)
    except ValueError as err:  # "'FILE': not a twins train log ...": named as the option
        raise ValueError(f"--log {err}") from None
    return _usable(log, f"--log {str(file)!r}")


def _figure_name(name: str) -> bool:
    """Whether ``name`` is the name of a PNG this command writes."""
    return name in STATIC or any(name == f"{kind}_{task}.png" for kind in ("training", "attention")
                                 for task in tasks.TASKS)


def _inputs_read(checkpoints: list[str], logs: list[str]) -> list[tuple[str, str, str, Path, bool]]:
    """What the command reads, for `_check_destination`: ``(flag, path as given, the file, its
    real path, whether everything under it is read)`` for each --log, each --checkpoint file, and
    each file under a --checkpoint directory (its config, weights, train log, ...; a link to a
    folder elsewhere: all of that folder) but the figures a run directory may hold: a user may
    keep them there (a resumed run carries them, docs/design.md, "What a directory save keeps")."""
    read = [("--log", str(file), str(file), Path(file).resolve(), False) for file in logs]
    for ckpt in map(str, checkpoints):
        if not os.path.isdir(ckpt):
            read.append(("--checkpoint", ckpt, ckpt, Path(ckpt).resolve(), False))
            continue
        for root, dirs, files in os.walk(ckpt):
            for name in dirs:
                inner = os.path.join(root, name)
                if os.path.islink(inner):  # os.walk does not enter it
                    read.append(("--checkpoint", ckpt, inner, Path(inner).resolve(), True))
            for name in files:
                if not _figure_name(name):
                    inner = os.path.join(root, name)
                    read.append(("--checkpoint", ckpt, inner, Path(inner).resolve(), False))
    return read


def _check_destination(path: Path, read: list[tuple[str, str, str, Path, bool]]) -> None:
    """``path`` (a PNG) may be written: a regular file or nothing there (`shared.paths.replaced`,
    links followed), and not one of the files the command reads (`_inputs_read`), as
    `twins.loading.check_output` keeps a --json from its inputs: a figure drawn over its own --log,
    or through a link over the weights it was drawn from, destroyed them."""
    target = Path(replaced(path, directory=False)).resolve()
    for flag, given, file, real, folder in read:
        if target == real or (folder and real in target.parents):
            what = f"{flag} {given!r}" if file == given else f"{file!r}, which {flag} {given!r} reads"
            inside = "a file in " if target != real else ""
            raise ValueError(f"--out {str(path)!r}: would overwrite {inside}{what}; write elsewhere")


# -- the command ----------------------------------------------------------------------------------
def input_task(text: str, drawn) -> str:
    """The task an ``--input`` is for, of the tasks ``drawn``: the one task drawn; else the task it
    parses for, copy first (symbol ids), then dates (text). An input of digits outside the copy
    symbols (``"2019"``) is a date: it went to copy, which refused it."""
    if len(drawn) == 1:
        return next(iter(drawn))
    for task in ("copy", "dates"):
        try:
            tasks.parse_input(task, text)
        except ValueError:
            continue
        return task
    return "copy" if all(t.isdigit() for t in text.split()) and text.strip() else "dates"  # its error


def run(args) -> int:
    from .runs import LOG_FILE, read_log
    out = Path(args.out)  # not "": refused while the command line is parsed (`arguments.path`)
    if out.exists() and not out.is_dir():
        raise ValueError(f"--out {args.out!r}: expected a directory, got {kind(out.stat().st_mode)}")

    # 1. every input read and checked; nothing is written before all of them are
    models: dict[str, tuple] = {}  # checkpoint -> (config, weights), each read once

    def model(ckpt: str) -> tuple:
        if ckpt not in models:
            models[ckpt] = loading.read(ckpt, args, "--checkpoint")[1:]
        return models[ckpt]

    # (label, checkpoint or None, train log or None: a model without a run, task)
    runs: list[tuple[str, str | None, dict | None, str]] = []
    for ckpt in args.checkpoint:
        check_source(ckpt, "--checkpoint")
        p = Path(ckpt)
        if not p.exists():
            raise FileNotFoundError(f"--checkpoint {ckpt!r}: no such file or directory")
        log = read_log(p) if p.is_dir() else None
        if log is not None:
            _usable(log, repr(str(p / LOG_FILE)))
        # a model without a run: its attention only, its task told by its vocabulary
        if log:
            task = log["task"]
        else:
            config = model(ckpt)[0]
            try:
                task = tasks.infer_task(config, "figures draws the attention of copy and dates models "
                                                "only (twins train makes them)")
            except ValueError as err:
                raise ValueError(f"--checkpoint {ckpt!r}: {err}") from None
        runs.append((p.name, ckpt, log, task))
    for file in args.log:
        log = _read_log_option(file)
        runs.append((Path(file).parent.name, None, log, log["task"]))
    # the first checkpoint of each task: its attention figure, its model checked for the task
    firsts = {}
    for _, ckpt, log, task in runs:
        if ckpt is not None and task not in firsts:
            config = model(ckpt)[0]
            tasks.resolve_task(task, log, config)
            firsts[task] = ckpt
    # each attention figure's input: --input parsed for its task, or the task's example
    inputs: dict[str, tuple[str | None, list[int]]] = {}
    for text in args.input:
        if not firsts:
            raise ValueError(f"--input {text!r}: expected a --checkpoint to draw the attention of, "
                             "got none")
        task = input_task(text, firsts)
        if task in inputs:
            raise ValueError(f"--input {text!r}: expected one input per task, got a second for "
                             f"{task} (the first: {inputs[task][0]!r})")
        try:
            inputs[task] = (text, tasks.parse_input(task, text))
        except ValueError as err:  # "input 'TEXT': ...", named as the option
            raise ValueError(f"--{err}") from None
    for task, ckpt in firsts.items():
        text, ids = inputs.setdefault(task, (None, tasks.parse_input(task, tasks.spec(task).example[0])))
        max_len = model(ckpt)[0].max_len
        if len(ids) > max_len:
            what = f"--input {text!r}" if text is not None else f"the {task} example input"
            raise ValueError(f"{what}: expected at most the model's max_len={max_len} tokens "
                             f"(--checkpoint {ckpt!r}), got {len(ids)}")

    # 2. the plan, (file name, its drawing), and every destination checked against the inputs
    plan = [(STATIC[0], positional_figure), (STATIC[1], masks_figure), (STATIC[2], noam_figure)]
    for task in tasks.TASKS:
        curves = [(label, log) for label, _, log, of in runs if of == task and log is not None]
        if curves:
            plan.append((f"training_{task}.png", partial(training_figure, task=task, runs=curves)))
        if task in firsts:
            plan.append((f"attention_{task}.png", task))  # drawn from what step 3 computes
    read = _inputs_read(args.checkpoint, args.log)
    for name, _ in plan:  # a FIFO, device or directory in the way, or an input: before any drawing
        _check_destination(out / name, read)

    # 3. the attention in both backends (a model that fails to build or decode: nothing written)
    found = {}
    for task, ckpt in firsts.items():
        text, ids = inputs[task]
        found[task] = attention_data(task, ckpt, *model(ckpt), text, ids)

    # 4. the figures built (each size checked), then written as one set
    out.mkdir(parents=True, exist_ok=True)
    built = []
    try:
        for name, draw in plan:
            built.append((out / name, attention_figure(name, args.dpi, found[draw])
                          if isinstance(draw, str) else draw(name, args.dpi)))
        written = _save_all(built, args.dpi)
    finally:
        for _, fig in built:
            _pyplot().close(fig)
    for path in written:
        print(path)
    return 0
