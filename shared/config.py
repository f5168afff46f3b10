"""The model configuration: one frozen, validated dataclass that every implementation reads.

A `TransformerConfig` is checked when it is built, so an impossible model (``d_model`` not divisible
by ``n_heads``, a special id outside the vocabulary, ...) fails at construction with a ``ValueError``
naming the field, what was expected and what was got, never later inside a matmul.

The architecture variants (``activation`` ... ``decoder_start_id``, docs/design.md, convention 15)
default to the paper's choices, so a config written before they existed (a config.json
without them) builds the same model; a config.json with a field this version does not know is
refused, naming the field, rather than read as some other model.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

from .messages import shown

NORM_STYLES = ("standard", "annotated")
# The largest positional table (max_len x d_model values) a config may ask for: 2**28 values, 2 GiB
# in float64 (the table is computed in float64, docs/design.md convention 4). Past it the table is
# refused here, by name, rather than failing as a MemoryError (or a swap storm) inside NumPy.
POSITIONAL_TABLE_LIMIT = 2 ** 28
DTYPES = ("float32", "float64")
ACTIVATIONS = ("relu", "gelu", "swish")
POSITIONALS = ("sinusoidal", "learned")
PE_LAYOUTS = ("interleaved", "halves")
PE_TIMESCALES = ("paper", "t2t")
BOOL_FIELDS = ("norm_first", "final_norm", "share_embeddings", "tie_output", "embed_scale", "mask_padding")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder Transformer.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes of source and target.
        d_model: width of every residual stream; divisible by ``n_heads`` unless ``head_dim`` is given.
        n_heads: attention heads; each head has ``d_k = head_dim or d_model // n_heads``.
        d_ff: inner width of the position-wise feed-forward network.
        n_encoder_layers, n_decoder_layers: depth of each stack (0 is allowed for neither).
        dropout: probability in [0, 1), used at the sites of docs/design.md, convention 9;
            inactive in evaluation.
        max_len: longest sequence the positional-encoding table covers.
        norm_first: ``True`` is pre-norm (Annotated Transformer), ``False`` the paper's post-norm.
        norm_style: ``"standard"`` = (x - mean) / sqrt(var + eps), biased variance (torch, Keras);
            ``"annotated"`` = (x - mean) / (std + eps), unbiased std (the Annotated Transformer).
        norm_eps: the layer-norm epsilon, always explicit (framework defaults differ).
        final_norm: a layer norm after each stack. ``None`` means "as the placement implies":
            present for pre-norm, absent for post-norm. ``nn.Transformer`` has it in both placements.
        share_embeddings: source and target use one embedding table (needs equal vocab sizes).
        tie_output: the generator's projection is the (transposed) target embedding table.
        pad_id, bos_id, eos_id: special token ids; padding is never attended to.
        dtype: ``"float32"`` (default) or ``"float64"``.

    Architecture variants (each default is the paper's model, docs/design.md, convention 15):
        activation: the feed-forward nonlinearity: ``"relu"``, ``"gelu"`` (exact, with erf) or
            ``"swish"`` (``x * sigmoid(x)``).
        positional: ``"sinusoidal"`` (a fixed table) or ``"learned"`` (the weights
            ``src_embed.positions`` / ``tgt_embed.positions``, ``(max_len, d_model)``; one shared
            table with ``share_embeddings``).
        pe_layout: ``"interleaved"`` (sin in even columns, cos in odd) or ``"halves"`` (``[sin | cos]``).
        pe_timescale: ``"paper"`` (inverse frequencies ``10000^(-2i/d)``) or ``"t2t"``
            (tensor2tensor / fairseq: ``exp(-i * ln(10000) / (d/2 - 1))``).
        pe_offset: the position index of the first token (fairseq starts at ``pad_id + 1``).
        embed_scale: multiply token embeddings by ``sqrt(d_model)``.
        head_dim: per-head width; ``None`` = ``d_model // n_heads``. Query/key/value kernels are
            ``(d_model, n_heads * head_dim)``, the output kernel ``(n_heads * head_dim, d_model)``.
        decoder_start_id: the first decoder input token in decoding; ``None`` = ``bos_id``. May equal
            ``pad_id`` (Marian): column 0 of a target is then never treated as padding
            (`shared.masks.make_tgt_mask`).
        mask_padding: ``True``: keys equal to ``pad_id`` are masked (docs/design.md, convention 2).
            ``False``: the default masks ignore padding, ``pad_id`` is a token like any other: the
            source mask allows every key and the target mask is the subsequent mask alone (KerasHub
            models built without ``mask_zero``). Explicit masks are used as given either way.

    The three ``pe_*`` fields describe the sinusoidal table only: with ``positional="learned"`` they
    must keep their defaults.
    """

    src_vocab: int
    tgt_vocab: int
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    n_encoder_layers: int = 6
    n_decoder_layers: int = 6
    dropout: float = 0.1
    max_len: int = 1024
    norm_first: bool = False
    norm_style: str = "standard"
    norm_eps: float = 1e-6
    final_norm: bool | None = None
    share_embeddings: bool = False
    tie_output: bool = False
    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
    dtype: str = "float32"
    activation: str = "relu"
    positional: str = "sinusoidal"
    pe_layout: str = "interleaved"
    pe_timescale: str = "paper"
    pe_offset: int = 0
    embed_scale: bool = True
    head_dim: int | None = None
    decoder_start_id: int | None = None
    mask_padding: bool = True

    def __post_init__(self) -> None:
        if self.final_norm is None:
            object.__setattr__(self, "final_norm", self.norm_first)
        for field in dataclasses.fields(self):  # NumPy's numbers (a size read from an array's
            value = getattr(self, field.name)  # shape) stored as the Python numbers they hold
            if type(value).__module__ == "numpy" and hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
                held = value.item()  # a NumPy bool is a bool where one belongs (as check_flag takes it), never an int
                if isinstance(held, bool) == (field.name in BOOL_FIELDS) and isinstance(held, (int, float)):
                    object.__setattr__(self, field.name, held)
        self._validate()

    # -- validation -------------------------------------------------------------------------------
    def _validate(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_len",
                     "n_encoder_layers", "n_decoder_layers", "pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"TransformerConfig.{name}: expected an int, got {shown(value)}")
            _check_int64(name, value)
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_len",
                     "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"TransformerConfig.{name}: expected a positive int, got {value}")
        for name in ("head_dim", "decoder_start_id", "pe_offset"):
            value = getattr(self, name)
            if (value is not None or name == "pe_offset") and (
                    isinstance(value, bool) or not isinstance(value, int)):
                allowed = "an int" if name == "pe_offset" else "an int or None"
                raise ValueError(f"TransformerConfig.{name}: expected {allowed}, got {shown(value)}")
            if value is not None:
                _check_int64(name, value)
        if self.head_dim is not None and self.head_dim < 1:
            raise ValueError(f"TransformerConfig.head_dim: expected a positive int or None, "
                             f"got {self.head_dim}")
        if self.pe_offset < 0:
            raise ValueError(f"TransformerConfig.pe_offset: expected an int >= 0, got {self.pe_offset}")
        if self.head_dim is None and self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model: expected a multiple of n_heads={self.n_heads}, "
                f"got {self.d_model}")
        for name in ("dropout", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"TransformerConfig.{name}: expected a float, got {shown(value)}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig.dropout: expected a value in [0, 1), "
                             f"got {shown(self.dropout, str)}")
        # Compared, not converted (math.isfinite): an int past float's range (10**400) has no float,
        # and is refused as too large below.
        if not 0.0 < self.norm_eps < math.inf:
            raise ValueError(f"TransformerConfig.norm_eps: expected a positive finite float, "
                             f"got {shown(self.norm_eps, str)}")
        if not FLOAT32_TINY <= self.norm_eps <= FLOAT32_MAX:  # the norms run in float32 at least
            raise ValueError(f"TransformerConfig.norm_eps: expected a value float32 holds, neither 0 "
                             f"nor inf there (in [{FLOAT32_TINY:.3g}, {FLOAT32_MAX:.4g}]), got "
                             f"{shown(self.norm_eps, str)}")
        if self.max_len * self.d_model > POSITIONAL_TABLE_LIMIT:
            raise ValueError(
                f"TransformerConfig.max_len: expected max_len * d_model <= POSITIONAL_TABLE_LIMIT = "
                f"{POSITIONAL_TABLE_LIMIT} (the float64 positional table, 2 GiB), got {self.max_len} * "
                f"{self.d_model} = {self.max_len * self.d_model}")
        # Positions are float64 (shared/positional.py), where integers are exact only up to 2**53:
        # past it neighbouring positions round to one value, and rows of the table repeat.
        if self.pe_offset > 2**53 - self.max_len + 1:
            raise ValueError(
                f"TransformerConfig.pe_offset: expected an int <= 2**53 - max_len + 1 = "
                f"{2**53 - self.max_len + 1} (positions pe_offset .. pe_offset + max_len - 1 are "
                f"computed in float64, exact only up to 2**53), got {self.pe_offset}")
        for name in BOOL_FIELDS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"TransformerConfig.{name}: expected a bool, got {shown(value)}")
        if self.norm_style not in NORM_STYLES:
            raise ValueError(
                f"TransformerConfig.norm_style: expected one of {NORM_STYLES}, got {self.norm_style!r}")
        if self.norm_style == "annotated" and self.d_model < 2:
            raise ValueError("TransformerConfig.d_model: expected >= 2 with norm_style='annotated' "
                             f"(its unbiased std divides by d_model - 1), got {self.d_model}")
        # A str only: np.dtype("float32") == "float32", yet it hashes otherwise and JSON cannot write it.
        if not isinstance(self.dtype, str) or self.dtype not in DTYPES:
            raise ValueError(f"TransformerConfig.dtype: expected one of {DTYPES}, got {shown(self.dtype)}")
        self._validate_variants()
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError(
                "TransformerConfig.share_embeddings: expected src_vocab == tgt_vocab for one shared "
                f"table, got src_vocab={self.src_vocab}, tgt_vocab={self.tgt_vocab}")
        smallest = min(self.src_vocab, self.tgt_vocab)
        if not 0 <= self.pad_id < smallest:
            raise ValueError(
                f"TransformerConfig.pad_id: expected 0 <= pad_id < {smallest} (both vocabularies), "
                f"got {self.pad_id}")
        for name in ("bos_id", "eos_id"):
            value = getattr(self, name)
            if not 0 <= value < self.tgt_vocab:
                raise ValueError(
                    f"TransformerConfig.{name}: expected 0 <= {name} < tgt_vocab={self.tgt_vocab}, "
                    f"got {shown(value, str)}")
            # A pad id equal to BOS/EOS would hide that token from attention via the padding mask.
            if value == self.pad_id:
                raise ValueError(
                    f"TransformerConfig.{name}: expected an id different from pad_id={self.pad_id}, "
                    f"got {shown(value, str)}")
        # It may equal pad_id (Marian): the target mask then keeps column 0 (`shared.masks`).
        if self.decoder_start_id is not None and not 0 <= self.decoder_start_id < self.tgt_vocab:
            raise ValueError(
                f"TransformerConfig.decoder_start_id: expected None or 0 <= decoder_start_id < "
                f"tgt_vocab={self.tgt_vocab}, got {self.decoder_start_id}")

    def _validate_variants(self) -> None:
        """The string choices, and the combinations a positional table cannot represent."""
        for name, known in (("activation", ACTIVATIONS), ("positional", POSITIONALS),
                            ("pe_layout", PE_LAYOUTS), ("pe_timescale", PE_TIMESCALES)):
            value = getattr(self, name)
            if not isinstance(value, str) or value not in known:
                raise ValueError(f"TransformerConfig.{name}: expected one of {known}, got {shown(value)}")
        if self.positional == "learned":
            # A learned table has no layout, frequencies or offset: a non-default value would mean
            # nothing, and silently ignoring it would describe a model that is not the one built.
            defaults = {"pe_layout": "interleaved", "pe_timescale": "paper", "pe_offset": 0}
            for name, default in defaults.items():
                if getattr(self, name) != default:
                    raise ValueError(
                        f"TransformerConfig.{name}: expected {default!r} (the default) with "
                        f"positional='learned' (a learned table has no {name}), got {getattr(self, name)!r}")
            return
        # [sin | cos] needs two halves of d_model / 2 columns, and t2t's frequencies divide by
        # d_model / 2 - 1: an odd or too small d_model has no such table (the sources pad with a
        # zero column or divide by zero); refused rather than guessed.
        if self.pe_layout == "halves" and self.d_model % 2:
            raise ValueError(
                "TransformerConfig.d_model: expected an even d_model with pe_layout='halves' "
                f"([sin | cos] halves of d_model / 2 columns), got {self.d_model}")
        if self.pe_timescale == "t2t" and (self.d_model % 2 or self.d_model < 4):
            raise ValueError(
                "TransformerConfig.d_model: expected an even d_model >= 4 with pe_timescale='t2t' "
                f"(its frequencies divide by d_model / 2 - 1), got {self.d_model}")

    # -- derived ----------------------------------------------------------------------------------
    @property
    def d_k(self) -> int:
        """Width of one attention head: ``head_dim``, or ``d_model // n_heads`` when that is None."""
        return self.head_dim if self.head_dim is not None else self.d_model // self.n_heads

    @property
    def start_id(self) -> int:
        """The first decoder input token in decoding: ``decoder_start_id``, or ``bos_id`` when None."""
        return self.decoder_start_id if self.decoder_start_id is not None else self.bos_id

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with some fields changed (validated again).

        ``final_norm`` is re-derived from ``norm_first`` (present for pre-norm, absent for
        post-norm) when ``norm_first`` changes value and ``final_norm`` is not given: a new placement
        implies its usual final norm. Otherwise ``final_norm`` is kept as it is, an explicit one
        included: ``replace(norm_first=<the same>)`` changes nothing."""
        self._check_fields(changes, "TransformerConfig.replace")
        # `is not`: a valid norm_first is one of the two bools, and anything else (an array, whose
        # != is no bool) is refused by the validation, never compared.
        if "norm_first" in changes and changes["norm_first"] is not self.norm_first \
                and "final_norm" not in changes:
            changes["final_norm"] = None  # re-derived from the new placement in __post_init__
        return dataclasses.replace(self, **changes)

    # -- JSON -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TransformerConfig":
        if not isinstance(data, Mapping):
            raise ValueError(f"TransformerConfig.from_dict: expected a mapping, got {type(data).__name__}")
        cls._check_fields(data, "TransformerConfig.from_dict")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in data)
        if missing:
            raise ValueError(f"TransformerConfig.from_dict: missing required fields {missing}")
        return cls(**dict(data))

    @classmethod
    def _check_fields(cls, names, where: str) -> None:
        """Refuse names that are no field, all of them, by repr: a mapping's keys may be of any type,
        and reprs sort where mixed keys do not."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(shown(name) for name in names if name not in known)
        if unknown:
            raise ValueError(f"{where}: unknown fields [{', '.join(unknown)}] (written by a newer "
                             "version? this version does not know them and will not guess)")

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransformerConfig":
        return cls.from_dict(parse_json(text, "TransformerConfig.from_json"))

    # -- presets ----------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """A named configuration: ``tiny`` (tests), ``small`` (quick demos), ``base`` or ``big`` (the paper)."""
        if not isinstance(name, str) or name not in PRESETS:  # a list is no key of PRESETS: unhashable
            raise ValueError(f"TransformerConfig.preset: name expected one of {sorted(PRESETS)}, "
                             f"got {shown(name)}")
        cls._check_fields(overrides, "TransformerConfig.preset")
        return cls(**{**PRESETS[name], **overrides})


