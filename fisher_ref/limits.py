"""The input limits of fisher_ref, the dtype tolerances (:data:`TOLERANCES`: how far a
result in another order or precision may be from the exact one; applied by
:mod:`fisher_ref.checks.tolerances`), and numbers written so that a person can read them.

Every size is checked in closed form before anything is allocated, so a task
that is too large is refused within a second, with its numbers in the message:

- :data:`MAX_PARAMS`: parameters of a model built from a spec (``theta`` is drawn
  only after the count passed);
- :data:`MAX_CONTEXT`: tokens a model reads (``context``, GPT-2's ``n_positions``);
- :data:`MAX_LAYERS`: GPT-2 blocks;
- :data:`MAX_INIT_SCALE`: ``|init_scale|``; :data:`MAX_ABS_THETA`: ``|theta_i|``;
- :data:`MAX_ABS_VALUE`: ``|reward|`` and ``|baseline|``;
- :data:`MAX_COUNT`: states or responses of an enumeration (counted without
  forming the number when it is astronomically large);
- :data:`MAX_PROMPT_LEN`: tokens of one prompt;
- :data:`MAX_TASK_FILE_BYTES`, :data:`MAX_GOLDEN_BYTES`: the size of a task file and
  of a golden file (read, declared inside its zip, or about to be written);
- :data:`MAX_SEED`: every seed (Monte Carlo, a perturbed sampler);
- :data:`MIN_TEMPERATURE` .. :data:`MAX_TEMPERATURE`, :data:`MAX_DECIMALS`,
  ``MAX_ABS_THETA`` for a perturbed sampler's ``scale``: samplers whose logits stay
  finite.

The time and memory limits of the exact engine and of Monte Carlo are arguments
(``max_seconds``, ``max_bytes``) checked by :func:`check_limit`.
"""
from __future__ import annotations

import math
import numbers

__all__ = ["MAX_PARAMS", "MAX_CONTEXT", "MAX_LAYERS", "MAX_INIT_SCALE", "MAX_ABS_THETA",
           "MAX_ABS_VALUE", "MAX_COUNT", "readable", "readable_log10", "check_limit",
           "is_real", "check_size", "MAX_PROMPT_LEN", "MAX_TASK_FILE_BYTES",
           "MAX_GOLDEN_BYTES", "MAX_SEED", "MIN_TEMPERATURE", "MAX_TEMPERATURE",
           "MAX_DECIMALS", "check_seed", "LIMITS_TABLE", "TOL_FLOAT64", "TOL_FLOAT32",
           "TOL_BFLOAT16", "TOLERANCES", "TINY_REWARD"]

#: Parameters of a spec-built model: ``theta`` alone is 80 MB at this size, and the
#: exact engine's sensitivities are ``V`` times that per state.
MAX_PARAMS = 10 ** 7
#: Tokens a model reads (GPT-2's own ``n_positions``); longer windows only pad with BOS.
MAX_CONTEXT = 1024
#: GPT-2 blocks (GPT-2's largest model has 48).
MAX_LAYERS = 48
#: ``|init_scale|``: at 1e3 every shipped model's softmax is already one-hot in
#: float64 (``exp(-1000)`` underflows), so larger scales only overflow.
MAX_INIT_SCALE = 1e3
#: ``|theta_i|``: with entries up to 1e6 no shipped model's logits or their
#: derivatives overflow float64.
MAX_ABS_THETA = 1e6
#: ``|R|`` and ``|b|``: the engines sum :math:`A^2 h^2` with :math:`A = R - b`;
#: 1e100 keeps :math:`A^2` (1e200) far inside float64's range (1.8e308).
MAX_ABS_VALUE = 1e100
#: States or responses of an enumeration: no machine lists 1e60 of anything.
MAX_COUNT = 10 ** 60
#: Tokens of one prompt: no model reads more than ``MAX_CONTEXT`` tokens, and every
#: state stores its prompt (``N x (L + 1)`` token ids, ``L`` the longest prompt plus
#: ``max_len``).
MAX_PROMPT_LEN = MAX_CONTEXT
#: Bytes of a task file (a ``theta`` of about 3 million numbers fits).
MAX_TASK_FILE_BYTES = 64 * 2 ** 20
#: Bytes of a golden file: the export refuses to write more, the reader to read more
#: (the file on disk, and the sizes its zip entries declare).
MAX_GOLDEN_BYTES = 2 ** 30
#: Seeds: numpy takes any non-negative integer, ``torch.Generator`` up to 2^64 - 1;
#: one rule for every command.
MAX_SEED = 2 ** 63 - 1
#: A sampler temperature: logits of size up to ~1e13 divided by it stay finite.
MIN_TEMPERATURE, MAX_TEMPERATURE = 1e-100, 1e100
#: ``|decimals|`` of a rounded sampler: ``10^decimals`` times a logit stays finite.
MAX_DECIMALS = 20
#: Rewards below this in size (:math:`\sqrt{E[R]^2 + \mathrm{std}(A)^2} + |b|`) have
#: squares outside float64's normal range: the exact variances of the reward quantities
#: (what Monte Carlo z-scores divide by) cannot be formed, so z-scores are refused and
#: ``verify`` scales such rewards by a power of two first.
TINY_REWARD = 1e-100

