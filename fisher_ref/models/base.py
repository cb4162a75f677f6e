r"""Softmax language models over a flat float64 parameter vector ``theta``.

A model reads each state through a fixed-width integer *window* and maps a
batch of windows to next-token logits::

    windows(tokens, lengths) -> W        # (B, L) int, (B,) -> (B, k) int
    logits(theta, W) -> z                # (B, k) int -> (B, V) float

For the window models here the window is the last ``context`` tokens of the
state, oldest first, left-padded with the BOS id ``V`` (:func:`state_windows`);
a model that reads its whole history (the transformer of
:mod:`fisher_ref.models.gpt2`) defines its own ``windows``. The engines compute
everything a state needs once per distinct window.

Any autograd-differentiable function of that shape can be wrapped with
:class:`FunctionModel`; :class:`MLPModel` (docs/theory.md §4.1) and :class:`TabularModel`
(logits are the parameters) are the two shipped instances.

Token ids are ``0..V-1``; with ``eos`` on, id ``0`` is EOS. Id ``V`` is BOS,
an input only.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import math

import autograd.numpy as anp
import numpy as np

from fisher_ref.limits import (MAX_ABS_THETA, MAX_CONTEXT, MAX_INIT_SCALE, MAX_PARAMS, check_size,
                     is_real, readable, readable_log10)

__all__ = [
    "ModelSpec", "SpecModel",
    "check_common_fields", "check_positive_int", "check_param_count",
    "state_windows", "windows_for", "model_windows", "check_theta",
    "WindowModel",
]


def state_windows(tokens, lengths, context, bos):
    """Windows of the last ``context`` tokens of each state, BOS-padded: ``(B, k)``.

    Args:
        tokens: ``(B, L)`` int, ``-1`` padded.
        lengths: ``(B,)`` number of real tokens in each row.
        context: window length ``k``.
        bos: the BOS id (``V``).

    Returns:
        int64 ``(B, k)``, oldest token first.

    Example:
        >>> state_windows(np.array([[1, 2, 3], [4, -1, -1]]), np.array([3, 1]), 2, 9).tolist()
        [[2, 3], [9, 4]]
    """
    if tokens.shape[1] == 0:  # only empty states (empty prompts, nothing generated)
        return np.full((tokens.shape[0], context), bos, dtype=np.int64)
    idx = lengths[:, None] - context + np.arange(context)[None, :]  # (B, k)
    rows = np.arange(tokens.shape[0])[:, None]  # (B, 1)
    win = tokens[rows, np.clip(idx, 0, None)]  # (B, k)
    return np.where(idx >= 0, win, bos).astype(np.int64)  # (B, k)


def windows_for(states, context, bos):
    """:func:`state_windows` of a list of states given as token sequences.

    Args:
        states: sequence of token lists (prompt plus generated tokens).
        context: window length ``k``.
        bos: the BOS id (``V``).

    Returns:
        int64 array of shape ``(len(states), context)``, oldest token first.

    Example:
        >>> windows_for([(), (1,), (1, 2, 3)], 2, 9).tolist()
        [[9, 9], [9, 1], [2, 3]]
    """
    lengths = np.array([len(s) for s in states], dtype=np.int64)  # (B,)
    tokens = np.full((len(states), int(lengths.max(initial=0))), -1, dtype=np.int64)  # (B, L)
    for b, s in enumerate(states):
        tokens[b, :lengths[b]] = list(s)
    return state_windows(tokens, lengths, context, bos)


class WindowModel:
    """Mixin: a model that reads the last ``context`` tokens of a state (BOS-padded)."""

    def windows(self, tokens, lengths):
        """:func:`state_windows` of each state: ``(B, L)`` tokens, ``(B,)`` lengths -> ``(B, k)``."""
        return state_windows(tokens, lengths, self.context, self.bos)


def model_windows(model, states):
    """``model.windows`` of a list of states given as token sequences: ``(len(states), k)``.

    Example:
        >>> from fisher_ref.models.tabular import TabularModel
        >>> m = TabularModel(3, context=2)
        >>> model_windows(m, [(), (1, 2, 0)]).tolist()
        [[3, 3], [2, 0]]
    """
    lengths = np.array([len(s) for s in states], dtype=np.int64)  # (B,)
    tokens = np.full((len(states), int(lengths.max(initial=0)) + 1), -1, dtype=np.int64)  # (B, L)
    for b, s in enumerate(states):
        tokens[b, :lengths[b]] = list(s)
    return model.windows(tokens, lengths)


def check_theta(theta, num_params):
    """Return ``theta`` as a float64 vector of length ``num_params`` or raise.

    Entries must be finite numbers of size at most ``MAX_ABS_THETA`` (1e6), where no
    shipped model's logits overflow.

    Raises:
        ValueError: wrong shape or length, a non-finite or too large entry.
        TypeError: entries that are not numbers (strings, booleans, None).
    """
    try:
        arr = np.asarray(theta)
    except ValueError as exc:  # ragged nested lists
        raise ValueError(f"theta must be a flat list of numbers: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"theta must be a flat vector, got shape {arr.shape}")
    if arr.shape[0] != num_params:
        raise ValueError(
            f"theta has length {arr.shape[0]} but the model has {num_params} parameters")
    if arr.dtype.kind not in "iuf":
        first = f" (first entry {arr[0]!r})" if arr.size else ""
        raise TypeError(f"theta must be numeric, got dtype {arr.dtype}{first}")
    arr = arr.astype(np.float64)
    bad = ~np.isfinite(arr)
    if bad.any():
        idx = np.flatnonzero(bad)
        raise ValueError(
            f"theta has {bad.sum()} non-finite entries (NaN or inf), first at index {idx[0]}")
    big = np.abs(arr) > MAX_ABS_THETA
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise ValueError(f"theta[{i}] = {arr[i]:.3g}: entries larger than {MAX_ABS_THETA:.0e} "
                         "in size are refused (the model's logits would overflow or the "
                         "softmax be one-hot to float64 precision)")
    return arr


def check_positive_int(value, name):
    """``value`` as an int if it is a positive integer (not a bool), else ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def check_param_count(num_params, arch, sizes):
    """Refuse a model with more than ``MAX_PARAMS`` parameters, before any is drawn.

    Args:
        num_params: the closed-form count (an int, or its base-10 log as a float when
            the count itself is too large to form).
        arch: the architecture's name; sizes: ``"V=..., ..."`` for the message.
    """
    if isinstance(num_params, float):  # a log10
        if num_params <= math.log10(MAX_PARAMS):
            return
        n = readable_log10(num_params)
    elif num_params <= MAX_PARAMS:
        return
    else:
        n = readable(num_params)
    raise ValueError(f"model ({arch}, {sizes}) has {n} parameters, more than the limit "
                     f"{readable(MAX_PARAMS)}; shrink vocab_size, hidden, embed_dim, context "
                     "or n_layer")


