"""PyTorch state dicts of models written elsewhere: ``torch.save(model.state_dict(), f)`` of the
PyTorch tutorial's ``nn.Transformer`` model and of the Annotated Transformer
(docs/formats/state_dicts.md). Read only: `shared.importers.pytorch` maps the keys; what a state
dict does not store (heads, special ids, the norm placement) is given as options, never guessed.

The file is opened by torch_impl (``torch.load(weights_only=True)``: nothing in it runs), imported
by name when such a file is read (`shared.formats.native.backend`).
"""
from __future__ import annotations

from shared import importers

from .native import backend
from .record import (ALLOW_NONFINITE, BOS_ID, DTYPE, EOS_ID, MAX_LEN, N_HEADS, NORM_EPS, PAD_ID,
                     RENAME, Format, Option, boolean)

NORM_FIRST = Option("norm_first", "nn-transformer: the norm_first the model was built with",
                    boolean, metavar="true|false")
ACTIVATION = Option("activation", "feed-forward activation of the source's layers (default: "
                    "its library's, or a .keras file's own)", choices=("relu", "gelu", "swish", "silu"))
_COMMON = (N_HEADS, PAD_ID, BOS_ID, EOS_ID, NORM_EPS, MAX_LEN, DTYPE, RENAME, ALLOW_NONFINITE)
_NOT_STORED = "builds the config from the state dict and the options"
UNIFORM_EMPTY_ROW = (
    "{source} masks with a large negative score, so a source row that is all padding attends "
    "uniformly to its padding there; here it has zero attention (docs/design.md, convention 3), "
    "which no boolean mask reproduces. Every other row computes the same (see the importer's "
    "docstring)")


def importer_reader(function):
    """``read(path, config=None, **options)`` of a ``.pt`` state dict through ``function``."""
    def read(path, config=None, **options):
        state_dict = backend("torch_impl.checkpoints").read_foreign_state_dict(path)
        return named(path, function, state_dict, options)
    return read


def named(path, function, source, options):
    """``function(source, **options)``, its `ImporterError` naming the file as well."""
    try:
        return function(source, **options)
    except importers.ImporterError as err:
        raise importers.ImporterError(f"{str(path)!r} ({function.__name__})", err.problems) from None


NN_TRANSFORMER = Format(
    "nn-transformer", "state_dicts", "a .pt state dict of the PyTorch tutorial's Seq2SeqTransformer "
    "(nn.Transformer)", read=importer_reader(importers.from_nn_transformer),
    read_options=_COMMON + (NORM_FIRST, ACTIVATION),
    required=("n_heads", "pad_id", "bos_id", "eos_id", "norm_first"), config_from=_NOT_STORED)
ANNOTATED = Format(
    "annotated", "state_dicts", "a .pt state dict of the Annotated Transformer's EncoderDecoder",
    read=importer_reader(importers.from_annotated), read_options=_COMMON,
    required=("n_heads", "pad_id", "bos_id", "eos_id"), config_from=_NOT_STORED,
    notes=(UNIFORM_EMPTY_ROW.format(source="the Annotated Transformer"),),
    hints={"norm_first": "the Annotated Transformer is always pre-norm; do not pass it"})

FORMATS = (NN_TRANSFORMER, ANNOTATED)
