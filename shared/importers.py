"""Importers: state dicts of two well-known PyTorch layouts -> ``(TransformerConfig, canonical weights)``.

NumPy only: the caller converts the state dict to ``{name: numpy array}`` first (for torch,
``{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()}``).

An importer converts or refuses; it never guesses. Whatever decides the computation and is *not*
stored in a state dict (norm placement, layer-norm eps, activation, special token ids, head count) is
a keyword argument, and whatever *is* stored is checked: every key must be known and present with the
shape the inferred sizes imply, every tensor must be finite float of one dtype, and a positional
encoding buffer must be the interleaved table of `shared.positional`. All problems are reported
together in one `ImporterError`; nothing is returned partially.

A positional buffer is checked, not imported: the canonical model adds the exact float64 table. A
buffer built in float32 differs from it by float32 rounding (up to about 1e-7 * position), which is
below what a float32 model resolves; float64 parity needs a buffer built in float64.

Both importers keep a separate canonical copy of every source tensor (``share_embeddings`` and
``tie_output`` stay False): a source that ties, e.g., the generator to the target embedding holds
equal tensors under both names, and two equal copies compute identically.
"""
from __future__ import annotations

import re
from typing import Callable, Mapping

import numpy as np

from .config import DTYPES, TransformerConfig
from .positional import positional_encoding
from .weights import PROJECTIONS, WeightsError, check_weights

_LISTED = 30  # names listed per problem before "... and N more"
_EPS32 = float(np.finfo(np.float32).eps)
_BIASES = (".bias", ".in_proj_bias")


class ImporterError(WeightsError):
    """A state dict an importer refuses: every problem at once, in ``problems`` and the message."""


def _names(keys) -> str:
    keys = sorted(keys)
    more = f" ... and {len(keys) - _LISTED} more" if len(keys) > _LISTED else ""
    return f"{keys[:_LISTED]}{more}"


def _transpose(a: np.ndarray) -> np.ndarray:
    return a.T  # torch Linear stores (out, in); canonical kernels are (in, out): y = x @ kernel + bias