#: ``(name, value, what it bounds)`` of every limit, for the docs' limits table.
LIMITS_TABLE = (
    ("MAX_PARAMS", MAX_PARAMS, "parameters of a model built from `model`"),
    ("MAX_CONTEXT", MAX_CONTEXT, "`context`, GPT-2's `n_positions`"),
    ("MAX_LAYERS", MAX_LAYERS, "GPT-2's `n_layer`"),
    ("MAX_INIT_SCALE", MAX_INIT_SCALE, "`init_scale` (in size)"),
    ("MAX_ABS_THETA", MAX_ABS_THETA, "entries of `theta`, a perturbed sampler's `scale`"),
    ("MAX_ABS_VALUE", MAX_ABS_VALUE, "`baseline` and every reward (in size)"),
    ("MAX_COUNT", MAX_COUNT, "states or responses to enumerate"),
    ("MAX_PROMPT_LEN", MAX_PROMPT_LEN, "tokens of one prompt"),
    ("MAX_TASK_FILE_BYTES", MAX_TASK_FILE_BYTES, "bytes of a task file"),
    ("MAX_GOLDEN_BYTES", MAX_GOLDEN_BYTES, "bytes of a golden file (on disk, declared in "
     "its zip, or about to be written)"),
    ("MAX_SEED", MAX_SEED, "every seed (`--seed`, a sampler's `seed`)"),
    ("MIN_TEMPERATURE", MIN_TEMPERATURE, "a sampler's `temperature`, at least"),
    ("MAX_TEMPERATURE", MAX_TEMPERATURE, "a sampler's `temperature`, at most"),
    ("MAX_DECIMALS", MAX_DECIMALS, "a rounded sampler's `decimals` (in size)"),
)


# How far a value computed in another order or precision may be from the exact float64
# one, relative to its scale (fisher_ref.checks.tolerances explains the scales):
TOL_FLOAT64 = 1e-10  # same arithmetic, other order: measured ~1e-14
TOL_FLOAT32 = 2e-5  # eps32 1.2e-7 x conditioning ~170
TOL_BFLOAT16 = 0.1  # ~13 eps_bf16; bf16 compute, fp32 sums
TOLERANCES = {"float64": TOL_FLOAT64, "float32": TOL_FLOAT32, "bfloat16": TOL_BFLOAT16}


def readable_log10(log10):
    """A count given by its base-10 logarithm, as ``1.2e+603`` (or ``10^(3e+07)``).

    Example:
        >>> readable_log10(602.07918)
        '1.2e+602'
        >>> readable_log10(3.5)
        '3,162'
    """
    if not math.isfinite(log10):
        return "10^(10^300) or more"
    if log10 < 15:
        return f"{round(10 ** log10):,}"
    if log10 > 1e15:
        return f"10^({log10:.3g})"
    e = math.floor(log10)
    m = 10 ** (log10 - e)
    if round(m, 1) >= 10:  # 9.96 would print as 10.0
        m, e = m / 10, e + 1
    return f"{m:.1f}e+{e:d}"


def readable(x):
    """``x`` (an int of any size or a float) written for a person: commas below 1e15,
    else a mantissa and an exponent, never hundreds of digits.

    Example:
        >>> readable(1234567), readable(4 ** 1000), readable(2.5e20), readable(0.25)
        ('1,234,567', '1.1e+602', '2.5e+20', '0.25')
    """
    if isinstance(x, numbers.Integral):
        x = int(x)
        if abs(x) < 10 ** 15:
            return f"{x:,}"
        return ("-" if x < 0 else "") + readable_log10(math.log10(abs(x)))
    x = float(x)
    if not math.isfinite(x) or abs(x) >= 1e15:
        return f"{x:.2g}"
    return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"


def is_real(x):
    """True for a real number (int or float, numpy's too), False for bool, str, None."""
    return isinstance(x, numbers.Real) and not isinstance(x, bool)


def check_limit(value, name):
    """A time or memory limit: a positive number (``inf``: no limit); else raise.

    Raises:
        TypeError: ``value`` is not a number (``name`` in the message).
        ValueError: ``value`` is NaN, zero or negative.

    Example:
        >>> check_limit(2 ** 30, "max_bytes")
        1073741824.0
    """
    if not is_real(value):
        raise TypeError(f"{name} must be a positive number (inf for no limit), got {value!r}")
    value = float(value)
    if math.isnan(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number (inf for no limit), got {value!r}")
    return value


def check_size(value, name, limit, why=""):
    """Raise ``ValueError`` naming ``name`` when the size ``value`` exceeds ``limit``."""
    if value > limit:
        raise ValueError(f"{name} is {readable(value)}, more than the limit {readable(limit)}"
                         + (f" ({why})" if why else ""))


def check_seed(seed, name="seed"):
    """``seed`` as an int if it is an integer in ``0 .. MAX_SEED``; else ``ValueError``
    naming ``name`` (one rule for ``verify``, ``compare``, Monte Carlo and samplers).

    Example:
        >>> check_seed(7)
        7
        >>> check_seed(-1)
        Traceback (most recent call last):
        ...
        ValueError: seed must be an integer from 0 to 2^63 - 1, got -1
    """
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or \
            not 0 <= int(seed) <= MAX_SEED:
        shown = readable(seed) if isinstance(seed, numbers.Integral) else repr(seed)
        raise ValueError(f"{name} must be an integer from 0 to 2^63 - 1, got {shown}")
    return int(seed)
