"""The encoder-decoder Transformer as one ``keras.Model``, mirrored name for name by torch_impl."""
from __future__ import annotations

import types
from typing import Mapping

import keras
import numpy as np
import tensorflow as tf

from shared import TransformerConfig
from shared.checks import (check_cache, check_flag, check_hidden, check_ids_range, check_memory_dtype,
                           check_memory_shape, checked_inputs)
from shared.decoding import check_beam_size, check_max_len
from shared.masks import padding_id, start_is_pad
from shared.messages import type_shown
from shared.weights import check_buildable
from shared.precision import check_precision, compute_dtype_name

from . import weights_io
from .cache import DecoderCache, _as_built, check_free_position
from .embedding import PositionalEncoding, TokenEmbedding
from .inputs import (as_raised, check_ids, check_mask, check_same_batch, check_training, dims, guarded,
                     make_src_mask, make_tgt_mask, poison, to_tensor)
from .layers import Trace, record
from .pipelines import (CheckedPyDataset, check_labels, checked_batches, checked_labels, checked_torch_loader,
                        is_torch_loader, label_rule, unpack_x)
from .stacks import Decoder, Encoder


# The Keras policy of each half precision (`tf_impl.precision`; shared.precision's rule).
POLICIES = {"bfloat16": "mixed_bfloat16", "float16": "mixed_float16"}


class Generator(keras.layers.Layer):
    """Hidden states ``(..., d)`` -> logits ``(..., tgt_vocab)``: ``(B, T, d)`` from `decode`, a
    step's rows ``(N, 1, d)`` (no softmax: that belongs to the loss and to decoding).

    With ``tied`` (an embedding), the projection is that embedding's table ``(vocab, d)``, used as
    ``x @ table.T`` and held outside the layer tree so its variable is not listed twice; otherwise
    its own ``kernel`` ``(d, vocab)``. The ``bias`` is always its own variable.
    """

    def __init__(self, d_model: int, vocab: int, tied: TokenEmbedding | None = None, **kwargs):
        super().__init__(**kwargs)
        self.d_model, self.vocab = d_model, vocab
        self._tied = (lambda: tied) if tied is not None else None  # a closure: not tracked by Keras
        self.kernel = None if tied is not None else self.add_weight(
            name="kernel", shape=(d_model, vocab), initializer="glorot_uniform")
        self.bias = self.add_weight(name="bias", shape=(vocab,), initializer="zeros")
        self.built = True

    @tf.autograph.experimental.do_not_convert  # Python checks: nothing for AutoGraph to convert
    def __call__(self, x, *args, **kwargs):
        """``x`` checked before Keras casts it to the layer's compute dtype: in the variables'
        dtype, as torch_impl's (`shared.checks.check_hidden`), where Keras took float64 into a
        float32 model without a word."""
        with as_raised():
            x = x if isinstance(x, keras.KerasTensor) else to_tensor("x", x)
            shape = [None] if getattr(x.shape, "rank", 0) is None else list(x.shape)  # a KerasTensor's: a tuple
            check_hidden(shape, tf.as_dtype(x.dtype).name, self.d_model, self.bias.dtype)
        return super().__call__(x, *args, **kwargs)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        flat = tf.reshape(x, [-1, self.d_model])  # (rows, d): one 2-D matmul, no batch broadcast
        if self._tied is not None:
            logits = tf.matmul(flat, self._tied().embeddings, transpose_b=True)  # (rows, V)
        else:
            logits = tf.matmul(flat, self.kernel)  # (rows, V)
        if x.shape.rank is None:
            shape = tf.concat([tf.shape(x)[:-1], [self.vocab]], 0)
        else:
            shape = dims(x, x.shape.rank - 1) + [self.vocab]  # (B, T, V) from decode, (N, 1, V) from a step
        return tf.reshape(logits + self.bias, shape)  # (..., V)


