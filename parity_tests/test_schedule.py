import numpy as np
import pytest

from shared import noam_lr


@pytest.mark.parametrize("d_model, warmup, factor", [(512, 4000, 1.0), (256, 400, 2.0), (16, 1, 0.5)])
def test_peak_at_warmup(d_model, warmup, factor):
    steps = np.arange(1, 4 * warmup + 10)
    lr = noam_lr(steps, d_model, warmup, factor)
    assert int(steps[np.argmax(lr)]) == warmup
    assert noam_lr(warmup, d_model, warmup, factor) == pytest.approx(factor * d_model ** -0.5 * warmup ** -0.5)


def test_linear_warmup_then_inverse_sqrt_decay():
    d, w = 512, 4000
    assert noam_lr(10, d, w) == pytest.approx(10 * noam_lr(1, d, w))
    assert noam_lr(4 * w, d, w) == pytest.approx(noam_lr(w, d, w) / 2)


def test_scalar_and_array_agree():
    arr = noam_lr(np.array([1, 7, 9000]), 512, 4000)
    assert [noam_lr(s, 512, 4000) for s in (1, 7, 9000)] == list(arr)
    assert isinstance(noam_lr(3, 512, 4000), float)


@pytest.mark.parametrize("step", [0, -3, np.array([1, 0])])
def test_step_zero_rejected(step):
    with pytest.raises(ValueError, match="steps are counted from 1"):
        noam_lr(step, 512, 4000)


@pytest.mark.parametrize("kwargs, error, needle", [
    (dict(step=1.5, d_model=512, warmup=10), TypeError, "step expected an int"),
    (dict(step=np.array([1, 2.5]), d_model=512, warmup=10), TypeError, "step expected an int"),
    (dict(step=True, d_model=512, warmup=10), TypeError, "step expected an int"),
    (dict(step=2**80, d_model=512, warmup=10), ValueError, "step expected an int in \\[1, 2\\*\\*53\\]"),
    (dict(step=1, d_model=0, warmup=10), ValueError, "d_model expected a positive int"),
    (dict(step=1, d_model=512.0, warmup=10), TypeError, "d_model expected a positive int"),
    (dict(step=1, d_model=512, warmup=0), ValueError, "warmup expected a positive int"),
    (dict(step=1, d_model=512, warmup=10, factor=0), ValueError, "factor expected a positive float"),
    (dict(step=1, d_model=512, warmup=10, factor="1"), TypeError, "factor expected a positive float"),
])
def test_bad_arguments(kwargs, error, needle):
    """``TypeError`` for an argument of the wrong type, ``ValueError`` for one out of range (an int
    past 2**64, which NumPy holds as an object, is an int too large)."""
    with pytest.raises(error, match=needle):
        noam_lr(**kwargs)