class _Import:
    """The state dict under import, the problems found so far and the plan: expected source key ->
    shape, and the canonical tensors computed from each key."""

    def __init__(self, source: str, state_dict, dtype, allow_nonfinite: bool):
        self.source, self.problems = source, []
        self.shapes: dict[str, tuple[int, ...]] = {}
        self.outputs: dict[str, list[tuple[str, Callable[[np.ndarray], np.ndarray]]]] = {}
        self.buffers: set[str] = set()  # present keys checked elsewhere (positional tables)
        if not isinstance(state_dict, Mapping):
            raise TypeError(f"{source}: state_dict expected a dict of name -> numpy array, "
                            f"got {type(state_dict).__name__}")
        odd = [k for k in state_dict if not isinstance(k, str)]
        if odd:
            raise TypeError(f"{source}: state_dict keys expected str, got {odd[:_LISTED]!r}")
        self.sd = dict(state_dict)
        self.dtype = self._check_arrays(dtype, allow_nonfinite)

    def problem(self, text: str) -> None:
        self.problems.append(text)

    def _check_arrays(self, dtype, allow_nonfinite: bool) -> str | None:
        by_dtype: dict[str, list[str]] = {}
        for key, value in self.sd.items():
            if not isinstance(value, np.ndarray):
                self.problem(f"{key}: expected a numpy array, got {type(value).__name__} "
                             "(convert torch tensors with .detach().cpu().numpy())")
            elif value.dtype.kind != "f":
                self.problem(f"{key}: expected a floating-point tensor, got dtype {value.dtype}")
            else:
                by_dtype.setdefault(str(value.dtype), []).append(key)
                if not allow_nonfinite and not np.isfinite(value).all():
                    self.problem(f"{key}: contains NaN or Inf")
        if len(by_dtype) > 1:
            listed = "; ".join(f"{d}: {_names(k)}" for d, k in sorted(by_dtype.items()))
            self.problem(f"mixed dtypes (expected one float dtype for every tensor): {listed}")
        if dtype is not None:
            try:
                name = np.dtype(dtype).name
            except TypeError:
                name = None
            if name not in DTYPES:
                self.problem(f"dtype: expected one of {DTYPES} or None, got {dtype!r}")
                return None
            return name
        if len(by_dtype) == 1:
            (found,) = by_dtype
            if found in DTYPES:
                return found
            self.problem(f"source dtype {found}: pass dtype='float32' or 'float64' to convert it "
                         "explicitly (the canonical model computes in float32 or float64)")
        return None

    # -- sizes ------------------------------------------------------------------------------------
    def size(self, what: str, candidates: list[tuple[str, int]]) -> int | None:
        """A size read from the first candidate ``(key, axis)`` present with that axis."""
        for key, axis in candidates:
            value = self.sd.get(key)
            if isinstance(value, np.ndarray) and value.ndim > axis:
                return int(value.shape[axis])
        self.problem(f"cannot infer {what}: none of {[k for k, _ in candidates]} is present")
        return None

    def layer_count(self, prefix: str) -> int:
        pattern = re.compile(rf"^{re.escape(prefix)}\.(\d+)\.")
        found = [int(m.group(1)) for k in self.sd if (m := pattern.match(k))]
        if not found:
            self.problem(f"no layers: expected keys {prefix}.0.*")
            return 0
        return max(found) + 1  # a gap shows up as missing keys of that layer

    # -- plan -------------------------------------------------------------------------------------
    def expect(self, key: str, shape: tuple[int, ...], *outputs) -> None:
        self.shapes[key] = shape
        self.outputs[key] = list(outputs)

    def linear(self, src: str, dst: str, n_in: int, n_out: int) -> None:
        self.expect(f"{src}.weight", (n_out, n_in), (f"{dst}.kernel", _transpose))
        self.expect(f"{src}.bias", (n_out,), (f"{dst}.bias", np.asarray))

    def norm(self, src: str, dst: str, d: int, gain: str, offset: str) -> None:
        self.expect(f"{src}.{gain}", (d,), (f"{dst}.gamma", np.asarray))
        self.expect(f"{src}.{offset}", (d,), (f"{dst}.beta", np.asarray))

    def hint_layout(self, hints: list[tuple[Callable[[str], bool], str]]) -> None:
        """Name the right importer when keys of another layout are given."""
        for applies, text in hints:
            if any(applies(k) for k in self.sd):
                self.problem(text)

    def check_keys(self, bias_hint: str) -> None:
        missing = [k for k in self.shapes if k not in self.sd]
        unexpected = [k for k in self.sd if k not in self.shapes and k not in self.buffers]
        if missing:
            self.problem(f"missing keys: {_names(missing)}")
        if unexpected:
            self.problem(f"unexpected keys: {_names(unexpected)}")
        biases = [k for k in self.shapes if k.endswith(_BIASES)]
        if missing and all(k.endswith(_BIASES) for k in missing) and 2 * len(missing) >= len(biases):
            self.problem(bias_hint)
        for key, shape in self.shapes.items():
            value = self.sd.get(key)
            if isinstance(value, np.ndarray) and value.shape != shape:
                self.problem(f"{key}: expected shape {shape}, got {value.shape}")

    def positional(self, keys: list[str], max_len: int | None, d: int | None) -> int | None:
        """Check the positional tables present among ``keys``; return the max_len they imply."""
        lengths = []
        for key in keys:
            value = self.sd.get(key)
            if key not in self.sd:
                continue
            self.buffers.add(key)
            if not isinstance(value, np.ndarray) or value.dtype.kind != "f" or d is None:
                continue  # already reported
            table = _squeeze_table(value)
            if table is None or table.shape[1] != d:
                self.problem(f"{key}: expected a positional table of shape (max_len, 1, {d}), "
                             f"(1, max_len, {d}) or (max_len, {d}), got {value.shape}")
                continue
            bad = _first_non_interleaved_row(table)
            if bad is not None:
                self.problem(
                    f"{key}: not the interleaved sinusoidal table (PE[p, 2i] = sin, PE[p, 2i+1] = cos "
                    f"of p / 10000^(2i/d), p from 0); row {bad} differs. Another layout (e.g. "
                    "concatenated [sin | cos], other frequencies or offsets, a learned table) "
                    "would compute differently; refusing")
                continue
            lengths.append(table.shape[0])
        if not lengths:
            if max_len is None and not any(k in self.sd for k in keys):
                self.problem(f"no positional table ({' / '.join(keys)}): pass max_len to declare "
                             "that the model adds the interleaved sinusoidal encoding (e.g. from a "
                             "non-persistent buffer); refusing to assume it")
            return max_len
        implied = min(lengths)  # the source cannot run longer sequences than its shortest table
        if max_len is not None and max_len > implied:
            self.problem(f"max_len: expected at most {implied} (the stored positional table), "
                         f"got {max_len}")
        return implied if max_len is None else max_len

    def config(self, **fields) -> TransformerConfig | None:
        if self.problems:
            return None
        try:
            return TransformerConfig(**fields)
        except ValueError as err:
            self.problem(str(err))
            return None

    def finish(self, config: TransformerConfig | None) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
        if self.problems or config is None:
            raise ImporterError(self.source, self.problems)
        weights: dict[str, np.ndarray] = {}
        for key, outputs in self.outputs.items():
            for name, fn in outputs:
                # A copy: the result never aliases the caller's arrays.
                weights[name] = np.array(fn(self.sd[key]), dtype=self.dtype, order="C", copy=True)
        check_weights(config, weights, source=self.source, allow_nonfinite=True)  # invariant
        return config, weights