@keras.saving.register_keras_serializable(package="tf_impl")
class Transformer(keras.Model):
    """The 2017 encoder-decoder Transformer, configured by a `shared.TransformerConfig`.

    Sublayers: ``src_embed``, ``tgt_embed`` (the same layer when ``config.share_embeddings``; each
    holds its learned ``positions`` when ``config.positional == "learned"``), ``positional``,
    ``encoder``, ``decoder``, ``generator``. Variables are created in ``config.dtype`` at
    construction, with the training initialisation (Xavier-uniform matrices, zero biases, unit
    gains), so `import_weights` / `export_weights` work before any call. Dropout is active only with
    ``training=True``.

    Masks everywhere are boolean, ``True`` = may attend, broadcastable to
    ``(batch, heads, q_len, k_len)``; when omitted they are derived from ``config.pad_id``.

    Runs eagerly, inside ``tf.function`` (also ``jit_compile=True``) and through ``predict``; see
    `tf_impl.inputs` for how bad token ids are caught in each.
    """

    def __init__(self, config: TransformerConfig, **kwargs):
        if not isinstance(config, TransformerConfig):
            raise TypeError(f"config: expected a TransformerConfig, got {type(config).__name__}")
        # a model this machine cannot hold: one line naming config, not the framework's own OOM
        check_buildable(config, "inference", "config")
        if "dtype" in kwargs:  # Keras' layer argument: taken, and ignored by every variable made here
            raise TypeError(f"dtype: the model's is config.dtype ({config.dtype!r}), its mixed precision "
                            f"tf_impl.precision.set_precision's; got dtype={kwargs['dtype']!r}")
        super().__init__(dtype=config.dtype, **kwargs)
        self.config = config
        # Inputs are converted here, without Keras' autocast (float ids must fail as float ids).
        self._convert_input_args = False
        self._allow_non_tensor_positional_args = True
        c, dtype = config, config.dtype
        positions = c.max_len if c.positional == "learned" else None
        self.src_embed = TokenEmbedding(c.src_vocab, c.d_model, c.embed_scale, positions, dtype=dtype,
                                        name="src_embed")
        self.tgt_embed = (self.src_embed if c.share_embeddings
                          else TokenEmbedding(c.tgt_vocab, c.d_model, c.embed_scale, positions,
                                              dtype=dtype, name="tgt_embed"))
        self.positional = PositionalEncoding(c, name="positional")
        self.encoder = Encoder(c, name="encoder")
        self.decoder = Decoder(c, name="decoder")
        self.generator = Generator(c.d_model, c.tgt_vocab, self.tgt_embed if c.tie_output else None,
                                   dtype=dtype, name="generator")
        self.built = True

    # -- input checks (all before any compute) ----------------------------------------------------
    def _src_mask(self, src: tf.Tensor, src_mask, q_len: int | None = 1) -> tf.Tensor:
        if src_mask is None:
            return make_src_mask(src, padding_id(self.config))
        b, s = dims(src, 2)  # ints, or tensors for sizes known only at run time
        return check_mask("src_mask", src_mask, b, self.config.n_heads, q_len, s)

    def _tgt_mask(self, tgt: tf.Tensor, tgt_mask) -> tf.Tensor:
        if tgt_mask is None:
            return make_tgt_mask(tgt, padding_id(self.config), start_is_pad(self.config))
        b, t = dims(tgt, 2)
        return check_mask("tgt_mask", tgt_mask, b, self.config.n_heads, t, t)

    # -- the computation --------------------------------------------------------------------------
    def _encode(self, src: tf.Tensor, src_mask: tf.Tensor, trace: Trace | None,
                training: bool) -> tf.Tensor:
        x = self.positional(self.src_embed(src), self.src_embed.positions,
                            training=training)  # (B, S, d)
        record(trace, "encoder.embed", x)
        memory = self.encoder(x, src_mask, trace=trace, training=training)
        record(trace, "encoder.output", memory)
        return memory

    def _decode(self, tgt: tf.Tensor, memory: tf.Tensor, src_mask: tf.Tensor, tgt_mask: tf.Tensor,
                trace: Trace | None, training: bool) -> tf.Tensor:
        x = self.positional(self.tgt_embed(tgt), self.tgt_embed.positions,
                            training=training)  # (B, T, d)
        record(trace, "decoder.embed", x)
        hidden = self.decoder(x, memory, src_mask, tgt_mask, trace=trace, training=training)
        record(trace, "decoder.output", hidden)
        return hidden

    # -- public API -------------------------------------------------------------------------------
    def call(self, src, tgt=None, src_mask=None, tgt_mask=None, training: bool = False,
             return_trace: bool = False):
        """Logits for every target position.

        Args:
            src: source ids ``(B, S)``, integer, values in ``[0, src_vocab)``, ``S <= max_len``.
                For ``predict`` (which passes one ``x``), ``src`` may also be a tuple
                ``(src, tgt[, src_mask, tgt_mask])`` or a dict with those keys.
            tgt: target input ids ``(B, T)`` (BOS first), integer, values in ``[0, tgt_vocab)``.
            src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; used by encoder
                self-attention and cross-attention, so its query axis is 1. Default ``src != pad_id``.
            tgt_mask: bool, broadcastable to ``(B, H, T, T)``. Default: padding AND subsequent.
            training: dropout on (at the sites of docs/design.md, convention 9).
            return_trace: also return the named intermediates of `shared.reference`.

        Returns:
            logits ``(B, T, tgt_vocab)``, or ``(logits, trace)``: a dict of tensors with the names and
            order of `shared.reference.trace_names(config)`.

        Raises:
            TypeError / ValueError: bad ids or masks, with the messages of `shared.checks`.
            tf.errors.InvalidArgumentError: in graph mode, ids out of range (same message text).
        """
        c = self.config
        with as_raised(), guarded() as failed:  # under XLA: the run-time checks, which poison the outputs
            if tgt is None:
                src, tgt, src_mask, tgt_mask = unpack_x(src, src_mask, tgt_mask)
            check_training(training)
            check_flag(return_trace, "return_trace")
            src = check_ids("src", src, c.src_vocab, c.max_len)
            tgt = check_same_batch(src, check_ids("tgt", tgt, c.tgt_vocab, c.max_len))
            src_mask = self._src_mask(src, src_mask)
            tgt_mask = self._tgt_mask(tgt, tgt_mask)
        trace: Trace | None = {} if return_trace else None
        memory = self._encode(src, src_mask, trace, training)
        logits = poison(self.generator(self._decode(tgt, memory, src_mask, tgt_mask, trace, training)),
                        failed)
        if trace is None:
            return logits
        trace = {name: poison(value, failed) for name, value in trace.items()}
        trace["logits"] = logits
        return logits, trace

    def encode(self, src, src_mask=None, training: bool = False) -> tf.Tensor:
        """Source ids ``(B, S)`` -> memory ``(B, S, d_model)``.

        ``src_mask``: bool, True = may attend, broadcastable to ``(B, H, 1, S)``; default ``src != pad_id``.
        """
        check_training(training)
        c = self.config
        with guarded() as failed:
            src = check_ids("src", src, c.src_vocab, c.max_len)
            src_mask = self._src_mask(src, src_mask)
        return poison(self._encode(src, src_mask, None, training), failed)

    def decode(self, tgt, memory, src_mask, tgt_mask=None, training: bool = False) -> tf.Tensor:
        """Target ids ``(B, T)`` and memory ``(B, S, d_model)`` -> hidden states ``(B, T, d_model)``;
        ``self.generator(hidden)`` gives the logits.

        Args:
            src_mask: required (the memory cannot tell where the source padding was): bool,
                True = may attend, broadcastable to ``(B, H, T, S)``, e.g. ``make_src_mask(src, pad_id)``.
            tgt_mask: bool, broadcastable to ``(B, H, T, T)``; default padding AND subsequent.
        """
        check_training(training)
        c = self.config
        memory = self._check_memory(memory)
        if src_mask is None:
            raise ValueError("src_mask: required by decode (the memory cannot tell where the source "
                             "padding was); use tf_impl.inputs.make_src_mask(src, pad_id)")
        with guarded() as failed:
            tgt = check_same_batch(memory, check_ids("tgt", tgt, c.tgt_vocab, c.max_len))
            b, t = dims(tgt, 2)
            src_mask = check_mask("src_mask", src_mask, b, c.n_heads, t, dims(memory, 2)[1])
            tgt_mask = self._tgt_mask(tgt, tgt_mask)
        return poison(self._decode(tgt, memory, src_mask, tgt_mask, None, training), failed)

    def _check_memory(self, memory) -> tf.Tensor:
        """``memory`` as `encode` returns it: ``(B, S, d_model)`` in the model's dtype; as a tensor."""
        memory = to_tensor("memory", memory)
        if memory.shape.rank is None:
            raise ValueError(f"memory: expected a tensor of shape (batch, src_len, {self.config.d_model}), "
                             "got one of unknown rank")
        check_memory_shape(memory.shape, self.config.d_model)
        check_memory_dtype(memory.dtype.name, self.config.dtype)
        return memory

    # -- incremental decoding (the cache of tf_impl.cache) ----------------------------------------
    def init_cache(self, memory, src_mask, max_len: int, beams: int = 1) -> DecoderCache:
        """An empty decoding cache for up to ``max_len`` target positions (BOS included).

        Cross-attention keys and values are computed here, once per source, and repeated for
        ``beams`` rows per item (rows ``item * beams + beam``, the order of `shared.decoding`).

        Args:
            memory: ``(B, S, d_model)`` from `encode`.
            src_mask: bool, True = may attend, broadcastable to ``(B, H, 1, S)``.
            max_len: positions the self-attention buffers hold, ``1 <= max_len <= config.max_len``.
            beams: rows per item (beam size; 1 for greedy), ``1 <= beams <= tgt_vocab - 1``.

        Returns:
            a `DecoderCache` of ``N = B * beams`` rows with ``length == 0``.
        """
        c = self.config
        memory = self._check_memory(memory)
        b, s = dims(memory, 2)
        src_mask = check_mask("src_mask", src_mask, b, c.n_heads, 1, s)
        check_max_len(max_len, c.max_len)
        # A beam has tgt_vocab - 1 children (pad is never generated): more beams than that cannot
        # be filled, and the bound names the argument before a cache of that size is allocated.
        check_beam_size(beams, c.tgt_vocab, name="beams")
        beams = int(beams)
        return self._init_cache(memory, src_mask, max_len, beams)

    def _init_cache(self, memory: tf.Tensor, src_mask: tf.Tensor, max_len: int, beams: int) -> DecoderCache:
        """`init_cache` without the checks (the decoders call it)."""
        if not _as_built(self):  # replaced or quantized layers: the steps call them
            return self.decoder.init_cache(memory, src_mask, max_len, beams, None, None)
        rows = memory.shape[0] * beams if memory.shape[0] is not None else None
        return self.decoder.init_cache(memory, src_mask, max_len, beams, *self._step_weights(rows))

    def _step_weights(self, rows: int | None):
        """The decoder's `tf_impl.cache.StepWeights` and the generator's ``(matrix, bias)``, made
        when a cache is (a compiled decode: once per call, before the loop; torch_impl keeps its
        copies between decodes). The matrix is laid out for the rows a step multiplies
        (`_generator_transposed`): under XLA one row is faster from a ``(d, V)`` kernel, eight
        rows from the ``(V, d)`` table used transposed (docs/performance.md, "Figures behind the
        code's choices")."""
        g = self.generator
        matrix = g._tied().embeddings if g._tied is not None else g.kernel  # (V, d) | (d, V)
        if _generator_transposed(rows) != (g._tied is not None):
            matrix = tf.transpose(matrix)
        weights = (self.decoder.step_weights(), (tf.convert_to_tensor(matrix), tf.convert_to_tensor(g.bias)))
        # a half precision (tf_impl.precision): every kernel and bias cast once, here
        dtype = compute_dtype_name(getattr(self, "precision", "float32"), self.config.dtype)
        return weights if dtype == self.config.dtype else tf.nest.map_structure(
            lambda w: tf.cast(w, dtype), weights)

    def decode_step(self, tokens, cache: DecoderCache) -> tuple[tf.Tensor, DecoderCache]:
        """Logits for the next position of every row, from its newest token and the cache.

        Feeding a target sequence token by token (BOS first) gives, at step ``t``, the logits that
        `call` gives at position ``t`` for that sequence, provided it holds no pad (decoding never
        generates pad; the cached path has no padding mask, see `MultiHeadAttention.extend`).

        Args:
            tokens: ``(N,)`` integer ids in ``[0, tgt_vocab)``, one per cache row: the token at
                position ``cache.length``.
            cache: from `init_cache`; filled at position ``cache.length``.
                It holds the projections of the weights of the moment it was made (make
                a new one after the weights change: docs/design.md, section 7); one whose layers, heads,
                dtype, capacity or vocabulary are not this model's is refused
                (`shared.checks.check_cache`).

        Returns:
            ``(logits (N, tgt_vocab), cache)``: a new cache (tensors are immutable), ``length``
            advanced by one. Works eagerly and inside ``tf.function`` / XLA. The id range is
            checked eagerly (compiled, a bad id's embedding is NaN, `TokenEmbedding`); a full cache
            raises a ``ValueError`` eagerly, an ``InvalidArgumentError`` in graph mode and gives NaN
            logits under XLA (`cache.check_free_position`).

        Differentiable: with the cache made (`init_cache`) and stepped under a ``tf.GradientTape``,
        the variables get the gradients the full pass gives them (the caches are immutable tensors
        and the step's weights are read from the variables). torch_impl's step is inference-only
        (its `decode_step` says why).
        """
        if not isinstance(cache, DecoderCache):
            raise TypeError(f"cache: expected a tf_impl.cache.DecoderCache from init_cache, "
                            f"got {type(cache).__name__}")
        self._check_cache(cache)
        tokens = to_tensor("tokens", tokens)
        rows = cache.rows
        known = None not in (rows, tokens.shape[0]) if tokens.shape.rank == 1 else False
        if tokens.shape.rank != 1 or (known and tokens.shape[0] != rows):
            raise ValueError(f"tokens: expected a tensor of shape ({rows},) (one id per cache row), "
                             f"got {tuple(tokens.shape)}")
        if not tokens.dtype.is_integer:
            raise TypeError(f"tokens: expected integer token ids, got dtype {tokens.dtype.name}")
        if tf.executing_eagerly():
            lo, hi = (int(v) for v in tf.stack([tf.reduce_min(tokens), tf.reduce_max(tokens)]).numpy())
            check_ids_range("tokens", self.config.tgt_vocab, lo, hi)
        with guarded() as failed:  # a full cache: raises, or under XLA NaN logits (never finite ones)
            logits, cache = self._decode_step(check_free_position(tokens, cache), cache)
        return poison(logits, failed), cache

    def _check_cache(self, cache: DecoderCache) -> None:
        """``cache`` has the layers, heads, dtype, capacity and vocabulary of this model's caches
        (`shared.checks.check_cache`; static shapes, so in graph mode too)."""
        c, first = self.config, cache.layers[0] if cache.layers else None
        check_cache(len(cache.layers), first and tuple(first.self_key.shape),
                    first and tuple(first.cross_key.shape), first and first.self_key.dtype.name,
                    cache.generator[1].shape[0] if cache.generator else None,
                    layers=c.n_decoder_layers, n_heads=c.n_heads, d_k=c.d_k, max_len=c.max_len,
                    expected_dtype=compute_dtype_name(getattr(self, "precision", "float32"), c.dtype),
                    tgt_vocab=c.tgt_vocab)

    def _decode_step(self, tokens: tf.Tensor, cache: DecoderCache) -> tuple[tf.Tensor, DecoderCache]:
        """`decode_step` without the checks (the search loops call it): ``(N,)`` -> ``(logits (N, V),
        cache)``."""
        t = cache.length
        x = self.tgt_embed(tokens[:, None])  # (N, 1, d)
        # Position t gets PE row t: the same addition the full pass makes for column t of its input.
        table = self.positional.select(self.tgt_embed.positions)  # fixed or learned (max_len, d)
        x = x + tf.gather(table, t)  # inference: no dropout (nor a call of the inactive layer)
        hidden, cache = self.decoder.step(x, cache)  # (N, 1, d); cache.length is now t + 1
        if not cache.generator:  # a model not as built (`tf_impl.cache._as_built`): the layer
            return self.generator(hidden)[:, 0], cache
        matrix, bias = cache.generator  # (V, d) used transposed, or (d, V): see _step_weights
        rows = tf.cast(hidden[:, 0], matrix.dtype)  # a half precision's product (shared.precision)
        logits = tf.matmul(rows, matrix, transpose_b=_generator_transposed(cache.rows))
        return logits + bias, cache  # (N, V), in the compute dtype

    # Keras keeps the functions it compiles for predict, fit and evaluate until `Model.quantize`;
    # enable_lora and set_precision change what a trace computes too, so tf_impl's own compiled
    # functions' rule applies: made again when the model's structure (`_structure`) changed.
    def make_predict_function(self, force=False):
        return super().make_predict_function(force or self._changed_since_traced("predict"))

    def make_train_function(self, force=False):
        return super().make_train_function(force or self._changed_since_traced("train"))

    def make_test_function(self, force=False):
        return super().make_test_function(force or self._changed_since_traced("test"))

    def _changed_since_traced(self, kind: str) -> bool:
        """Whether `_structure` changed since Keras' ``kind`` function was asked for last (never,
        the first time); records it. Kept in ``__dict__``, past Keras' attribute tracking."""
        traced, structure = self.__dict__.setdefault("_traced_structures", {}), _structure(self)
        changed = traced.get(kind, structure) != structure
        traced[kind] = structure
        return changed

    def export(self, filepath, format="tf_saved_model", verbose=None, input_signature=None, **kwargs):
        """``keras.Model.export`` (an inference artifact of the forward pass) with ``(src, tgt)``
        int64 ids of any batch and length as its default ``input_signature``: Keras infers a
        subclassed model's from the shapes of its first call, and this model is built when
        constructed, so it has none to infer. The artifact's ``serve(src, tgt)`` gives `call`'s
        logits; decoding is served by `tf_impl.saved_model`."""
        if input_signature is None:
            ids = [None, None]  # (batch, length)
            input_signature = [tf.TensorSpec(ids, tf.int64, name="src"), tf.TensorSpec(ids, tf.int64, name="tgt")]
        return super().export(filepath, format=format, verbose=verbose, input_signature=input_signature,
                              **kwargs)

    # Keras' compiled functions run the model under XLA wherever it sees a GPU (``jit_compile=
    # "auto"``), where nothing can raise inside a step and an id out of range embeds as NaN
    # (`tf_impl.inputs`): `predict` gave NaN rows, and one `fit` step on a NaN loss made every
    # weight NaN. So every input is checked before a step takes it (`_checked`): arrays before
    # Keras dispatches, the batches of a Python generator, a ``keras.utils.PyDataset`` or a torch
    # ``DataLoader`` as they are made, each with NumPy (`shared.checks.checked_inputs`); a
    # `tf.data.Dataset` in its own pipeline, which runs in graph mode, never under XLA. The targets
    # too where the loss is Keras' sparse cross-entropy, whose gather takes a label out of range
    # as NaN under XLA (`tf_impl.pipelines.label_rule`).
    def predict(self, x, *args, **kwargs):
        """``keras.Model.predict``, its input checked first (above)."""
        return super().predict(self._checked(x), *args, **kwargs)

    def predict_on_batch(self, x):
        """``keras.Model.predict_on_batch``, the ids checked first (above)."""
        return super().predict_on_batch(self._checked(x))

    def fit(self, x=None, *args, **kwargs):
        """``keras.Model.fit``, its input and ``validation_data``'s checked before the first step
        (above): a bad validation row would stop the run after an epoch."""
        x = self._checked(x, _labels(args, kwargs))
        if "validation_data" in kwargs:
            kwargs["validation_data"] = self._checked_validation(kwargs["validation_data"])
        elif len(args) > 6:  # its 8th argument
            args = args[:6] + (self._checked_validation(args[6]),) + args[7:]
        return super().fit(x, *args, **kwargs)

    def evaluate(self, x=None, *args, **kwargs):
        """``keras.Model.evaluate``, its input checked first (above)."""
        return super().evaluate(self._checked(x, _labels(args, kwargs)), *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        """``keras.Model.train_on_batch``, the ids checked before the update (above)."""
        return super().train_on_batch(self._checked(x, _labels(args, kwargs)), *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        """``keras.Model.test_on_batch``, the ids checked first (above)."""
        return super().test_on_batch(self._checked(x, _labels(args, kwargs)), *args, **kwargs)

    def _checked(self, x, y=None):
        """``x`` as Keras' functions take it, checked (above): ``(src, tgt[, masks])`` or a dict of
        arrays checked now and returned as it is, with the targets ``y`` given beside them; a
        Python generator, a ``keras.utils.PyDataset`` or a ``torch.utils.data.DataLoader``
        returned as one that checks each batch as it makes it (`tf_impl.pipelines`: the
        ``ValueError`` or ``TypeError`` of `call`); a `tf.data.Dataset` returned mapped through
        `_check_element`, so a bad batch raises ``tf.errors.InvalidArgumentError`` with the eager
        message when the dataset yields it, before the step that would take it; anything else
        is left to Keras. Targets are checked where the compiled loss says what they are
        (`tf_impl.pipelines.label_rule`)."""
        labels = label_rule(getattr(self, "loss", None), self.config.tgt_vocab)
        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            unpack = type(spec) is tuple  # as tf.data calls the function: a tuple's items as arguments
            return x.map(lambda *items: self._check_element(items if unpack else items[0], labels),
                         num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
        if isinstance(x, types.GeneratorType):
            return checked_batches(x, self.config, labels)
        if isinstance(x, keras.utils.PyDataset):
            return CheckedPyDataset(x, self.config, labels)
        if is_torch_loader(x):
            return checked_torch_loader(x, self.config, labels)
        if isinstance(x, (Mapping, tuple, list)):
            checked_inputs(self.config, *unpack_x(x, None, None))
            check_labels(y, labels)
        return x

    def _checked_validation(self, data):
        """``fit``'s ``validation_data``: ``(x, y[, sample_weight])`` with ``x`` and ``y`` checked,
        or a dataset."""
        if isinstance(data, (tuple, list)) and data:
            self._checked(data[0], data[1] if len(data) > 1 else None)
            return data
        return self._checked(data)

    def _check_element(self, data, labels=None):
        """One element of a dataset (``x``, ``(x,)``, ``(x, y)`` or ``(x, y, sample_weight)``, as
        Keras unpacks it), traced by ``Dataset.map`` in graph mode: ``x``'s ids and masks get the
        checks of `call` (sizes, ids in range, equal batches) as asserts, ``y`` those of
        ``labels`` (`tf_impl.pipelines.checked_labels`), and the element comes back unchanged
        (every tensor an identity after them)."""
        x, y, _ = keras.utils.unpack_x_y_sample_weight(data)
        src, tgt, src_mask, tgt_mask = unpack_x(x, None, None)
        c = self.config
        src = check_ids("src", src, c.src_vocab, c.max_len)
        tgt = check_same_batch(src, check_ids("tgt", tgt, c.tgt_vocab, c.max_len))
        checked = [src, tgt] + ([checked_labels(y, labels)] if isinstance(y, tf.Tensor) else [])
        if src_mask is not None:  # a default mask needs no check
            checked.append(self._src_mask(src, src_mask))
        if tgt_mask is not None:
            checked.append(self._tgt_mask(tgt, tgt_mask))
        with tf.control_dependencies(checked):
            return tf.nest.map_structure(tf.identity, data)

    # -- canonical weights ------------------------------------------------------------------------
    def import_weights(self, weights: Mapping[str, np.ndarray]) -> None:
        """Load canonical weights (`shared.weights` schema, ``config.dtype``). Everything is checked
        first; on any problem one `shared.weights.WeightsError` lists them all and the model keeps
        its old weights."""
        weights_io.import_weights(self, weights)

    def export_weights(self) -> dict[str, np.ndarray]:
        """The canonical ``{name: ndarray}`` (kernels ``(in, out)``, tied weights once, config dtype);
        ``export_weights()`` after ``import_weights(w)`` equals ``w`` bit for bit."""
        return weights_io.export_weights(self)

    # -- Keras serialisation ----------------------------------------------------------------------
    def get_config(self) -> dict:
        """With the precision (`tf_impl.precision.set_precision`): a ``.keras`` file, a copy, a
        pickle and ``clone_model`` were float32 models, where torch_impl's copies keep it."""
        return {"name": self.name, "trainable": self.trainable, "config": self.config.to_dict(),
                "precision": getattr(self, "precision", "float32")}

    @classmethod
    def from_config(cls, config: dict) -> "Transformer":
        if not isinstance(config, Mapping) or "config" not in config:
            raise ValueError(f"config: expected the dict of get_config(), with the TransformerConfig "
                             f"under 'config', got {type(config).__name__}"
                             + (f" with keys {sorted(map(str, config))}" if isinstance(config, Mapping) else ""))
        config = dict(config)
        precision = config.pop("precision", "float32")  # absent from a file of an earlier version
        model = cls(TransformerConfig.from_dict(config.pop("config")), **config)
        model._compute_in(check_precision(precision, model.config.dtype))
        return model

    def _compute_in(self, precision: str) -> None:
        """The Keras policies of ``precision`` (a name `shared.precision.check_precision` returned)
        on every layer whose products it sets (the Dense layers and the generator), and the name
        in ``self.precision``: `tf_impl.precision.set_precision` after its checks, and `from_config`."""
        policy = POLICIES.get(precision, self.config.dtype)
        for layer in self._flatten_layers(include_self=False):
            if isinstance(layer, (keras.layers.Dense, Generator)):
                layer.dtype_policy = policy
        object.__setattr__(self, "precision", precision)  # a plain value, past Keras' attribute tracking


def _structure(model: Transformer) -> tuple:
    """What a trace of ``model`` depends on beyond its arguments and its variables' values: which
    variables it reads, which of them train, and each layer's dtype policy. ``enable_lora`` adds
    variables, ``Model.quantize`` replaces kernels and policies, `tf_impl.precision.set_precision`
    changes policies, ``layer.trainable = False`` freezes variables; a ``tf.function`` traced
    before any of them computes (or trains) the model as it was, so tf_impl's own (decoding's,
    the training steps, Keras' predict/fit/evaluate) are made again when this changes."""
    return (tuple((id(v), v.trainable) for v in model.variables),
            tuple(layer.dtype_policy.name for layer in model._flatten_layers(include_self=False)))


def _traced(store: dict, key, model: Transformer, make):
    """``make()`` (a ``tf.function`` of ``model``) kept in ``store`` under ``key``, and made again
    when the model's `_structure` has changed since: the one rule of tf_impl's compiled decoding
    loops and training steps (Keras' own functions: `Transformer._changed_since_traced`)."""
    structure = _structure(model)
    if store.get(key, (None,))[0] != structure:
        store[key] = (structure, make())
    return store[key][1]


def _generator_transposed(rows: int | None) -> bool:
    """Whether a cached step keeps the generator as ``(V, d)``, used transposed (more than one
    row, or unknown), rather than ``(d, V)`` (one row): see `Transformer._step_weights`."""
    return rows is None or rows > 1


def _labels(args: tuple, kwargs: dict):
    """The targets ``y`` of `fit`, `evaluate`, `train_on_batch` or `test_on_batch` (each takes
    them second, after ``x``), or None."""
    return args[0] if args else kwargs.get("y")


def check_model(model) -> None:
    """``model`` is a `Transformer` (torch_impl's check is the same), named by type otherwise,
    before anything reads it (else ``'NoneType' object has no attribute 'config'``)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model: expected a tf_impl.Transformer, got {type_shown(model)}")
