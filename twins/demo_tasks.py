"""The two demo tasks for `twins train` / `decode` / `figures`: model configs, training settings,
data streams, held-out sets and the text of inputs and outputs. NumPy only (no framework import).

Data is a pure function of the seed, so both backends see the same numbers:

* the training batch of step ``k`` (counted from 1) is drawn from ``numpy.random.default_rng([seed,
  k])``: the same in torch and TF, and the same whether a run went straight through or was resumed;
* the held-out set is the first ``N`` examples of one fixed stream (`HELDOUT_SEED`), the same for
  every run and seed, so accuracies compare across runs; training never sees its first
  `HELDOUT_EXCLUDED` sources (an example whose source text is among them is skipped).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from shared import TransformerConfig
from shared import tasks as data

TASKS = ("copy", "dates")
HELDOUT_SEED = 20170612  # the day "Attention is all you need" appeared on arXiv
HELDOUT_EXCLUDED = 1000
# The most held-out examples one command decodes or scores (`twins decode --heldout`, `twins train
# --heldout`): the stream is drawn in memory first (10**8 grew until the memory ran out), and a
# score over 10**5 examples is as exact as anyone reads it.
MAX_HELDOUT = 100_000
# Rows decoded at once by `twins decode` and by train's evaluation. A --src-file of 10**5 lines was
# one batch: its buffers (rows x beams x max_new, the encoder's memory, ONNX Runtime's arena)
# outgrew the memory in every backend, each failing with its own allocator's error; so did train's
# --heldout 10**6. A row's search never reads another row's.
CHUNK_ROWS = 256


@dataclass(frozen=True)
class TaskSpec:
    """What a task needs: its vocabulary, the model it trains by default, and the training settings."""
    name: str
    vocab: int  # src_vocab == tgt_vocab
    target_len: int  # target tokens (EOS not counted); greedy decoding runs target_len + 1 steps
    shortest_source: int  # the fewest source tokens an example has (a floor of a batch's width)
    model: dict  # TransformerConfig fields (the vocabulary and special ids are added)
    batch: int
    warmup: int
    factor: float
    smoothing: float
    steps: int  # what reaches docs/demos.md's target on a 2-core CPU
    eval_every: int
    heldout: int
    example: tuple = field(default_factory=tuple)


SPECS = {
    # The Annotated Transformer's copy task (N=2, Noam warmup 400), with a model one eighth as wide
    # (d_model=512 is far more than copying 10 symbols needs on a CPU). Its factor 1 and no
    # smoothing gave loss spikes here (held-out exact match falling from 100% to 0-80% at times);
    # half the rate, smoothing 0.1 and batches of 128 reach 100% by step 300 and stay there
    # (seeds 0-2, both backends; docs/demos.md).
    "copy": TaskSpec(
        name="copy", vocab=data.COPY_VOCAB, target_len=data.COPY_LENGTH,
        shortest_source=data.COPY_LENGTH,
        model=dict(d_model=64, n_heads=4, d_ff=128, n_encoder_layers=2, n_decoder_layers=2,
                   dropout=0.0, max_len=64, norm_first=True, norm_style="annotated", norm_eps=1e-6),
        batch=128, warmup=400, factor=0.5, smoothing=0.1, steps=600, eval_every=100, heldout=100,
        example=("12 5 7 9 11 13 4 6 8 10",)),
    # Dates: the source demo's size (d_model=64, 4 heads), 2+2 layers, FFN 256: >= 95% of the
    # held-out dates by step 750-1250, 99.5-100% at step 3000 (seeds 0 and 1, both backends;
    # docs/demos.md). No dropout: every batch is fresh data.
    "dates": TaskSpec(
        name="dates", vocab=len(data.VOCAB), target_len=10,
        shortest_source=6,  # CLDR's short form M/d/yy: "1/1/00"
        model=dict(d_model=64, n_heads=4, d_ff=256, n_encoder_layers=2, n_decoder_layers=2,
                   dropout=0.0, max_len=64, norm_first=True, norm_style="standard", norm_eps=1e-6),
        batch=64, warmup=400, factor=1.0, smoothing=0.1, steps=3000, eval_every=250, heldout=1000,
        example=("saturday february 2 2019", "2/2/19", "1969 17 july", "dec 31 1999")),
}


def spec(task: str) -> TaskSpec:
    if task not in SPECS:
        raise ValueError(f"--task: expected one of {list(TASKS)}, got {task!r}")
    return SPECS[task]


def task_config(task: str, preset: str | None = None, config_file: str | None = None
                ) -> TransformerConfig:
    """The model of ``task``: its default, or the architecture of a named preset / a config file
    with the task's vocabulary and special ids (a config file must already match them)."""
    s = spec(task)
    fixed = dict(src_vocab=s.vocab, tgt_vocab=s.vocab, pad_id=data.PAD_ID, bos_id=data.BOS_ID,
                 eos_id=data.EOS_ID)
    if config_file:
        from .loading import config_file as read_config  # here: loading imports the format registry
        config = read_config(config_file)
        wrong = {k: (getattr(config, k), v) for k, v in fixed.items() if getattr(config, k) != v}
        if wrong:
            raise ValueError(f"--config {config_file}: the {task} task needs "
                             + ", ".join(f"{k}={v}" for k, (_, v) in wrong.items())
                             + "; the file has " + ", ".join(f"{k}={got}" for k, (got, _) in wrong.items()))
    elif preset:
        config = TransformerConfig.preset(preset, **fixed)
    else:
        config = TransformerConfig(**s.model, **fixed)
    longest = 32 if task == "dates" else data.COPY_LENGTH + 2
    if config.max_len < longest:
        raise ValueError(f"the {task} task needs max_len >= {longest}, the config has {config.max_len}")
    return config


