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
(``max_seconds``, ``max_bytes``, by default :data:`DEFAULT_MAX_SECONDS` and
:data:`DEFAULT_MAX_BYTES`) checked by :func:`check_limit`. An enumeration is counted in
closed form (:func:`count_states`), its size and estimates are a :class:`Cost`, and
:func:`check_cost` refuses it past the limits with :class:`EnumerationTooLarge`: both exact
engines (the fast one, :func:`fisher_ref.engine.plan.estimate_cost`, and the readable
judge, :mod:`fisher_ref.reference`) refuse through them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

__all__ = ["MAX_PARAMS", "MAX_CONTEXT", "MAX_LAYERS", "MAX_INIT_SCALE", "MAX_ABS_THETA",
           "MAX_ABS_VALUE", "MAX_COUNT", "readable", "readable_log10", "check_limit",
           "is_real", "check_real", "check_size", "MAX_PROMPT_LEN", "MAX_TASK_FILE_BYTES",
           "MAX_GOLDEN_BYTES", "MAX_SEED", "MIN_TEMPERATURE", "MAX_TEMPERATURE",
           "MAX_DECIMALS", "check_seed", "LIMITS_TABLE", "TOL_FLOAT64", "TOL_FLOAT32",
           "TOL_BFLOAT16", "TOLERANCES", "TINY_REWARD", "DEFAULT_MAX_SECONDS",
           "DEFAULT_MAX_BYTES", "EnumerationTooLarge", "Cost", "count_states", "check_cost",
           "KEEP_BYTES", "resolve_keep"]

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


def check_real(value, name, *, positive=False):
    """``value`` as a float if it is a finite real number (``positive``: above 0); else
    raise naming ``name`` (a loss's scale, a cap, a baseline).

    Raises:
        TypeError: ``value`` is not a number (a string, ``None``, a bool).
        ValueError: ``value`` is NaN or infinite, or not above 0 when ``positive``.

    Example:
        >>> check_real(0.5, "beta", positive=True)
        0.5
        >>> check_real(-1, "cap", positive=True)
        Traceback (most recent call last):
        ...
        ValueError: cap must be a finite number above 0, got -1
    """
    what = "a finite number above 0" if positive else "a finite number"
    if not is_real(value):
        raise TypeError(f"{name} must be {what}, got {value!r}")
    if not math.isfinite(float(value)) or (positive and not float(value) > 0):
        raise ValueError(f"{name} must be {what}, got {value!r}")
    return float(value)


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


# --- the size of an enumeration, and its refusal -------------------------------------

#: The exact engines' default limits: 15 minutes, 8 GiB (``max_seconds``, ``max_bytes``).
DEFAULT_MAX_SECONDS = 900.0
DEFAULT_MAX_BYTES = 8 * 2 ** 30


class EnumerationTooLarge(ValueError):
    """Raised when exact enumeration would exceed the time or memory limit."""


@dataclass(frozen=True)
class Cost:
    """Size of an enumeration and its estimated time and peak memory."""

    n_states: int
    n_responses: int
    num_params: int
    vocab_size: int
    max_len: int
    n_streams: int
    chunk: int
    seconds: float
    bytes: int
    workers: int = 1

    def describe(self):
        """The size and estimates in words, numbers of any size kept readable."""
        return (f"{readable(self.n_states)} states, {readable(self.n_responses)} responses, "
                f"P={readable(self.num_params)} parameters, V={readable(self.vocab_size)}, "
                f"T={readable(self.max_len)}: about {_seconds(self.seconds)} and "
                f"{_gib(self.bytes)}")


def _seconds(x):
    return f"{readable(float(x))} s"


def _gib(x):
    g = x / 2 ** 30
    return f"{g:,.2f} GiB" if g < 1e6 else f"{readable(float(g))} GiB"


def _geometric(b, n):
    r""":math:`\sum_{t<n} b^t` for an integer ``b >= 1`` (``n`` if ``b = 1``)."""
    return n if b == 1 else (b ** n - 1) // (b - 1)


