r"""What :func:`fisher_ref.estimators.expected_loss_gradient` tells the user about the loss
it evaluates: the casts below float64 the loss makes (an observing dispatch mode: the
loss runs as written, its casts are listed), the warning when it does not vectorise, and
the batch an exception was raised on.
"""
from __future__ import annotations

import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..torch.precision import RANK

__all__ = ["CastAudit", "VmapFallbackWarning", "warn_fallback", "describe_batch",
           "reraise_with_batch"]


def _low(x):
    return isinstance(x, torch.Tensor) and x.is_floating_point() \
        and RANK.get(x.dtype, 2) < RANK[torch.float64]


def _flat(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


class CastAudit(TorchDispatchMode):
    """Count the ops of a loss that make a floating tensor below float64 out of float64
    inputs (``.float()``, ``.to(torch.float32)``, a factory with ``dtype=float32``):
    ``events`` maps ``"aten.op to float32"`` to a count. Nothing is rewritten, so the
    expected gradient is the one the loss computes."""

    def __init__(self, events):
        super().__init__()
        self.events = events

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        outs = list(_flat(out if isinstance(out, (tuple, list)) else (out,)))
        low = [x for x in outs if _low(x)]
        if low and not any(_low(x) for x in _flat(list(args) + list(kwargs.values()))):
            name = str(func)
            name = name[:-len(".default")] if name.endswith(".default") else name
            key = f"{name} to {str(low[0].dtype).replace('torch.', '')}"
            self.events[key] = self.events.get(key, 0) + 1
        return out


class VmapFallbackWarning(UserWarning):
    """The loss did not vectorise under ``torch.func.vmap``: it was evaluated one batch at
    a time (same numbers, much slower)."""


def warn_fallback(error):
    """The one warning of a call whose loss fell back to the loop (``error``: the first
    exception ``vmap`` raised)."""
    warnings.warn(
        f"loss(batch) does not vectorise under torch.func.vmap ({error}); it was evaluated "
        f"one batch at a time, with the same result but often 100x slower. The usual "
        f"causes: .item() or float() on a tensor (logging metrics: compute them outside "
        f"the loss or drop them), boolean-mask indexing x[mask] or x[mask] = v (use "
        f"torch.where(mask, x, 0)), a Python branch on a tensor's value. symmetric=True "
        f"(a loss symmetric in its responses) divides the number of groups by up to G!. "
        f"LossGradient.evaluation is 'loop' and evaluation_error holds this error",
        VmapFallbackWarning, stacklevel=4)


def describe_batch(tokens, mask, prompts, rewards):
    """``"prompts [...], responses [[...], ...], rewards [...]"`` of one batch (numpy)."""
    resp = [[int(v) for v, m in zip(row, mrow) if m] for row, mrow in zip(tokens, mask)]
    ps = sorted({int(p) for p in prompts})
    return (f"prompt{'s' if len(ps) > 1 else ''} {ps if len(ps) > 1 else ps[0]}, responses "
            f"{resp} (rewards {[float(r) for r in rewards]})")


def reraise_with_batch(exc, where):
    """Raise ``exc`` again, of the same type where it can be built from a message (else a
    ``RuntimeError``), chained, saying on which batch the loss raised it."""
    msg = f"loss(batch) raised {type(exc).__name__}: {exc} -- on the batch of {where}"
    try:
        new = type(exc)(msg)
    except Exception:  # an exception type that takes other arguments
        new = RuntimeError(msg)
    raise new from exc