def infer_task(config: TransformerConfig, remedy: str = "pass --task") -> str:
    """The task a checkpoint was trained for, from its vocabulary (when no train log says it);
    ``remedy``: what the command's user can do where none fits (``--task`` where it has one)."""
    for name, s in SPECS.items():
        if config.src_vocab == s.vocab and config.tgt_vocab == s.vocab:
            return name
    raise ValueError(f"cannot tell the task from the checkpoint (vocabularies {config.src_vocab}/"
                     f"{config.tgt_vocab}; copy has {SPECS['copy'].vocab}, dates {SPECS['dates'].vocab}): "
                     f"{remedy}")


def check_config(task: str, config: TransformerConfig) -> None:
    s = spec(task)
    if (config.src_vocab, config.tgt_vocab) != (s.vocab, s.vocab) or (
            config.pad_id, config.bos_id, config.eos_id) != (data.PAD_ID, data.BOS_ID, data.EOS_ID):
        raise ValueError(f"the checkpoint does not fit the {task} task: it needs vocabularies of "
                         f"{s.vocab} with pad/bos/eos {data.PAD_ID}/{data.BOS_ID}/{data.EOS_ID}, the "
                         f"checkpoint has {config.src_vocab}/{config.tgt_vocab} and {config.pad_id}/"
                         f"{config.bos_id}/{config.eos_id}")


# -- data -----------------------------------------------------------------------------------------
def _examples(task: str, n: int, seed) -> data.TaskData:
    if task == "copy":
        pairs = data.copy_examples(n, seed)
        return data.TaskData([s for s, _ in pairs], [t for _, t in pairs])
    texts = data.date_examples(n, seed)
    return data.TaskData([data.encode_text(h) for h, _ in texts],
                         [data.encode_text(d) for _, d in texts], texts)


def heldout(task: str, n: int) -> data.TaskData:
    """The first ``n`` examples of the task's fixed held-out stream."""
    if n < 1:
        raise ValueError(f"--heldout: expected a positive int, got {n}")
    return _examples(task, n, HELDOUT_SEED)


