"""Hugging Face ``save_pretrained`` directories, read without executing code: ``config.json`` (JSON)
and ``model.safetensors`` (`.safetensors_file`: float16 and bfloat16 widened exactly to float32).
NumPy only; transformers is never imported.

What the Marian and FSMT importers share: finding and reading the two files (a sharded, a ``.bin``
only or another model's directory is refused, saying what to do), `Settings` (every key of
config.json is mapped, checked, or known not to change the computed function; an unknown key is
refused rather than guessed at), and `bart_layers` (both families name their layers as BART does).
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from ..paths import check_source, read_json
from ..weights import PROJECTIONS
from .common import ImporterError, SourceImport, layer_indices
from .safetensors_file import read_float_safetensors

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
FAMILIES = {"marian": ("MarianMTModel", "marian"), "fsmt": ("FSMTForConditionalGeneration", "fsmt")}

# Keys of config.json that never change the function a model computes: metadata, the generation
# policy (the project's decoders take their own arguments), and training-only rates. Taken from
# transformers' PreTrainedConfig and GenerationConfig (5.x, and the 4.x names still found in
# published checkpoints); parity_tests/test_interop_marian.py checks that this list still covers
# the installed transformers' generic keys.
METADATA = {
    "_name_or_path", "architectures", "transformers_version", "dtype", "torch_dtype", "id2label",
    "label2id", "_num_labels", "num_labels", "problem_type", "return_dict", "output_attentions",
    "output_hidden_states", "torchscript", "use_bfloat16", "tf_legacy_loss", "finetuning_task",
    "tokenizer_class", "prefix", "task_specific_params", "chunk_size_feed_forward", "_commit_hash",
    "_attn_implementation_autoset", "_attn_implementation", "use_cache", "gradient_checkpointing",
    "is_encoder_decoder", "sep_token_id", "add_cross_attention", "model_type",
}
GENERATION = {
    "_from_model_config", "assistant_confidence_threshold", "assistant_early_exit",
    "assistant_ensemble_weight", "assistant_lookbehind", "bad_words_ids", "begin_suppress_tokens",
    "cache_config", "cache_implementation", "compile_config", "constraints",
    "continuous_batching_config", "disable_compile", "diversity_penalty", "do_sample", "dola_layers",
    "early_stopping", "encoder_no_repeat_ngram_size", "encoder_repetition_penalty", "epsilon_cutoff",
    "eta_cutoff", "exponential_decay_length_penalty", "force_words_ids", "forced_bos_token_id",
    "forced_eos_token_id", "guidance_scale", "is_assistant", "length_penalty", "low_memory",
    "max_cache_len", "max_length", "max_matching_ngram_size", "max_new_tokens", "max_time",
    "min_length", "min_new_tokens", "min_p", "no_repeat_ngram_size", "num_assistant_tokens",
    "num_assistant_tokens_schedule", "num_beam_groups", "num_beams", "num_return_sequences",
    "output_logits", "output_scores", "penalty_alpha", "prefill_chunk_size",
    "prompt_lookup_num_tokens", "remove_invalid_values", "renormalize_logits", "repetition_penalty",
    "return_dict_in_generate", "sequence_bias", "speculation_type", "stop_strings", "suppress_tokens",
    "target_lookbehind", "temperature", "token_healing", "top_h", "top_k", "top_p", "typical_p",
    "use_mtp", "watermarking_config",
}
TRAINING = {"init_std", "encoder_layerdrop", "decoder_layerdrop", "classif_dropout",
            "classifier_dropout", "attention_dropout", "activation_dropout"}
IGNORED = METADATA | GENERATION | TRAINING
# Config fields and the config.json keys of both BART-like families they are read from (the
# vocabulary keys differ: `Settings.sources`).
BART_KEYS = {"d_model": "d_model", "n_heads": "encoder_attention_heads", "d_ff": "encoder_ffn_dim",
             "n_encoder_layers": "encoder_layers", "n_decoder_layers": "decoder_layers",
             "max_len": "max_position_embeddings", "pad_id": "pad_token_id", "bos_id": "bos_token_id",
             "eos_id": "eos_token_id", "decoder_start_id": "decoder_start_token_id", "dropout": "dropout",
             "activation": "activation_function", "embed_scale": "scale_embedding"}
# Generic keys whose every value but one would describe another model.
FIXED = {"is_decoder": False, "tie_encoder_decoder": False, "pruned_heads": {},
         "cross_attention_hidden_size": None}


def read_pretrained(path, family: str, source: str) -> tuple[dict, dict[str, np.ndarray]]:
    """``(config.json as a dict, {key: array})`` of a ``save_pretrained`` directory of ``family``
    (``"marian"`` or ``"fsmt"``). Raises FileNotFoundError for a missing path, ImporterError naming
    the file and what to do for anything else that is not such a directory."""
    from safetensors import SafetensorError

    model_class, model_type = FAMILIES[family]
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{source}: no such directory {str(path)!r}")
    expected = (f"the directory {model_class}.save_pretrained writes ({CONFIG_FILE} + "
                f"{WEIGHTS_FILE})")
    if not path.is_dir():
        raise ImporterError(source, [f"{str(path)!r}: expected {expected}, got a file"])
    config_file, weights_file = path / CONFIG_FILE, path / WEIGHTS_FILE
    for file in (config_file, weights_file):
        try:  # there, but a directory, a FIFO, a device: named as that, not as missing
            check_source(file, directory=False)
        except ValueError as err:
            raise ImporterError(source, [str(err)]) from None
    if not config_file.is_file():
        raise ImporterError(source, [f"{str(config_file)!r}: missing; expected {expected}"])
    try:
        config = read_json(config_file)
    except ValueError as err:  # not a regular file, not UTF-8, not JSON (each named)
        raise ImporterError(source, [str(err)]) from None
    if not isinstance(config, dict):
        raise ImporterError(source, [f"{str(config_file)!r}: expected a JSON object, got "
                                     f"{type(config).__name__}"])
    if "format_version" in config and "config" in config:
        raise ImporterError(source, [f"{str(config_file)!r}: a twin-transformer checkpoint, not a "
                                     f"{model_class} save; read it as a neutral checkpoint"])
    found = config.get("model_type")
    if found != model_type:
        other = [f for f, (_, t) in FAMILIES.items() if t == found]
        hint = f" (use --from {other[0]} / from_{other[0]})" if other else ""
        raise ImporterError(source, [f"{str(config_file)!r}: model_type expected {model_type!r} "
                                     f"({model_class}), got {found!r}{hint}"])
    if not weights_file.is_file():
        if (path / f"{WEIGHTS_FILE}.index.json").is_file():
            what = (f"a sharded checkpoint ({WEIGHTS_FILE}.index.json); write one file with "
                    f"transformers: {model_class}.from_pretrained(DIR).save_pretrained(NEW_DIR, "
                    "max_shard_size='1000GB'), then import NEW_DIR")
        elif any(path.glob("pytorch_model*.bin")):
            what = ("only pytorch_model.bin, a pickle, which this project never loads; convert it "
                    f"with transformers: {model_class}.from_pretrained(DIR).save_pretrained(NEW_DIR) "
                    f"writes {WEIGHTS_FILE}")
        else:
            what = f"missing; expected {expected}"
        raise ImporterError(source, [f"{str(weights_file)!r}: {what}"])
    try:
        state_dict, problems = read_float_safetensors(weights_file)  # half precision widened
    except (SafetensorError, OSError, ValueError) as err:
        raise ImporterError(source, [f"{str(weights_file)!r}: not a readable safetensors file "
                                     f"({err})"]) from None
    if problems:
        raise ImporterError(source, problems)
    return config, state_dict


class Settings:
    """config.json under import: each key is read once (`get`), checked (`fixed`) or known to be
    irrelevant (`IGNORED`); `leftovers` refuses the rest. Absent keys take transformers' defaults
    (``defaults``), as ``from_pretrained`` would."""

    def __init__(self, config: dict, file: str, defaults: dict, imp: SourceImport):
        self.config, self.file, self.defaults, self.imp = config, file, defaults, imp
        self.used: set[str] = set()

    def get(self, key: str):
        self.used.add(key)
        return self.config.get(key, self.defaults.get(key))

    def integer(self, key: str, low: int = 1) -> int | None:
        value = self.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            kind = "a positive int" if low == 1 else f"an int >= {low}"
            self.problem(key, f"expected {kind}, got {value!r}")
            return None
        return value

    def flag(self, key: str) -> bool | None:
        value = self.get(key)
        if not isinstance(value, bool):
            self.problem(key, f"expected true or false, got {value!r}")
            return None
        return value

    def same(self, key: str, other: str, why: str):
        """``key`` must equal ``other`` (the project has one value for both): the value, or None."""
        a, b = self.get(key), self.get(other)
        if a != b:
            self.problem(key, f"expected {other} = {b!r} ({why}), got {a!r}")
            return None
        return a

    def same_integer(self, key: str, other: str, why: str) -> int | None:
        """Two positive-int keys the project has one value for (``key`` must equal ``other``): each
        checked on its own first, so a bad value (NaN, a string) is reported under its own key."""
        b, a = self.integer(other), self.integer(key)
        if a is None or b is None:
            return None
        if a != b:
            self.problem(key, f"expected {other} = {b!r} ({why}), got {a!r}")
            return None
        return a

    def sources(self, **fields: str) -> dict[str, str]:
        """Config field -> ``"config.json: key"``, for `SourceImport.config`'s messages: the keys of
        `BART_KEYS` and ``fields`` (the family's own, e.g. its vocabulary keys)."""
        return {name: f"{self.file}: {key}" for name, key in {**BART_KEYS, **fields}.items()}

    def fixed(self, key: str, value, why: str) -> None:
        """A key whose every value but ``value`` describes another model."""
        self.used.add(key)
        if key in self.config and self.config[key] != value and not (
                value == {} and self.config[key] in ({}, None, [])):
            self.problem(key, f"expected {json.dumps(value)} ({why}), got {json.dumps(self.config[key])}")

    def problem(self, key: str, text: str) -> None:
        self.imp.problem(f"{self.file}: {key}: {text}")

    def leftovers(self) -> None:
        for key, value in FIXED.items():
            self.fixed(key, value, "transformers' generic setting; another value is another model")
        unknown = sorted(k for k in self.config if k not in self.used and k not in IGNORED)
        if unknown:
            self.imp.problem(f"{self.file}: unknown settings {unknown}: this importer does not know "
                             "whether they change the computation; refusing rather than guessing "
                             "(remove them from config.json if they do not)")


def activation(settings: Settings) -> str | None:
    """transformers' ``activation_function`` in the project's terms (ACT2FN's relu, gelu = exact
    erf, swish/silu = x * sigmoid(x)); any other is refused."""
    value = settings.get("activation_function")
    names = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
    if value not in names:
        settings.problem("activation_function", f"expected one of {sorted(names)} (the activations "
                         f"the project computes exactly), got {value!r}")
        return None
    return names[value]


def not_pad(settings: Settings, key: str, value: int | None, pad_id: int | None, why: str = "") -> None:
    """A problem under ``key`` when the id ``value`` is the pad id (``why``: the family's reason, in
    parentheses); nothing when either is unknown (`token_id` named it already)."""
    if value is not None and value == pad_id:
        settings.problem(key, f"expected an id different from pad_token_id={pad_id}, got {value}"
                         + (f" ({why})" if why else ""))


def token_id(settings: Settings, key: str, vocab: int | None) -> int | None:
    value = settings.get(key)
    if isinstance(value, list) and len(value) == 1:
        value = value[0]  # eos_token_id may be a list; one id is one id
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (
            vocab is not None and value >= vocab):
        settings.problem(key, f"expected one id in [0, {vocab}), got {value!r}")
        return None
    return value


def bart_layers(imp: SourceImport, enc: str, dec: str, n_enc: int, n_dec: int, d: int, d_ff: int) -> None:
    """Expect BART-style layers (Marian, FSMT): ``{enc}.layers.{i}.self_attn.{q,k,v,out}_proj``,
    ``self_attn_layer_norm``, ``fc1``, ``fc2``, ``final_layer_norm``; the decoder adds
    ``encoder_attn`` and ``encoder_attn_layer_norm``. Post-norm sublayers, torch LayerNorms."""
    short = dict(zip(PROJECTIONS, ("q_proj", "k_proj", "v_proj", "out_proj")))
    n_enc = imp.planned_layers(f"{enc}.layers.*", layer_indices(imp.sd, f"{enc}.layers"), n_enc,
                               f"{CONFIG_FILE} encoder_layers", prefix=f"{enc}.layers")
    n_dec = imp.planned_layers(f"{dec}.layers.*", layer_indices(imp.sd, f"{dec}.layers"), n_dec,
                               f"{CONFIG_FILE} decoder_layers", prefix=f"{dec}.layers")

    def attention(src: str, dst: str) -> None:
        for p in PROJECTIONS:
            imp.linear(f"{src}.{short[p]}", f"{dst}.{p}", d, d)

    def ffn_and_norms(src: str, dst: str, norms: tuple[tuple[str, str], ...]) -> None:
        imp.linear(f"{src}.fc1", f"{dst}.ffn.inner", d, d_ff)
        imp.linear(f"{src}.fc2", f"{dst}.ffn.outer", d_ff, d)
        for theirs, ours in norms:
            imp.norm(f"{src}.{theirs}", f"{dst}.{ours}", d, "weight", "bias")

    for i in range(n_enc):
        s, t = f"{enc}.layers.{i}", f"encoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        ffn_and_norms(s, t, (("self_attn_layer_norm", "self_attn_norm"), ("final_layer_norm", "ffn_norm")))
    for i in range(n_dec):
        s, t = f"{dec}.layers.{i}", f"decoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        attention(f"{s}.encoder_attn", f"{t}.cross_attn")
        ffn_and_norms(s, t, (("self_attn_layer_norm", "self_attn_norm"),
                             ("encoder_attn_layer_norm", "cross_attn_norm"),
                             ("final_layer_norm", "ffn_norm")))


def tied_copy(imp: SourceImport, key: str, of: str, why: str) -> None:
    """A key ``save_pretrained`` may also write for a tied tensor: accepted when it holds the same
    numbers as ``of`` (never imported twice), refused when it differs."""
    if key not in imp.sd:
        return
    imp.ignored.add(key)
    a, b = imp.sd.get(key), imp.sd.get(of)
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and not (
            a.shape == b.shape and np.array_equal(a, b)):
        imp.problem(f"{key}: tied to {of} ({why}) but holds other values; refusing to pick one")
