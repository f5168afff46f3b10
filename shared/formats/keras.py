"""Keras files of models written elsewhere: the TensorFlow text tutorial's ``Transformer``
(``save_weights``) and KerasHub ``TransformerEncoder`` / ``TransformerDecoder`` models
(``.weights.h5`` or ``.keras``) (docs/formats/keras.md). Read only, with h5py: nothing in the
file runs, and neither Keras nor TensorFlow is imported.
"""
from __future__ import annotations

from shared import importers
from shared.importers.tf_tutorial import KERAS3_PADDING

from .record import (ALLOW_NONFINITE, BOS_ID, DTYPE, EOS_ID, MAX_LEN, NORM_EPS, PAD_ID, Format, Option,
                     boolean, suffixes)
from .state_dicts import ACTIVATION, named

MASK_ZERO = Option("mask_zero", "keras-hub, required for a .weights.h5: the "
                   "TokenAndPositionEmbedding layers' mask_zero (a .keras file stores it)",
                   boolean, metavar="true|false")
NORMALIZE_FIRST = Option("normalize_first", "keras-hub: the layers' normalize_first (default: the "
                         ".keras config's, else false)", boolean, metavar="true|false")
_FROM_FILE = "builds the config from the file and the options"


def _reader(function, refuse_archive: bool):
    def read(path, config=None, **options):
        if refuse_archive and str(path).endswith(".keras"):
            raise ValueError(f"{str(path)!r}: --from tf-tutorial reads the .weights.h5 of save_weights "
                             "(a subclassed tutorial model's .keras holds no architecture to read)")
        file = importers.read_keras_file(path)
        if file.config is not None:
            options["keras_config"] = file.config
        return named(path, function, file.weights, options)
    return read


TF_TUTORIAL = Format(
    "tf-tutorial", "keras", "a .weights.h5 of the TensorFlow text tutorial's Transformer",
    read=_reader(importers.from_tf_tutorial, refuse_archive=True),
    read_options=(BOS_ID, EOS_ID, NORM_EPS, MAX_LEN, DTYPE, ALLOW_NONFINITE),
    required=("bos_id", "eos_id"), config_from=_FROM_FILE, notes=(KERAS3_PADDING,))
KERAS_HUB = Format(
    "keras-hub", "keras", "a .keras or .weights.h5 of KerasHub TransformerEncoder/Decoder layers",
    read=_reader(importers.from_keras_hub, refuse_archive=False), recognise=suffixes(".keras"),
    looks_like="*.keras",
    read_options=(BOS_ID, EOS_ID, PAD_ID, NORM_EPS, DTYPE, MASK_ZERO, NORMALIZE_FIRST, ACTIVATION,
                  ALLOW_NONFINITE),
    required=("bos_id", "eos_id"), config_from=_FROM_FILE,
    hints={"norm_first": "for --from keras-hub the flag is --normalize-first"})

FORMATS = (TF_TUTORIAL, KERAS_HUB)
