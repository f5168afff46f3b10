"""``twins convert CKPT DIR --to saved-model --verify``: the SavedModel's decoding against tf_impl's.

The export itself is the ``saved-model`` record of the format registry
(`shared.formats.saved_model`: ``--beam-size``, ``--length-penalty``, ``--max-new``,
``--jit-compile``). `verify` loads DIR with ``tf.saved_model.load``, decodes one batch (with one row
holding an id out of range) through both signatures and through tf_impl's `greedy_decode` /
`beam_search` on the source weights, and prints whether tokens, lengths and scores are identical
and the bad row comes back as the sentinel; exit status 1 when not.
"""
from __future__ import annotations


def verify(model, path: str, seed: int = 0) -> int:
    """Decode one batch with the SavedModel and with tf_impl; print the table; the exit status."""
    from shared.batches import token_batch
    from .backends import saved_model_report
    config = model.config
    src = token_batch(config, config.src_vocab, batch=4, length=min(9, config.max_len), seed=seed)
    src[-1, 0] = config.src_vocab  # the last row: an id out of range, to be returned as the sentinel
    print(f"verify: DST = {path} loaded with tf.saved_model.load, against tf_impl decoding the "
          f"source weights; one batch of {src.shape[0]} x {src.shape[1]} source tokens (seed "
          f"{seed}), the last row with an id out of range")
    report = saved_model_report(model, path, src)
    print(f"{'signature':<16} {'tokens':<10} {'lengths':<10} {'scores':<10} {'bad row':<10} result")
    ok = True
    for name, checks in report.items():
        same = [checks[k] for k in checks if k != "invalid"]
        passed = all(checks.values())
        ok &= passed
        cells = ["identical" if s else "DIFFER" for s in same]
        print(f"{name:<16} {cells[0]:<10} {cells[1]:<10} {cells[2]:<10} "
              f"{'flagged' if checks['invalid'] else 'NOT FLAGGED':<10} {'pass' if passed else 'FAIL'}")
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1