def check_common_fields(vocab_size, eos, init_seed, init_scale):
    """Validate the fields every model spec shares; raise ``ValueError`` naming the field.

    ``init_scale`` must be finite and at most ``MAX_INIT_SCALE`` (1e3) in size.
    """
    if not isinstance(eos, (bool, np.bool_)):
        raise ValueError(f"model.eos must be true or false, got {eos!r}")
    if eos and vocab_size < 2:
        raise ValueError("model.vocab_size must be at least 2 when eos is on")
    if isinstance(init_seed, bool) or not isinstance(init_seed, (int, np.integer)) \
            or init_seed < 0:
        raise ValueError(f"model.init_seed must be a non-negative integer, got {init_seed!r}")
    if not is_real(init_scale) or not np.isfinite(init_scale):
        raise ValueError(f"model.init_scale must be a finite number, got {init_scale!r}")
    if abs(init_scale) > MAX_INIT_SCALE:
        raise ValueError(
            f"model.init_scale must be at most {MAX_INIT_SCALE:g} in size, got {init_scale!r}: "
            "beyond it the softmax is one-hot to float64 precision, and far beyond it the "
            "logits overflow")


def layout_offsets(shapes):
    """``[(name, shape, offset)]`` of blocks ``(name, shape)`` laid out one after
    another, row-major, in a flat ``theta``.

    Example:
        >>> layout_offsets([("a", (2, 3)), ("b", (4,))])
        [('a', (2, 3), 0), ('b', (4,), 6)]
    """
    out, off = [], 0
    for name, shape in shapes:
        out.append((name, shape, off))
        off += int(np.prod(shape))
    return out