class TrainingData:
    """``batch(step)``: the training batch of a step, a pure function of (task, seed, step, size);
    target inputs start with ``start_id`` (the model's ``config.start_id``)."""

    def __init__(self, task: str, seed: int, batch: int, start_id: int = data.BOS_ID):
        self.task, self.seed, self.size, self.start_id = task, seed, batch, start_id
        held = heldout(task, HELDOUT_EXCLUDED)
        self.excluded = {tuple(s) for s in held.sources}

    def batch(self, step: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        drawn = _examples(self.task, self.size + self.size // 4 + 4, [self.seed, step])
        keep = [i for i, s in enumerate(drawn.sources) if tuple(s) not in self.excluded][: self.size]
        extra = 0
        while len(keep) < self.size:  # never in practice: a quarter more than needed is drawn
            extra += 1
            more = _examples(self.task, self.size, [self.seed, step, extra])
            drawn = data.TaskData(drawn.sources + more.sources, drawn.targets + more.targets)
            keep = [i for i, s in enumerate(drawn.sources) if tuple(s) not in self.excluded][: self.size]
        return data.batch_sequences([drawn.sources[i] for i in keep], [drawn.targets[i] for i in keep],
                                    self.start_id)


def pad(sequences: list[list[int]]) -> np.ndarray:
    """Id lists -> ``(B, S)`` int64 padded with PAD."""
    src = np.full((len(sequences), max(len(s) for s in sequences)), data.PAD_ID, dtype=np.int64)
    for i, s in enumerate(sequences):
        src[i, : len(s)] = s
    return src


# -- text in and out ------------------------------------------------------------------------------
def parse_input(task: str, text: str) -> list[int]:
    """A command-line input -> source ids: dates are text (lower-cased, commas dropped, spaces
    collapsed, as the training data); copy is space-separated symbol ids."""
    if task == "dates":
        clean = " ".join(text.lower().replace(",", "").split())
        if not clean:
            raise ValueError(f"input {text!r}: expected a date, got an empty string")
        unknown = sorted({ch for ch in clean if ch not in data.CHARS})
        if unknown:
            raise ValueError(f"input {text!r}: characters outside the vocabulary {unknown}; "
                             f"expected {data.CHARS!r}")
        return data.encode_text(clean)
    lo, hi = len(data.SPECIALS), data.COPY_VOCAB - 1
    words = text.split()
    if not all(w.isascii() and w.isdigit() for w in words):  # int() takes "1_0", "+5", "٤": --src does not
        raise ValueError(f"input {text!r}: the copy task expects space-separated symbol ids "
                         f"{lo}..{hi} (ASCII digits), e.g. '4 5 6 7'")
    ids = [int(w) for w in words]
    if not ids or any(not lo <= i <= hi for i in ids):
        raise ValueError(f"input {text!r}: the copy task expects space-separated symbol ids "
                         f"{lo}..{hi}, got {ids}")
    return ids


def format_output(task: str, tokens) -> str:
    """Decoded tokens (stopping at EOS) -> text: the date, or the ids separated by spaces."""
    ids = strip(tokens)
    if task == "dates":
        return data.decode_text(ids)
    return " ".join(str(i) for i in ids)


def strip(tokens) -> list[int]:
    """Tokens up to (not including) the first EOS; padding never follows a live token."""
    out = []
    for t in np.asarray(tokens).tolist():
        if t == data.EOS_ID:
            break
        out.append(int(t))
    return out


def exact(tokens: np.ndarray, targets: list[list[int]]) -> np.ndarray:
    """Per example: the decoded sequence (up to EOS, which must come) equals the target."""
    return np.array([strip(row) == list(t) and data.EOS_ID in np.asarray(row).tolist()
                     for row, t in zip(tokens, targets)], dtype=bool)


def resolve_task(given: str | None, log: dict | None, config: TransformerConfig) -> str:
    """The demo task of a checkpoint: ``--task`` as given (it must agree with the run's log), else
    the log's, else the one its vocabulary fits; checked against the config."""
    task = given or (log or {}).get("task") or infer_task(config)
    if log and given and log.get("task") != given:
        raise ValueError(f"--task {given}: the checkpoint's train log says {log.get('task')}")
    check_config(task, config)
    return task
