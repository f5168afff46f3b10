import collections

import numpy as np
import pytest

from shared import tasks
from shared.loss import label_smoothed_cross_entropy, log_softmax


def test_vocabulary_is_fixed_and_round_trips():
    assert tasks.VOCAB[: 4] == tasks.SPECIALS and len(set(tasks.VOCAB)) == len(tasks.VOCAB)
    text = "monday 2/8/2018 x.y-z"
    assert tasks.decode_text(tasks.encode_text(text)) == text
    assert tasks.encode_text("?") == [tasks.UNK_ID]
    assert tasks.decode_text([tasks.BOS_ID, *tasks.encode_text("12"), tasks.EOS_ID, 7, 8]) == "12"


def test_batching_layout():
    src, tgt_in, tgt_out = tasks.batch_sequences([[5, 6, 7], [8]], [[9, 10], [11, 12, 13]])
    np.testing.assert_array_equal(src, [[5, 6, 7], [8, 0, 0]])
    np.testing.assert_array_equal(tgt_in, [[1, 9, 10, 0], [1, 11, 12, 13]])
    np.testing.assert_array_equal(tgt_out, [[9, 10, 2, 0], [11, 12, 13, 2]])
    with pytest.raises(ValueError, match="equal, non-zero numbers"):
        tasks.batch_sequences([[1]], [])


def test_copy_task():
    data = tasks.make_task("copy", 50, seed=3)
    assert data.sources == data.targets and len(data.sources) == 50
    ids = np.array(data.sources)
    assert ids.shape == (50, tasks.COPY_LENGTH)
    assert ids.min() >= len(tasks.SPECIALS) and ids.max() < tasks.COPY_VOCAB
    assert tasks.make_task("copy", 50, seed=3) == data != tasks.make_task("copy", 50, seed=4)


def test_dates_are_deterministic_unambiguous_and_iso():
    pytest.importorskip("babel")
    data = tasks.make_task("dates", 4000, seed=0)
    assert data == tasks.make_task("dates", 4000, seed=0)
    answers = collections.defaultdict(set)
    for human, iso in data.texts:
        answers[human].add(iso)
        assert len(iso) == 10 and iso[4] == iso[7] == "-"
        assert "1970-01-01" <= iso <= "2069-12-31"
        assert set(human) <= set(tasks.CHARS), human
    assert all(len(v) == 1 for v in answers.values())  # one right answer per input
    kinds = {("/" in h, any(c.isalpha() for c in h)) for h, _ in data.texts}
    assert len(kinds) >= 3  # numeric, named-month and mixed formats all occur


def test_unknown_task():
    with pytest.raises(ValueError, match="task: expected 'copy' or 'dates', got 'sort'"):
        tasks.make_task("sort", 1, 0)


def test_loss_closed_form_and_padding():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5))
    targets = np.array([[1, 4, 0], [2, 0, 0]])
    eps = 0.1
    total, count = 0.0, 0
    for b in range(2):
        for t in range(3):
            if targets[b, t] == 0:
                continue
            p = np.exp(logits[b, t]) / np.exp(logits[b, t]).sum()
            q = np.full(5, eps / 5)
            q[targets[b, t]] += 1 - eps
            total += -(q * np.log(p)).sum()
            count += 1
    assert label_smoothed_cross_entropy(logits, targets, 0, eps) == pytest.approx(total / count, rel=1e-13)
    np.testing.assert_allclose(np.exp(log_softmax(logits)).sum(-1), 1.0, rtol=1e-15)


def test_loss_bad_input():
    with pytest.raises(ValueError, match="only padding"):
        label_smoothed_cross_entropy(np.zeros((1, 2, 3)), np.zeros((1, 2), int), 0)
    with pytest.raises(ValueError, match=r"smoothing: expected a value in \[0, 1\), got 1.0"):
        label_smoothed_cross_entropy(np.zeros((1, 2, 3)), np.ones((1, 2), int), 0, 1.0)
    with pytest.raises(ValueError, match=r"expected logits \(B, T, V\)"):
        label_smoothed_cross_entropy(np.zeros((2, 3)), np.ones((1, 2), int), 0)