class LayoutSpec:
    """Mixin of a frozen model spec with a ``layout()``: its ``num_params`` and ``bos``."""

    @property
    def bos(self):
        return self.vocab_size

    @property
    def num_params(self):
        name, shape, off = self.layout()[-1]
        return off + int(np.prod(shape))


@dataclass(frozen=True)
class ModelSpec(LayoutSpec):
    """The MLP language model of docs/theory.md §4.1, fully specified.

    ``e = concat(E[c_1..c_k])``, ``hid = tanh(e @ W1 + b1)``, ``z = hid @ W2 + b2``;
    ``theta = (E, W1, b1, W2, b2)`` flattened row-major in that order.
    ``init_params`` draws ``theta ~ init_scale * N(0, 1)`` from
    ``numpy.random.default_rng(init_seed)`` (one draw of length ``P``).
    """

    vocab_size: int
    context: int = 2
    embed_dim: int = 3
    hidden: int = 8
    eos: bool = True
    init_seed: int = 0
    init_scale: float = 1.0
    arch: str = field(default="mlp_window", compare=False)

    def __post_init__(self):
        for name in ("vocab_size", "context", "embed_dim", "hidden"):
            check_positive_int(getattr(self, name), f"model.{name}")
        check_size(self.context, "model.context", MAX_CONTEXT, "tokens a model reads")
        check_common_fields(self.vocab_size, self.eos, self.init_seed, self.init_scale)
        V, k, d, H = (int(getattr(self, n)) for n in ("vocab_size", "context", "embed_dim",
                                                       "hidden"))
        # E (V+1, d), W1 (k d, H), b1 (H,), W2 (H, V), b2 (V,): counted before any layout
        check_param_count((V + 1) * d + k * d * H + H + H * V + V, "mlp_window",
                          f"vocab_size={readable(V)}, context={readable(k)}, "
                          f"embed_dim={readable(d)}, hidden={readable(H)}")

    def layout(self):
        """List of ``(name, shape, offset)`` giving each block's place in ``theta``."""
        V, k, d, H = self.vocab_size, self.context, self.embed_dim, self.hidden
        shapes = [("E", (V + 1, d)), ("W1", (k * d, H)), ("b1", (H,)),
                  ("W2", (H, V)), ("b2", (V,))]
        return layout_offsets(shapes)

    def to_json(self):
        return {"vocab_size": self.vocab_size, "context": self.context,
                "embed_dim": self.embed_dim, "hidden": self.hidden, "eos": self.eos,
                "init_seed": self.init_seed, "init_scale": self.init_scale}


class SpecModel:
    """Base of a model built from a frozen spec (``layout()``, ``num_params``, ``bos``,
    ``init_seed``, ``init_scale``, ``to_json()``): named views and initial parameters."""

    def __init__(self, spec):
        self.spec = spec
        self.vocab_size = spec.vocab_size
        self.eos = bool(spec.eos)
        self.bos = spec.bos
        self.num_params = spec.num_params
        # (name, shape, offset, size) of each block, read by every unpack
        self._blocks = [(name, tuple(shape), off, int(np.prod(shape)))
                        for name, shape, off in spec.layout()]

    def layout(self):
        return self.spec.layout()

    def unpack(self, theta):
        """Named views of ``theta (P,)``, or of a stack ``(B, P)`` with a leading ``B``
        axis (works under autograd)."""
        lead = theta.shape[:-1]
        if isinstance(theta, np.ndarray):  # plain arrays: views, without autograd's wrappers
            return {name: theta[..., off:off + n].reshape(lead + shape)
                    for name, shape, off, n in self._blocks}
        return {name: anp.reshape(theta[..., off:off + n], lead + shape)
                for name, shape, off, n in self._blocks}

    def init_params(self):
        """``theta = init_scale * default_rng(init_seed).standard_normal(P)`` in the layout."""
        rng = np.random.default_rng(self.spec.init_seed)
        return self.spec.init_scale * rng.standard_normal(self.num_params)

    def describe(self):
        d = dict(self.spec.to_json())
        d.update({"arch": self.name, "bos": self.bos})
        return d


