"""A Marian or FSMT directory run by transformers itself, for ``twins convert --verify``.

`TransformersRun` has the `twins.backends.Adapter` methods that `--verify` uses (``logits``,
``export_weights``): logits from the library's own forward pass, with the project's masks as its
inputs (`shared.importers.marian` and `.fsmt` say why they are needed), and the weights the
directory holds read back by the project's importer. transformers and torch are imported only here,
only when such a directory is verified.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from shared import TransformerConfig


class TransformersRun:
    name = "transformers"

    def __init__(self, path, config: TransformerConfig):
        try:
            import torch
            import transformers
        except ImportError as err:
            raise ImportError(f"verifying a transformers directory needs the 'interop' extra "
                              f"(transformers, torch): {err}") from None
        self._torch, self.path, self.config = torch, Path(path), config
        self.family = json.loads((self.path / "config.json").read_text(encoding="utf-8"))["model_type"]
        cls = {"marian": transformers.MarianMTModel,
               "fsmt": transformers.FSMTForConditionalGeneration}[self.family]
        # transformers' own "Loading weights: 100%|...|" bar on stderr, amid the command's table:
        # off for this load only (a caller's setting is given back)
        from transformers.utils import logging as hf_logging
        shown = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()
        try:
            self.model = cls.from_pretrained(str(self.path)).eval()
        finally:
            if shown:
                hf_logging.enable_progress_bar()

    def logits(self, src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        """``(B, T, tgt_vocab)``; source and target padding masked as the project masks them."""
        torch, pad = self._torch, self.config.pad_id
        tgt_mask = tgt != pad
        if self.config.start_id == pad:
            tgt_mask[:, 0] = True  # column 0 is the start token (docs/design.md, convention 2)
        with torch.no_grad():
            out = self.model(input_ids=torch.as_tensor(src), attention_mask=torch.as_tensor(src != pad),
                             decoder_input_ids=torch.as_tensor(tgt),
                             decoder_attention_mask=torch.as_tensor(tgt_mask), use_cache=False)
        return out.logits.numpy()

    def export_weights(self) -> dict[str, np.ndarray]:
        from shared import importers
        fn = importers.from_marian if self.family == "marian" else importers.from_fsmt
        return fn(self.path)[1]