def count_states(vocab_size, max_len, eos, n_prompts=1):
    r"""``(n_states, n_responses)`` of the full enumeration, in closed form.

    With ``b = V - 1`` expandable children per state under EOS (``V`` without),
    each prompt has :math:`\sum_{t<T} b^t` states and
    :math:`\sum_{t<T-1} b^t + b^{T-1} V` responses under EOS (:math:`V^T` without).
    The counts are exact ints, formed only when their base-10 logarithms say they are
    near ``MAX_COUNT`` (1e60) or below, so ``max_len = 10**6`` is refused at once.

    Raises:
        EnumerationTooLarge: more than ``MAX_COUNT`` states or responses (the
            message gives the size, e.g. "about 1.1e+602 responses").

    Example:
        >>> count_states(3, 2, eos=True)
        (3, 7)
    """
    V, T, n_p = int(vocab_size), int(max_len), int(n_prompts)
    b = V - 1 if eos else V
    if b > 1:  # the counts grow like b^T: judge their size by logarithms first
        big = math.log10(T) > 300  # T itself past float range
        lb = math.log10(b)
        log_states = math.log10(n_p) + (math.inf if big else T * lb) - math.log10(b - 1)
        log_resp = math.log10(n_p) + (math.inf if big else (T - 1) * lb) + \
            math.log10(V + 1 / (b - 1) if eos else V)  # ~ n b^(T-1) (V + 1/(b-1))
        if max(log_states, log_resp) > math.log10(MAX_COUNT) + 1:
            _too_many(readable_log10(log_states), readable_log10(log_resp), V, T, n_p)
    n_states = _geometric(b, T) * n_p
    n_resp = (_geometric(b, T - 1) + b ** (T - 1) * V if eos else V ** T) * n_p
    if max(n_states, n_resp) > MAX_COUNT:
        _too_many(readable(n_states), readable(n_resp), V, T, n_p)
    return n_states, n_resp


def _too_many(states, responses, V, T, n_p):
    raise EnumerationTooLarge(
        f"exact enumeration refused: about {states} states and {responses} responses "
        f"(V={readable(V)}, T={readable(T)}, n_prompts={n_p}), more than "
        f"{readable(MAX_COUNT)}, which no machine lists. Use Monte Carlo instead "
        "(fisher_ref.monte_carlo), shorten max_len or shrink the vocabulary.")



#: Per-state and per-response arrays are kept by default ("auto") when they fit in this.
KEEP_BYTES = 2 ** 30


def resolve_keep(keep_states, keep_sequences, n_states, n_responses, num_params, max_len):
    """``(keep_states, keep_sequences)`` with each ``"auto"`` resolved: keep the per-state
    arrays (three ``(N, P)``) and the per-response ones (``T + 6`` numbers each) when they
    fit in :data:`KEEP_BYTES`."""
    if keep_states == "auto":
        keep_states = n_states * num_params * 8 * 3 < KEEP_BYTES
    if keep_sequences == "auto":
        keep_sequences = n_responses * (max_len + 6) * 8 < KEEP_BYTES
    return keep_states, keep_sequences


def check_cost(cost, max_seconds=DEFAULT_MAX_SECONDS, max_bytes=DEFAULT_MAX_BYTES):
    """Raise :class:`EnumerationTooLarge` naming the numbers if ``cost`` is past a limit.

    Raises:
        TypeError: ``max_seconds`` or ``max_bytes`` is not a number.
        ValueError: a limit that is NaN, zero or negative (``inf`` means no limit).
    """
    max_seconds = check_limit(max_seconds, "max_seconds")
    max_bytes = check_limit(max_bytes, "max_bytes")
    problems = []
    if cost.seconds > max_seconds:
        problems.append(f"estimated time {_seconds(cost.seconds)} exceeds the limit "
                        f"{_seconds(max_seconds)}")
    if cost.bytes > max_bytes:
        problems.append(f"estimated memory {_gib(cost.bytes)} exceeds the limit "
                        f"{_gib(max_bytes)}")
    if problems:
        raise EnumerationTooLarge(
            "exact enumeration refused: " + "; ".join(problems) + f" ({cost.describe()}). "
            "Use Monte Carlo instead (fisher_ref.monte_carlo), shorten max_len, "
            "shrink the vocabulary, or raise max_seconds/max_bytes if you mean it.")
