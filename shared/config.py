"""The model configuration: one frozen, validated dataclass that every implementation reads.

A `TransformerConfig` is checked when it is built, so an impossible model (``d_model`` not divisible
by ``n_heads``, a special id outside the vocabulary, ...) fails at construction with a ``ValueError``
naming the field, what was expected and what was got, never later inside a matmul.
"""
from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any, Mapping

NORM_STYLES = ("standard", "annotated")
# The largest positional table (max_len x d_model values) a config may ask for: 2**28 values, 2 GiB
# in float64 (the table is computed in float64, docs/design.md convention 4). Past it the table is
# refused here, by name, rather than failing as a MemoryError (or a swap storm) inside NumPy.
POSITIONAL_TABLE_LIMIT = 2 ** 28
DTYPES = ("float32", "float64")


@dataclass(frozen=True)
class TransformerConfig:
    """Hyper-parameters of the encoder-decoder Transformer.

    Args:
        src_vocab, tgt_vocab: vocabulary sizes of source and target.
        d_model: width of every residual stream; must be divisible by ``n_heads``.
        n_heads: attention heads; each head has ``d_k = d_model // n_heads``.
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

    def __post_init__(self) -> None:
        if self.final_norm is None:
            object.__setattr__(self, "final_norm", self.norm_first)
        self._validate()

    # -- validation -------------------------------------------------------------------------------
    def _validate(self) -> None:
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_len",
                     "n_encoder_layers", "n_decoder_layers", "pad_id", "bos_id", "eos_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"TransformerConfig.{name}: expected an int, got {value!r}")
        for name in ("src_vocab", "tgt_vocab", "d_model", "n_heads", "d_ff", "max_len",
                     "n_encoder_layers", "n_decoder_layers"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"TransformerConfig.{name}: expected a positive int, got {value}")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"TransformerConfig.d_model: expected a multiple of n_heads={self.n_heads}, "
                f"got {self.d_model}")
        for name in ("dropout", "norm_eps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"TransformerConfig.{name}: expected a float, got {value!r}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"TransformerConfig.dropout: expected a value in [0, 1), got {self.dropout}")
        if not (self.norm_eps > 0.0 and math.isfinite(self.norm_eps)):
            raise ValueError(f"TransformerConfig.norm_eps: expected a positive finite float, "
                             f"got {self.norm_eps}")
        if self.max_len * self.d_model > POSITIONAL_TABLE_LIMIT:
            raise ValueError(
                f"TransformerConfig.max_len: expected max_len * d_model <= POSITIONAL_TABLE_LIMIT = "
                f"{POSITIONAL_TABLE_LIMIT} (the float64 positional table, 2 GiB), got {self.max_len} * "
                f"{self.d_model} = {self.max_len * self.d_model}")
        for name in ("norm_first", "final_norm", "share_embeddings", "tie_output"):
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ValueError(f"TransformerConfig.{name}: expected a bool, got {value!r}")
        if self.norm_style not in NORM_STYLES:
            raise ValueError(
                f"TransformerConfig.norm_style: expected one of {NORM_STYLES}, got {self.norm_style!r}")
        if self.norm_style == "annotated" and self.d_model < 2:
            raise ValueError("TransformerConfig.d_model: expected >= 2 with norm_style='annotated' "
                             f"(its unbiased std divides by d_model - 1), got {self.d_model}")
        if self.dtype not in DTYPES:
            raise ValueError(f"TransformerConfig.dtype: expected one of {DTYPES}, got {self.dtype!r}")
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
                    f"got {value}")
            # A pad id equal to BOS/EOS would hide that token from attention via the padding mask.
            if value == self.pad_id:
                raise ValueError(
                    f"TransformerConfig.{name}: expected an id different from pad_id={self.pad_id}, "
                    f"got {value}")

    # -- derived ----------------------------------------------------------------------------------
    @property
    def d_k(self) -> int:
        """Width of one attention head."""
        return self.d_model // self.n_heads

    def replace(self, **changes: Any) -> "TransformerConfig":
        """A copy with some fields changed (validated again)."""
        if "norm_first" in changes and "final_norm" not in changes:
            changes["final_norm"] = None  # re-derive from the new placement
        return dataclasses.replace(self, **changes)

    # -- JSON -------------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "TransformerConfig":
        if not isinstance(data, Mapping):
            raise ValueError(f"TransformerConfig.from_dict: expected a mapping, got {type(data).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"TransformerConfig.from_dict: unknown fields {unknown}")
        missing = sorted(f.name for f in dataclasses.fields(cls)
                         if f.default is dataclasses.MISSING and f.name not in data)
        if missing:
            raise ValueError(f"TransformerConfig.from_dict: missing required fields {missing}")
        return cls(**dict(data))

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "TransformerConfig":
        try:
            data = json.loads(text)
        except json.JSONDecodeError as err:
            raise ValueError(f"TransformerConfig.from_json: not valid JSON ({err})") from None
        return cls.from_dict(data)

    # -- presets ----------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> "TransformerConfig":
        """A named configuration: ``tiny`` (tests), ``small`` (quick demos), ``base`` or ``big`` (the paper)."""
        if name not in PRESETS:
            raise ValueError(f"TransformerConfig.preset: name expected one of {sorted(PRESETS)}, got {name!r}")
        return cls(**{**PRESETS[name], **overrides})


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