def _squeeze_table(value: np.ndarray) -> np.ndarray | None:
    if value.ndim == 2:
        return value
    if value.ndim == 3 and value.shape[1] == 1:
        return value[:, 0, :]  # (max_len, 1, d): the tutorial's seq-first buffer
    if value.ndim == 3 and value.shape[0] == 1:
        return value[0]  # (1, max_len, d): batch-first buffers (Annotated Transformer)
    return None


def _first_non_interleaved_row(table: np.ndarray) -> int | None:
    """The first row that is not `shared.positional`'s table up to the buffer's rounding, or None.

    A table built in float32 carries an angle error of a few ulps of ``p * frequency`` (<= p): at
    most 8e-8 * p was measured for max_len 5000 and d up to 1024. Row p may differ by
    8 * eps * (1 + p) (12 times that), eps that of the buffer's dtype but at least float32's: a
    float64 buffer is often a float32 one cast by ``model.double()``. Another layout differs by O(1)
    within the first rows."""
    eps = max(float(np.finfo(table.dtype).eps), _EPS32)
    expected = positional_encoding(table.shape[0], table.shape[1])
    rows = np.abs(table.astype(np.float64) - expected).max(axis=1)
    allowed = 8 * eps * (1.0 + np.arange(table.shape[0]))
    bad = np.flatnonzero(~(rows <= allowed))
    return int(bad[0]) if bad.size else None


def _n_heads_problem(n_heads, d: int | None) -> str | None:
    if isinstance(n_heads, bool) or not isinstance(n_heads, (int, np.integer)) or n_heads < 1:
        return f"n_heads: expected a positive int, got {n_heads!r}"
    if d is not None and d % n_heads:
        return f"n_heads: expected a divisor of d_model={d}, got {n_heads}"
    return None


