"""The canonical, framework-neutral weights: schema, initialisation, checks and checkpoint files.

Canonical weights are a flat ``{name: numpy.ndarray}`` dict with dotted names. Dense kernels are
stored ``(in, out)`` so that ``y = x @ kernel + bias`` (the Keras layout; torch transposes at its
boundary). Tied weights are stored once: with ``share_embeddings`` there is no ``tgt_embed``, with
``tie_output`` there is no ``generator.kernel`` (the generator uses ``tgt_embed`` transposed, or
``src_embed`` when that table is shared).

Names (``{i}`` a layer index, ``{p}`` one of ``query, key, value``; ``A = n_heads * d_k``, which
is ``d_model`` unless ``config.head_dim`` says otherwise)::

    src_embed.embeddings                          (src_vocab, d_model)
    src_embed.positions                           (max_len, d_model)       if positional="learned"
    tgt_embed.embeddings                          (tgt_vocab, d_model)     unless share_embeddings
    tgt_embed.positions                           (max_len, d_model)       if learned, unless shared
    encoder.layers.{i}.self_attn.{p}.kernel/bias  (d_model, A) / (A,)
    encoder.layers.{i}.self_attn.output.kernel/bias  (A, d_model) / (d_model,)
    encoder.layers.{i}.self_attn_norm.gamma/beta  (d_model,)
    encoder.layers.{i}.ffn.inner.kernel/bias      (d_model, d_ff) / (d_ff,)
    encoder.layers.{i}.ffn.outer.kernel/bias      (d_ff, d_model) / (d_model,)
    encoder.layers.{i}.ffn_norm.gamma/beta        (d_model,)
    encoder.final_norm.gamma/beta                 (d_model,)               if final_norm
    decoder.layers.{i}.self_attn..., self_attn_norm..., cross_attn..., cross_attn_norm...,
                       ffn..., ffn_norm...        as above
    decoder.final_norm.gamma/beta                 (d_model,)               if final_norm
    generator.kernel                              (d_model, tgt_vocab)     unless tie_output
    generator.bias                                (tgt_vocab,)
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from . import memory
from .checks import check_config, check_flag, check_seed, is_int, masked_entries
from .config import TransformerConfig
from .memory import TENSOR_OVERHEAD, check_memory
from .paths import check_path, check_source, read_json
from .saving import (check_replaceable, fault_point, recover, replace_directory,  # noqa: F401
                     umask, write_atomically)

FORMAT_VERSION = 1
CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
PROJECTIONS = ("query", "key", "value", "output")


# -- schema ---------------------------------------------------------------------------------------
def _attention(prefix: str, d: int, inner: int) -> dict[str, tuple[int, ...]]:
    """Query/key/value ``d -> inner`` and output ``inner -> d``, ``inner = n_heads * d_k``."""
    out: dict[str, tuple[int, ...]] = {}
    for p in PROJECTIONS:
        out[f"{prefix}.{p}.kernel"] = (inner, d) if p == "output" else (d, inner)
        out[f"{prefix}.{p}.bias"] = (d,) if p == "output" else (inner,)
    return out


def _norm(prefix: str, d: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.gamma": (d,), f"{prefix}.beta": (d,)}


def _ffn(prefix: str, d: int, d_ff: int) -> dict[str, tuple[int, ...]]:
    return {f"{prefix}.inner.kernel": (d, d_ff), f"{prefix}.inner.bias": (d_ff,),
            f"{prefix}.outer.kernel": (d_ff, d), f"{prefix}.outer.bias": (d,)}


def weight_schema(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """Every canonical weight name and its shape, in a fixed order (tied weights once).

    ``ValueError`` for a config with more tensors than any model of it could hold on this machine
    (`_check_tensor_count`), before a name is built."""
    check_config(config)
    _check_tensor_count(config)
    return _schema(config)


def _check_tensor_count(config: TransformerConfig) -> None:
    """Refuse a config whose tensors alone, at `shared.memory.TENSOR_OVERHEAD` each (the least a
    model's tensor costs, whatever its size), exceed this machine's memory: its schema would grow
    until the memory ran out (10**9 layers: 16 names a layer), and no model of it could be built
    to use the schema. The count comes from `_totals`, which costs the same for any depth."""
    tensors, _ = _totals(config)
    limit = memory.exceeded(tensors * TENSOR_OVERHEAD)
    if limit is not None:
        raise ValueError(f"config: n_encoder_layers={config.n_encoder_layers}, n_decoder_layers="
                         f"{config.n_decoder_layers} make {tensors:,} tensors, which need at least "
                         f"{tensors * TENSOR_OVERHEAD / 2**30:.1f} GiB ({TENSOR_OVERHEAD // 1024} KiB "
                         f"a tensor), more than this machine's {limit / 2**30:.1f} GiB")


def _schema(config: TransformerConfig) -> dict[str, tuple[int, ...]]:
    """`weight_schema` unchecked (`_totals` builds one- and two-layer schemas with it)."""
    d, d_ff, inner = config.d_model, config.d_ff, config.n_heads * config.d_k
    learned = config.positional == "learned"
    schema: dict[str, tuple[int, ...]] = {"src_embed.embeddings": (config.src_vocab, d)}
    if learned:
        schema["src_embed.positions"] = (config.max_len, d)
    if not config.share_embeddings:
        schema["tgt_embed.embeddings"] = (config.tgt_vocab, d)
        if learned:
            schema["tgt_embed.positions"] = (config.max_len, d)
    for i in range(config.n_encoder_layers):
        layer = f"encoder.layers.{i}"
        schema.update(_attention(f"{layer}.self_attn", d, inner))
        schema.update(_norm(f"{layer}.self_attn_norm", d))
        schema.update(_ffn(f"{layer}.ffn", d, d_ff))
        schema.update(_norm(f"{layer}.ffn_norm", d))
    if config.final_norm:
        schema.update(_norm("encoder.final_norm", d))
    for i in range(config.n_decoder_layers):
        layer = f"decoder.layers.{i}"
        schema.update(_attention(f"{layer}.self_attn", d, inner))
        schema.update(_norm(f"{layer}.self_attn_norm", d))
        schema.update(_attention(f"{layer}.cross_attn", d, inner))
        schema.update(_norm(f"{layer}.cross_attn_norm", d))
        schema.update(_ffn(f"{layer}.ffn", d, d_ff))
        schema.update(_norm(f"{layer}.ffn_norm", d))
    if config.final_norm:
        schema.update(_norm("decoder.final_norm", d))
    if not config.tie_output:
        schema["generator.kernel"] = (d, config.tgt_vocab)
    schema["generator.bias"] = (config.tgt_vocab,)
    return schema


def tgt_embedding_name(config: TransformerConfig) -> str:
    """The table the decoder embeds with (the source table when embeddings are shared)."""
    check_config(config)
    return "src_embed.embeddings" if config.share_embeddings else "tgt_embed.embeddings"


def tgt_positions_name(config: TransformerConfig) -> str | None:
    """The learned position table the decoder adds (the source one when embeddings are shared);
    ``None`` for a sinusoidal config."""
    check_config(config)
    if config.positional != "learned":
        return None
    return "src_embed.positions" if config.share_embeddings else "tgt_embed.positions"


def parameter_count(config: TransformerConfig) -> int:
    check_config(config)
    return _totals(config)[1]


# -- initialisation -------------------------------------------------------------------------------
def _check_init(config: TransformerConfig, seed, caller: str) -> None:
    """The arguments of `init_weights` and `random_weights`, before anything is drawn: a config
    whose model cannot be held even for inference (the lightest use of weights) is refused from
    its counts (`check_buildable`), not by NumPy's MemoryError after minutes of allocating."""
    check_config(config)
    check_seed(seed)
    check_buildable(config, "inference", f"{caller}: config")


def _xavier_uniform(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    fan_in, fan_out = shape  # kernels are (in, out); embeddings (vocab, d) as torch treats them
    limit = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-limit, limit, size=shape)


def init_weights(config: TransformerConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Training initialisation, deterministic in ``seed``: Xavier-uniform for every matrix (as the
    Annotated Transformer does), zero biases and norm offsets, unit norm gains; in ``config.dtype``."""
    _check_init(config, seed, "init_weights")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in weight_schema(config).items():
        if len(shape) == 2:
            value = _xavier_uniform(rng, shape)
        elif name.endswith(".gamma"):
            value = np.ones(shape)
        else:
            value = np.zeros(shape)
        out[name] = value.astype(config.dtype)
    return out


def random_weights(config: TransformerConfig, seed: int = 0) -> dict[str, np.ndarray]:
    """Weights where *every* tensor is random (biases, norm gains and offsets too), in ``config.dtype``.

    For parity checks: with the training initialisation, a bias that is ignored or a gamma swapped
    with a beta would still agree (zeros and ones); here it cannot. Matrices are Xavier-uniform so
    activations keep a sensible scale; biases and offsets are U(-0.1, 0.1); gains U(0.5, 1.5).
    """
    _check_init(config, seed, "random_weights")
    rng = np.random.default_rng(seed)
    out: dict[str, np.ndarray] = {}
    for name, shape in weight_schema(config).items():
        if len(shape) == 2:
            value = _xavier_uniform(rng, shape)
        elif name.endswith(".gamma"):
            value = rng.uniform(0.5, 1.5, size=shape)
        else:
            value = rng.uniform(-0.1, 0.1, size=shape)
        out[name] = value.astype(config.dtype)
    return out


# -- checks ---------------------------------------------------------------------------------------
class WeightsError(ValueError):
    """Weights that do not fit a config: every problem at once, in ``problems`` and the message."""

    subject = "the weights"  # what the problems are with, in the message

    def __init__(self, source: str, problems: list[str]):
        self.source = source
        self.problems = problems
        listed = "\n  ".join(problems)
        super().__init__(f"{source}: {len(problems)} problem(s) with {self.subject}:\n  {listed}")


def changed_layer(name: str, got: str, values_only: bool) -> str:
    """The problem with a layer the weight schema maps that was changed after the model was built
    (docs/design.md, "Layers changed after building"), in the words both backends use. ``name``
    is its canonical prefix (``decoder.layers.0.self_attn.query``), ``got`` what it is now (``a
    DynamicQuantizedLinear``, ``a Dense with LoRA enabled (rank 8)``). ``values_only``: the
    weights were only to be read (an export, where an adapter merged into the kernel is what is
    read), else the parameters themselves were wanted (to write, differentiate or keep
    optimizer state for)."""
    if values_only:
        hint = ("export before quantizing or replacing the layer; merge an adapter wrapper into its "
                "Linear first")
    else:
        hint = ("load, train or differentiate the weights before adapting, quantizing or replacing "
                "the layer")
    return f"{name}: expected the layer the model was built with, got {got} ({hint})"


def tensor_problems(label: str, shape: tuple, dtype: str, got_shape: tuple, got_dtype: str,
              why: tuple[str, str] = ("", "")) -> list[str]:
    """The shape and dtype problems of one tensor: the one rule of `check_weights` and of every
    native checkpoint reader (`shared.checkpoints.read_stored`); ``why`` suffixes the expected
    shape and dtype (the native readers say where they come from)."""
    problems = []
    if tuple(got_shape) != tuple(shape):
        problems.append(f"{label}: expected shape {tuple(shape)}{why[0]}, got {tuple(got_shape)}")
    if got_dtype != dtype:
        problems.append(f"{label}: expected dtype {dtype}{why[1]}, got {got_dtype}")
    return problems


def snapshot_weights(weights: Mapping[str, object], source: str = "weights"
                     ) -> tuple[dict[str, object], list[str]]:
    """Every entry of ``weights`` read exactly once: ``(snapshot, problems)``.

    Arrays are copied into owned, C-contiguous memory in the native byte order (a memory-mapped or
    lazy source read once, so what is checked is what is assigned); any other value is kept as it
    is for the checks to report. An entry whose read raises is a problem (``"name: could not be
    read (...)"``), not a crash halfway through an import."""
    if not isinstance(weights, Mapping):
        raise TypeError(f"{source}: expected a dict of name -> numpy array, got {type(weights).__name__}")
    snapshot: dict[str, object] = {}
    problems: list[str] = []
    try:
        names = list(weights)
    except Exception as err:  # noqa: BLE001  (a lazy source may fail in any way)
        raise WeightsError(source, [f"the names could not be listed ({type(err).__name__}: {err})"]) from None
    for name in names:
        try:
            value = weights[name]
            if (masked := masked_entries(name, value)) is not None:
                problems.append(masked)
                snapshot[name] = None
                continue
            snapshot[name] = _owned(value) if isinstance(value, np.ndarray) else value
        except Exception as err:  # noqa: BLE001
            problems.append(f"{name}: could not be read ({type(err).__name__}: {err})")
            snapshot[name] = None
    return snapshot, problems


def _owned(array: np.ndarray) -> np.ndarray:
    """An owned, C-contiguous copy in the native byte order: a big-endian file's ``>f4`` holds
    float32 values, and swapping its bytes is exact (no cast), but neither framework takes such an
    array (``torch.from_numpy`` refuses it)."""
    return np.array(array, dtype=array.dtype.newbyteorder("="), order="C", copy=True)


def _totals(config: TransformerConfig) -> tuple[int, int]:
    """``(tensors, parameters)`` of `weight_schema` for ``config`` without building it: both are
    linear in the two layer counts, so three one- and two-layer schemas give them (a config may ask
    for 10**9 layers; this costs the same)."""
    def totals(n_encoder: int, n_decoder: int) -> tuple[int, int]:
        schema = _schema(config.replace(n_encoder_layers=n_encoder, n_decoder_layers=n_decoder))
        return len(schema), int(sum(math.prod(shape) for shape in schema.values()))
    base, encoder, decoder = totals(1, 1), totals(2, 1), totals(1, 2)
    return tuple(b + (e - b) * (config.n_encoder_layers - 1) + (d - b) * (config.n_decoder_layers - 1)
                 for b, e, d in zip(base, encoder, decoder))


def check_buildable(config: TransformerConfig, use: str, what: str) -> None:
    """Refuse, naming ``what`` (the option that gave ``config``), a config whose model cannot fit
    this machine's memory for ``use`` ("train" or "inference"; `shared.memory.check_memory`),
    before anything of its size is built: for a config that comes without weights to bound it."""
    check_config(config)
    tensors, values = _totals(config)
    check_memory(tensors, values, np.dtype(config.dtype).itemsize, use, what)


def check_fits(config: TransformerConfig, tensors: int, values: int | None, source: str,
               what: str = "tensors"):
    """Refuse weights (a file's, named by ``source``) that hold less than half the ``tensors`` or
    half the ``values`` (elements, all tensors together) ``config`` needs, before anything of the
    config's size is built (`check_weights`' schema, a native reader's layout: a model, to map the
    file's names). A check never builds more than twice what it reads, so a stored config asking
    for millions of layers, or a d_model far past the file's, is one line rather than minutes and
    gigabytes. A smaller shortfall (a tensor or a layer missing) is left to the full check, which
    names every missing tensor. ``what``: the tensors as the format calls them ("keys", ...)."""
    check_config(config)
    needed_tensors, needed_values = _totals(config)
    problems = []
    if 2 * tensors < needed_tensors:
        problems.append(f"the config needs {needed_tensors:,} {what}, these weights hold {tensors:,}")
    if values is not None and 2 * values < needed_values:
        problems.append(f"the config needs {needed_values:,} values, these weights hold {values:,}")
    if problems:
        layers = f"n_encoder_layers={config.n_encoder_layers}, n_decoder_layers={config.n_decoder_layers}"
        raise WeightsError(source, [f"{p} ({layers}, d_model={config.d_model})" for p in problems])


def check_weights(config: TransformerConfig, weights: Mapping[str, object], source: str = "weights",
                  allow_nonfinite: bool = False) -> dict[str, np.ndarray]:
    """Raise one `WeightsError` listing every missing, unexpected, unreadable, mis-shaped,
    mis-typed or non-finite tensor; else return the checked weights: owned copies, each read from
    ``weights`` exactly once (`snapshot_weights`), in `weight_schema` order. Use the returned dict,
    never ``weights`` again: a second read of a lazy or memory-mapped source may differ from what
    was checked. Expected dtype is ``config.dtype`` exactly (no silent casts: a cast would break
    the bit-exact round trip). ``weights`` is not modified."""
    check_config(config)
    check_flag(allow_nonfinite, "allow_nonfinite")
    snapshot, problems = snapshot_weights(weights, source)
    arrays = [v for v in snapshot.values() if isinstance(v, np.ndarray)]
    # before a schema of the config's size is built; values counted only where every entry is an
    # array (an unreadable one or a non-array is its own problem, listed below)
    check_fits(config, len(snapshot), sum(a.size for a in arrays) if len(arrays) == len(snapshot) else None,
               source)
    unreadable = {p.split(":", 1)[0] for p in problems}
    schema = weight_schema(config)
    missing = [n for n in schema if n not in snapshot]
    unexpected = sorted((n for n in snapshot if n not in schema), key=str)  # names of any type
    if missing:
        problems.append(f"missing: {missing}")
    if unexpected:
        problems.append(f"unexpected: {unexpected}")
    for name, shape in schema.items():
        if name not in snapshot or name in unreadable:
            continue
        value = snapshot[name]
        if not isinstance(value, np.ndarray):
            problems.append(f"{name}: expected a numpy array, got {type(value).__name__}")
            continue
        problems += tensor_problems(name, shape, config.dtype, value.shape, str(value.dtype))
        # Only a tensor of the right dtype is looked into (a mis-shaped one still is).
        if value.dtype == np.dtype(config.dtype) and not allow_nonfinite and not np.isfinite(value).all():
            problems.append(f"{name}: contains NaN or Inf")
    if problems:
        raise WeightsError(source, problems)
    return {name: snapshot[name] for name in schema}


# -- file helpers shared by every checkpoint format ---------------------------------------------------
# write_atomically lives in shared.saving with the directory swap; re-exported for the backends.
def config_differences(a: TransformerConfig, b: TransformerConfig) -> str:
    """``"field: a vs b, ..."`` for every field where two configs differ (for error messages)."""
    check_config(a, "a")
    check_config(b, "b")
    da, db = a.to_dict(), b.to_dict()
    return ", ".join(f"{k}: {da[k]!r} vs {db[k]!r}" for k in da if da[k] != db[k])


def config_mismatch(where, given: TransformerConfig, stored: TransformerConfig) -> str:
    """The one message for a file whose config is not the one it is read for (a model's
    ``load_into``, ``--config``), whichever reader finds it."""
    check_config(given, "given")
    check_config(stored, "stored")
    return (f"{str(where)!r}: the config given (the model's, or --config) differs from the one in "
            f"the file in {config_differences(given, stored)} (given vs the file's)")


# -- checkpoint files -----------------------------------------------------------------------------
def save_checkpoint(path: str | os.PathLike, config: TransformerConfig,
                    weights: Mapping[str, np.ndarray]) -> Path:
    """Write ``path/`` = ``config.json`` + ``model.safetensors``, crash-safely.

    The files are written and fsynced in a temporary sibling directory that then takes the place of
    ``path`` (`shared.saving.replace_directory`): at every instant ``path`` is the old checkpoint or
    the new one, never a half-written one, and an interrupted save is repaired by the next load.
    An existing checkpoint at ``path`` (only its two files, its ``config.json`` this format's:
    `is_checkpoint_header`) is replaced; any other existing file or directory is refused
    (``FileExistsError``, nothing changed): a user's folder holding a ``config.json`` of their own
    is not a checkpoint, whatever its name.
    """
    check_path(path)
    check_config(config)
    weights = check_weights(config, weights, source="save_checkpoint: weights")
    path = Path(path)
    check_replaceable(path, (CONFIG_FILE, WEIGHTS_FILE), "a checkpoint", is_checkpoint_header)
    return replace_directory(path, lambda staging: write_checkpoint_files(staging, config, weights))


def is_checkpoint_header(header) -> bool:
    """Whether ``header``, a parsed ``config.json``, is a neutral checkpoint's (``format_version``
    and a ``config`` mapping; not an ONNX export's, which adds ``precision``, nor a transformers
    one): `save_checkpoint` replaces the directory holding it (`shared.saving.check_replaceable`)."""
    return (isinstance(header, dict) and "format_version" in header
            and isinstance(header.get("config"), dict)
            and "precision" not in header and "model_type" not in header)


def write_checkpoint_files(folder: Path, config: TransformerConfig,
                           weights: Mapping[str, np.ndarray]) -> None:
    """``config.json`` and ``model.safetensors`` into the existing ``folder`` (no fsync, no checks:
    `save_checkpoint` and `twins train` stage a directory with it, then swap it into place)."""
    check_config(config)
    from safetensors.numpy import save_file

    folder = Path(folder)
    header = {"format_version": FORMAT_VERSION, "config": config.to_dict()}
    with open(folder / CONFIG_FILE, "w", encoding="utf-8") as f:
        json.dump(header, f, indent=2, sort_keys=True)
    fault_point("config-written")  # a half-staged directory, for the tests
    ordered = {n: np.ascontiguousarray(weights[n]) for n in weight_schema(config)}
    save_file(ordered, str(folder / WEIGHTS_FILE), metadata={"format_version": str(FORMAT_VERSION)})
    os.chmod(folder / WEIGHTS_FILE, 0o666 & ~umask())  # safetensors writes it owner-only


def read_config_file(config_file: Path) -> TransformerConfig:
    """The config of a ``config.json`` holding ``format_version`` and ``config`` (a neutral
    checkpoint's, an ONNX export's); ``ValueError`` naming the file when it is not one."""
    header = read_json(config_file)
    if not isinstance(header, dict) or "format_version" not in header or "config" not in header:
        raise ValueError(f"{str(config_file)!r}: expected keys 'format_version' and 'config'")
    version = header["format_version"]
    if not is_int(version) or version != FORMAT_VERSION:  # true == 1, but no version
        raise ValueError(f"{str(config_file)!r}: unknown format_version {header['format_version']!r}, "
                         f"this version reads {FORMAT_VERSION}")
    try:
        return TransformerConfig.from_dict(header["config"])
    except (TypeError, ValueError) as err:
        raise ValueError(f"{str(config_file)!r}: invalid config: {err}") from None


# (entries any one of which marks the export, even with another lost; what it is; why it is not
# read back)
WRITE_ONLY = (
    (("encoder_model.onnx", "decoder_model.onnx", "decoder_with_past_model.onnx"), "an ONNX export",
     "its weights are rearranged for its graphs (and rounded in a float16 export)"),
    (("saved_model.pb", "fingerprint.pb", "variables"), "a TensorFlow SavedModel",
     "it holds traced decoding programs, served as they are (`tf.saved_model.load`), not a checkpoint"),
    (("model.bin", "source_vocabulary.json", "shared_vocabulary.json"), "a CTranslate2 model",
     "CTranslate2's own file, run by ctranslate2.Translator"),
)


def load_checkpoint(path: str | os.PathLike, allow_nonfinite: bool = False
                    ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Read and fully validate a checkpoint directory; return ``(config, weights)``.

    Raises ``FileNotFoundError`` for a missing path or file, ``ValueError`` naming the file for an
    unreadable, corrupted or contradictory one (every weight problem listed at once). No pickle is
    involved anywhere. NaN/Inf weights are refused unless ``allow_nonfinite=True``.
    """
    check_flag(allow_nonfinite, "allow_nonfinite")
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    from .importers.safetensors_file import numpy_unloadable

    check_path(path)
    path = Path(path)
    recover(path)  # an interrupted save: finish it (or say where the data is) before reading
    if not path.exists():
        raise FileNotFoundError(f"load_checkpoint: no checkpoint at {str(path)!r}")
    if not path.is_dir():
        raise ValueError(f"load_checkpoint: {str(path)!r} is not a checkpoint directory "
                         f"(expected a directory with {CONFIG_FILE} and {WEIGHTS_FILE})")
    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    if not weights_file.is_file():
        # exports this project writes and never reads back (an ONNX export's config.json alone
        # would pass for a neutral checkpoint's): named, not "missing model.safetensors"
        for markers, what, why in WRITE_ONLY:
            if any((path / marker).exists() for marker in markers):
                raise ValueError(f"{str(path)!r} is {what}, which is written, never read back: {why}; "
                                 "read the checkpoint it was exported from")
    for f in (config_file, weights_file):
        check_source(f, directory=False)  # there, but a directory, a FIFO, a device
        if not f.is_file():
            raise FileNotFoundError(f"load_checkpoint: missing {str(f)!r}")
    config = read_config_file(config_file)
    try:
        unloadable = numpy_unloadable(weights_file)
        if unloadable:  # named here: safetensors.numpy's own error names no tensor
            raise WeightsError(str(weights_file), [f"{name}: expected dtype {config.dtype}, got {dtype} "
                                                   "(safetensors' name; not a NumPy type)"
                                                   for name, dtype in sorted(unloadable.items())])
        weights = load_file(str(weights_file))
    except WeightsError:
        raise
    except (SafetensorError, OSError, ValueError) as err:
        raise ValueError(f"{str(weights_file)!r}: not a readable safetensors file ({err})") from None
    return config, check_weights(config, weights, source=str(weights_file), allow_nonfinite=allow_nonfinite)
