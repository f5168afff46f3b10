"""Adam's moments in the canonical layout, as both backends' ``export_moments`` give them and
``import_moments`` takes them: ``{"m.<name>": first, "v.<name>": second}`` for every name of
`shared.weights.weight_schema`, each of that weight's shape (kernels ``(in, out)``).

`check_moments` is the one check both backends' ``import_moments`` run before anything is
assigned, so that a refused import leaves the optimizer as it was (NumPy only): an import that
failed part-way, or took a NaN or a negative second moment, would poison the next update and the
loss, not the moments, would be blamed.
"""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .checks import is_int, masked_entries
from .config import TransformerConfig
from .messages import shown
from .weights import weight_schema

# An optimizer over none of a model's trainable parameters (one made for another model): torch's
# would step nothing of this model and report success, Keras' fail with its own words.
FOREIGN_OPTIMIZER = ("optimizer: expected one over this model's parameters (make_optimizer(model)), "
                     "got one over none of them")

# The step count both backends can hold: torch_impl keeps it as a float per parameter (exact to
# 2**53), tf_impl in Keras' int64 ``iterations``.
MAX_STEP = 2**53


def moment_names(config: TransformerConfig) -> list[str]:
    """Names of Adam's moments, ``m.<weight>`` then ``v.<weight>``, in schema order."""
    return [f"{kind}.{name}" for kind in ("m", "v") for name in weight_schema(config)]


def listed_names(names: list[str]) -> str:
    """``names`` as a message lists them: the first five, then how many in all."""
    return repr(names[:5])[:-1] + (f", ... ({len(names)} in all)]" if len(names) > 5 else "]")


def moment_problems(config: TransformerConfig, moments) -> list[str]:
    """What keeps ``moments`` from being ``config``'s: missing or unexpected names, an array that
    is not floats, of another shape, not finite as ``config.dtype`` holds it (a finite float64
    1e39, or a long double 1e400, is inf once cast), or a negative second moment; [] when none."""
    return _checked(config, moments)[0]


def _checked(config: TransformerConfig, moments) -> tuple[list[str], dict[str, np.ndarray]]:
    """`moment_problems`, and the moments as they will be stored: each value read once and cast
    to ``config.dtype`` here, so that what is checked is what is assigned (a lazy mapping cannot
    hand the import another array than the check saw)."""
    if not isinstance(moments, Mapping):
        return [f"expected a mapping of m.<name> and v.<name> arrays, got {type(moments).__name__}"], {}
    schema = weight_schema(config)
    expected = {f"{kind}.{name}": shape for kind in ("m", "v") for name, shape in schema.items()}
    problems, stored = [], {}
    missing = [n for n in expected if n not in moments]
    unexpected = [str(n) for n in moments if n not in expected]
    if missing:
        problems.append(f"missing: {listed_names(missing)}")
    if unexpected:
        problems.append(f"unexpected: {listed_names(unexpected)}")
    for name, shape in expected.items():
        if name not in moments:
            continue
        value = moments[name]
        if (masked := masked_entries(name, value)) is not None:  # as weights: not its data
            problems.append(masked)
            continue
        try:
            a = np.asarray(value)
        except Exception as err:  # noqa: BLE001  (whatever the value is, it is not an array)
            problems.append(f"{name}: expected an array, got {type(value).__name__} ({err})")
            continue
        if a.dtype.kind != "f":
            problems.append(f"{name}: expected floats, got dtype {a.dtype}")
        elif a.shape != tuple(shape):
            problems.append(f"{name}: expected shape {tuple(shape)}, got {a.shape}")
        elif not np.isfinite(a).all():
            problems.append(f"{name}: expected finite values, got NaN or inf")
        elif name.startswith("v.") and (a < 0).any():
            problems.append(f"{name}: expected second moments >= 0, got {float(a.min())}")
        else:
            # The finite values checked as stored: past the dtype's largest number the cast gives
            # inf (NumPy's overflow warning silenced: the refusal says it), which Adam's next update
            # spreads into every weight as NaN. Values that round to the largest number are kept.
            with np.errstate(over="ignore"):
                cast = np.array(a, dtype=config.dtype)  # a copy: later changes to ``a`` do not reach it
            if not np.isfinite(cast).all():
                # the largest in magnitude, as its own dtype writes it (float() of a long double
                # of 1e400 would be inf)
                worst = a.flat[int(np.argmax(np.where(np.isfinite(cast), 0, np.abs(a))))]
                problems.append(f"{name}: expected finite values in {config.dtype} (at most "
                                f"{np.finfo(config.dtype).max:.4g} in magnitude), got {worst}, "
                                "which overflows it")
            else:
                stored[name] = cast
    return problems, stored


def check_moments(config: TransformerConfig, moments, step) -> dict[str, np.ndarray]:
    """``moments`` checked (`moment_problems`, every problem at once, on the values as
    ``config.dtype`` holds them) and ``step`` an int in [0, `MAX_STEP`] (the updates already made);
    returns the moments as ``config.dtype`` arrays (the very arrays checked: assign these), or
    raises ``ValueError`` (``TypeError`` for a step that is not an int) before anything is
    assigned."""
    if not is_int(step):
        raise TypeError(f"step: expected an int >= 0 (the updates already made), got {shown(step)}")
    if not 0 <= step <= MAX_STEP:
        raise ValueError(f"step: expected an int in [0, {MAX_STEP}] (the updates already made), "
                         f"got {shown(step, str)}")
    problems, stored = _checked(config, moments)
    if problems:
        listed = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        raise ValueError(f"moments: {listed}")
    return {name: stored[name] for name in moment_names(config)}