# -- PyTorch nn.Transformer (the translation tutorial's Seq2SeqTransformer) -----------------------
def from_nn_transformer(state_dict: Mapping[str, np.ndarray], *, n_heads: int, norm_first: bool,
                        pad_id: int, bos_id: int, eos_id: int, norm_eps: float = 1e-5,
                        activation: str = "relu", max_len: int | None = None, dropout: float = 0.1,
                        dtype=None, allow_nonfinite: bool = False
                        ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import the ``Seq2SeqTransformer`` of PyTorch's translation tutorial.

    Layout: ``transformer.*`` (an ``nn.Transformer``; ``batch_first`` is not in the weights and
    does not matter), ``src_tok_emb.embedding.weight`` / ``tgt_tok_emb.embedding.weight`` (token
    embeddings the model multiplies by ``sqrt(emb_size)``, as the canonical model does),
    ``positional_encoding.pos_embedding`` (the tutorial's interleaved table, ``(max_len, 1, d)``;
    ``(1, max_len, d)`` and ``(max_len, d)`` are accepted too) and ``generator.weight/bias``.

    Mapping: ``self_attn`` / ``multihead_attn`` -> ``self_attn`` / ``cross_attn``, their packed
    ``in_proj_weight/bias`` split in the order query, key, value, ``out_proj`` -> ``output``;
    ``linear1/linear2`` -> ``ffn.inner/outer``; encoder ``norm1/norm2`` -> ``self_attn_norm/ffn_norm``,
    decoder ``norm1/2/3`` -> ``self_attn_norm/cross_attn_norm/ffn_norm``; every Linear transposed
    from torch's (out, in) to (in, out). ``nn.Transformer`` always ends each stack with a layer norm
    (``transformer.encoder.norm``, ``transformer.decoder.norm``), in post-norm too: the config says
    ``final_norm=True`` for both placements. Layer norms are torch's: ``norm_style="standard"``.

    Args:
        state_dict: ``{name: numpy array}``, all float32 or all float64 (float16 with ``dtype``).
        n_heads: attention heads (not stored; must divide d_model).
        norm_first: the ``norm_first`` the model was built with (not stored; ``nn.Transformer``'s
            default is False, post-norm). Required: a wrong value loads silently and computes
            something else.
        pad_id, bos_id, eos_id: the special ids (the tutorial uses 1, 2, 3).
        norm_eps: ``layer_norm_eps`` (not stored); nn.Transformer's default 1e-5.
        activation: the FFN activation (not stored, cannot be detected from the weights); only
            ``"relu"``, nn.Transformer's default, can be imported: anything else is refused.
        max_len: needed only when the state dict holds no positional table (a non-persistent
            buffer); it declares that the model adds the interleaved sinusoidal encoding.
            With a table, defaults to its length and may not exceed it.
        dropout: recorded in the config for further training; not used in inference.
        dtype: ``"float32"``/``"float64"`` to cast to; default the source's dtype.
        allow_nonfinite: import NaN/Inf values instead of refusing them.

    Bias-less models (``nn.Transformer(bias=False)``) are refused: their keys are missing.

    Returns:
        ``(config, weights)``; ``weights`` follows `shared.weights.weight_schema(config)`.

    Raises:
        ImporterError: every problem found, naming the keys.
    """
    imp = _Import("from_nn_transformer", state_dict, dtype, allow_nonfinite)
    sd = imp.sd
    if activation != "relu":
        imp.problem(f"activation: expected 'relu' (the only activation of the canonical model), "
                    f"got {activation!r}")
    if not isinstance(norm_first, bool):
        imp.problem(f"norm_first: expected a bool, got {norm_first!r}")
    enc, dec = "transformer.encoder", "transformer.decoder"
    d = imp.size("d_model", [("src_tok_emb.embedding.weight", 1), ("tgt_tok_emb.embedding.weight", 1),
                             (f"{enc}.norm.weight", 0), ("generator.weight", 1)])
    d_ff = imp.size("d_ff", [(f"{enc}.layers.0.linear1.weight", 0), (f"{dec}.layers.0.linear1.weight", 0)])
    src_vocab = imp.size("src_vocab", [("src_tok_emb.embedding.weight", 0)])
    tgt_vocab = imp.size("tgt_vocab", [("tgt_tok_emb.embedding.weight", 0), ("generator.weight", 0),
                                       ("generator.bias", 0)])
    n_enc, n_dec = imp.layer_count(f"{enc}.layers"), imp.layer_count(f"{dec}.layers")
    if (text := _n_heads_problem(n_heads, d)) is not None:
        imp.problem(text)
    max_len = imp.positional(["positional_encoding.pos_embedding"], max_len, d)
    imp.hint_layout([
        (lambda k: ".sublayer." in k or ".linears." in k,
         "hint: these look like Annotated Transformer keys: use from_annotated"),
        (lambda k: k.startswith(("encoder.layers.", "decoder.layers.")) and k.endswith("in_proj_weight"),
         "hint: keys of a bare nn.Transformer: this layout expects it under 'transformer.' beside "
         "the embeddings and generator of the tutorial's Seq2SeqTransformer"),
    ])
    if None in (d, d_ff, src_vocab, tgt_vocab):
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        parts = [(slice(i * d, (i + 1) * d), p) for i, p in enumerate(PROJECTIONS[:3])]  # q, k, v rows
        imp.expect(f"{src}.in_proj_weight", (3 * d, d),
                   *[(f"{dst}.{p}.kernel", lambda a, s=s: a[s].T) for s, p in parts])
        imp.expect(f"{src}.in_proj_bias", (3 * d,),
                   *[(f"{dst}.{p}.bias", lambda a, s=s: a[s]) for s, p in parts])
        imp.linear(f"{src}.out_proj", f"{dst}.output", d, d)

    def ffn(src: str, dst: str) -> None:
        imp.linear(f"{src}.linear1", f"{dst}.inner", d, d_ff)
        imp.linear(f"{src}.linear2", f"{dst}.outer", d_ff, d)

    imp.expect("src_tok_emb.embedding.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
    imp.expect("tgt_tok_emb.embedding.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
    for i in range(n_enc):
        s, t = f"{enc}.layers.{i}", f"encoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        ffn(s, f"{t}.ffn")
        for n, name in ((1, "self_attn_norm"), (2, "ffn_norm")):
            imp.norm(f"{s}.norm{n}", f"{t}.{name}", d, "weight", "bias")
    imp.norm(f"{enc}.norm", "encoder.final_norm", d, "weight", "bias")
    for i in range(n_dec):
        s, t = f"{dec}.layers.{i}", f"decoder.layers.{i}"
        attention(f"{s}.self_attn", f"{t}.self_attn")
        attention(f"{s}.multihead_attn", f"{t}.cross_attn")
        ffn(s, f"{t}.ffn")
        for n, name in ((1, "self_attn_norm"), (2, "cross_attn_norm"), (3, "ffn_norm")):
            imp.norm(f"{s}.norm{n}", f"{t}.{name}", d, "weight", "bias")
    imp.norm(f"{dec}.norm", "decoder.final_norm", d, "weight", "bias")
    imp.linear("generator", "generator", d, tgt_vocab)
    imp.check_keys("hint: only bias keys are missing: a model built with bias=False cannot be imported "
                   "(the canonical model has a bias in every layer)")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=norm_first, norm_style="standard", norm_eps=norm_eps, final_norm=True,
        pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, dtype=imp.dtype)
    return imp.finish(config)


# -- The Annotated Transformer (Harvard NLP) EncoderDecoder ---------------------------------------
def from_annotated(state_dict: Mapping[str, np.ndarray], *, n_heads: int, pad_id: int, bos_id: int,
                   eos_id: int, norm_eps: float = 1e-6, max_len: int | None = None,
                   dropout: float = 0.1, dtype=None, allow_nonfinite: bool = False
                   ) -> tuple[TransformerConfig, dict[str, np.ndarray]]:
    """Import the Annotated Transformer's ``EncoderDecoder`` (``make_model``).

    Layout: ``{encoder,decoder}.layers.{i}.self_attn.linears.{0,1,2,3}`` (query, key, value,
    output), decoder ``src_attn`` (-> ``cross_attn``), ``feed_forward.w_1/w_2`` (-> ``ffn.inner/
    outer``), ``sublayer.{j}.norm.a_2/b_2`` (gain/offset of the j-th sublayer's norm: encoder
    self_attn, ffn; decoder self_attn, cross_attn, ffn), ``{encoder,decoder}.norm.a_2/b_2`` (final
    norms), ``{src,tgt}_embed.0.lut.weight`` (embeddings, multiplied by sqrt(d_model) in the model),
    ``{src,tgt}_embed.1.pe`` (interleaved positional tables ``(1, max_len, d)``, checked; max_len is
    the shorter one), ``generator.proj.weight/bias``. Every Linear is transposed to (in, out).

    The model is pre-norm with its own LayerNorm, ``a_2 * (x - mean) / (std + eps) + b_2`` with the
    unbiased std: ``norm_first=True``, ``norm_style="annotated"``, final norms, eps 1e-6.

    Its ``Generator`` returns ``log_softmax(proj(x))``; the canonical model returns the logits
    ``proj(x)``: apply log_softmax to compare with the Generator's output (argmax is the same).

    Args:
        n_heads: attention heads (``h``; not stored; must divide d_model).
        pad_id, bos_id, eos_id: the special ids the model was trained with (not stored).
        norm_eps: the LayerNorm eps (not stored); the Annotated default 1e-6.
        max_len, dropout, dtype, allow_nonfinite: as in `from_nn_transformer`.

    Raises:
        ImporterError: every problem found, naming the keys.
    """
    imp = _Import("from_annotated", state_dict, dtype, allow_nonfinite)
    d = imp.size("d_model", [("src_embed.0.lut.weight", 1), ("tgt_embed.0.lut.weight", 1),
                             ("encoder.norm.a_2", 0), ("generator.proj.weight", 1)])
    d_ff = imp.size("d_ff", [("encoder.layers.0.feed_forward.w_1.weight", 0),
                             ("decoder.layers.0.feed_forward.w_1.weight", 0)])
    src_vocab = imp.size("src_vocab", [("src_embed.0.lut.weight", 0)])
    tgt_vocab = imp.size("tgt_vocab", [("tgt_embed.0.lut.weight", 0), ("generator.proj.weight", 0),
                                       ("generator.proj.bias", 0)])
    n_enc, n_dec = imp.layer_count("encoder.layers"), imp.layer_count("decoder.layers")
    if (text := _n_heads_problem(n_heads, d)) is not None:
        imp.problem(text)
    max_len = imp.positional(["src_embed.1.pe", "tgt_embed.1.pe"], max_len, d)
    imp.hint_layout([(lambda k: k.startswith("transformer.") or k.endswith("in_proj_weight"),
                      "hint: these look like nn.Transformer keys: use from_nn_transformer")])
    if None in (d, d_ff, src_vocab, tgt_vocab):
        raise ImporterError(imp.source, imp.problems)

    def attention(src: str, dst: str) -> None:
        for j, p in enumerate(PROJECTIONS):  # linears 0..3 are query, key, value, output
            imp.linear(f"{src}.linears.{j}", f"{dst}.{p}", d, d)

    def layer(src: str, dst: str, sublayers: tuple[str, ...]) -> None:
        for j, name in enumerate(sublayers):
            if name != "ffn":
                attention(f"{src}.{'src_attn' if name == 'cross_attn' else name}", f"{dst}.{name}")
            imp.norm(f"{src}.sublayer.{j}.norm", f"{dst}.{name}_norm", d, "a_2", "b_2")
        imp.linear(f"{src}.feed_forward.w_1", f"{dst}.ffn.inner", d, d_ff)
        imp.linear(f"{src}.feed_forward.w_2", f"{dst}.ffn.outer", d_ff, d)

    imp.expect("src_embed.0.lut.weight", (src_vocab, d), ("src_embed.embeddings", np.asarray))
    imp.expect("tgt_embed.0.lut.weight", (tgt_vocab, d), ("tgt_embed.embeddings", np.asarray))
    for i in range(n_enc):
        layer(f"encoder.layers.{i}", f"encoder.layers.{i}", ("self_attn", "ffn"))
    imp.norm("encoder.norm", "encoder.final_norm", d, "a_2", "b_2")
    for i in range(n_dec):
        layer(f"decoder.layers.{i}", f"decoder.layers.{i}", ("self_attn", "cross_attn", "ffn"))
    imp.norm("decoder.norm", "decoder.final_norm", d, "a_2", "b_2")
    imp.linear("generator.proj", "generator", d, tgt_vocab)
    imp.check_keys("hint: only bias keys are missing: layers without bias cannot be imported")
    config = imp.config(
        src_vocab=src_vocab, tgt_vocab=tgt_vocab, d_model=d, n_heads=n_heads, d_ff=d_ff,
        n_encoder_layers=n_enc, n_decoder_layers=n_dec, dropout=dropout, max_len=max_len,
        norm_first=True, norm_style="annotated", norm_eps=norm_eps, final_norm=True,
        pad_id=pad_id, bos_id=bos_id, eos_id=eos_id, dtype=imp.dtype)
    return imp.finish(config)