# Every int field is a size or an id, int64 in every backend (ids are int64 arrays): one past it
# is no model, and an int of thousands of digits would not even print in a message.
INT64_MAX = 2**63 - 1


def _check_int64(name: str, value: int) -> None:
    if not -INT64_MAX - 1 <= value <= INT64_MAX:
        raise ValueError(f"TransformerConfig.{name}: expected an int that int64 holds (a size or an "
                         f"id), got {shown(value, str)}")


# float32's largest value and smallest normal one: an eps outside rounds to inf or towards 0 in a
# float32 norm (kept here without NumPy: shared.config imports only the standard library and
# shared.messages).
FLOAT32_MAX = 3.4028234663852886e38
FLOAT32_TINY = 1.1754943508222875e-38


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object's dict, refusing a key given twice: Python's reader keeps the last value,
    others the first, so which one a file means is ambiguous (``{"d_model": 16, "d_model": 32}``
    built a model of 32 without a word)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


def parse_json(text: str, source: str):
    """``json.loads(text)``, every way it can fail a ValueError naming ``source``: no text at all (not
    a str or bytes), not JSON, an integer too long to convert (Python's limit of 4300 digits),
    nesting too deep to parse, a key given twice in one object."""
    if not isinstance(text, (str, bytes, bytearray)):  # json's own TypeError would not name source
        raise ValueError(f"{source}: expected a str or bytes of JSON, got {type(text).__name__}")
    try:
        return json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise ValueError(f"{source}: not valid JSON (nested too deeply to read)") from None
    except _DuplicateKey as err:
        raise ValueError(f"{source}: the key {shown(err.args[0])} appears twice in one object (which "
                         "value is meant is ambiguous: JSON readers differ); keep one") from None
    except ValueError as err:  # JSONDecodeError, and the integer-length limit
        raise ValueError(f"{source}: not valid JSON ({err})") from None


# The paper (Vaswani et al. 2017, Table 3) shares one 37000-token BPE vocabulary between source,
# target and the pre-softmax projection, and uses post-norm. eps 1e-6 follows tensor2tensor.
PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(src_vocab=13, tgt_vocab=17, d_model=16, n_heads=4, d_ff=32, n_encoder_layers=2,
                 n_decoder_layers=2, dropout=0.1, max_len=64, norm_first=True,
                 norm_style="annotated", norm_eps=1e-6),
    "small": dict(src_vocab=1000, tgt_vocab=1000, d_model=128, n_heads=4, d_ff=512,
                  n_encoder_layers=2, n_decoder_layers=2, dropout=0.1, max_len=256,
                  norm_first=False, norm_style="standard", norm_eps=1e-6),
    "base": dict(src_vocab=37000, tgt_vocab=37000, d_model=512, n_heads=8, d_ff=2048,
                 n_encoder_layers=6, n_decoder_layers=6, dropout=0.1, max_len=1024,
                 norm_first=False, norm_style="standard", norm_eps=1e-6,
                 share_embeddings=True, tie_output=True),
    "big": dict(src_vocab=37000, tgt_vocab=37000, d_model=1024, n_heads=16, d_ff=4096,
                n_encoder_layers=6, n_decoder_layers=6, dropout=0.3, max_len=1024,
                norm_first=False, norm_style="standard", norm_eps=1e-6,
                share_embeddings=True, tie_output=True),
}
