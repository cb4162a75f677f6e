r"""The run's dtype all the way through a module: every op of its forward and backward
seen by a ``TorchDispatchMode``, casts below the run's dtype rewritten or refused.

Many stock ``transformers`` models compute part of their forward pass in float32 whatever
the dtype of their weights: RMSNorm casts its input with ``.to(torch.float32)``, eager
attention takes its softmax with ``dtype=torch.float32``, rotary embeddings build their
angles with ``.float()``. In a float64 run those ops alone make every result off by 1e-7
and nothing says so. While the torch engine evaluates a module (:func:`run_dtype`), a
dispatch mode sees each aten op after ``torch.func`` and autograd have lowered it, with the
module it runs in (tracked by forward hooks on every submodule):

- an op asked for a floating dtype below the run's (a ``dtype=`` argument:
  ``aten._to_copy`` from ``.to``/``.float()``, factories such as ``aten.arange``,
  reductions with an accumulation dtype) runs with the run's dtype instead;
- a floating tensor below the run's dtype that reaches an op (a float32 constant the
  forward made itself) is cast up first — its value was already rounded, so this is
  recorded as well;
- an op whose result is still below the run's dtype raises
  :class:`LowPrecisionError` (nothing can make it exact).

Each rewrite is recorded as ``"module.path: aten.op to float32"``
(:attr:`DtypeAudit.events`, returned by the engines as ``upcasts``). With ``strict=True``
the first one raises :class:`LowPrecisionError` with that text instead. The precision
order is float16 = bfloat16 < float32 < float64; a float32 run rewrites only float16 and
bfloat16, a bfloat16 run nothing. Complex dtypes follow their parts: complex64 becomes
complex128 in a float64 run.

Attention through ``torch.nn.functional.scaled_dot_product_attention`` is evaluated with
the math backend (:func:`torch.nn.attention.sdpa_kernel`): it is composed of ops with
``vmap`` rules, so there is no per-call "no batching rule" warning, and it keeps the run's
dtype.
"""
from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

__all__ = ["LowPrecisionError", "DtypeAudit", "run_dtype", "prepare", "RANK"]

#: Precision order of the floating dtypes (lower: fewer mantissa bits).
RANK = {torch.float16: 0, torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}


class LowPrecisionError(ValueError):
    """An op of a module runs below the run's dtype (``strict=True``), or its result stays
    below it after every cast was rewritten; the message names the module path and op."""


def _name(dtype):
    return str(dtype).replace("torch.", "")


class DtypeAudit(TorchDispatchMode):
    """The dispatch mode of :func:`run_dtype` (see the module docstring).

    Attributes:
        dtype: the run's floating dtype.
        strict: refuse instead of rewriting.
        path: names of the modules whose forward is running, innermost last.
        events: ``{"path: op to dtype": count}`` of the rewrites made.
    """

    def __init__(self, dtype, strict=False, root="module"):
        super().__init__()
        self.dtype, self.strict, self.root = dtype, bool(strict), root
        self.path, self.events = [], {}
        # each dtype below the run's -> what it becomes: the run's dtype, or for complex
        # dtypes the complex dtype of the run's precision (rotary embeddings by torch.polar)
        self.lower = {d: dtype for d, r in RANK.items() if r < RANK.get(dtype, 2)}
        if dtype == torch.float64:
            self.lower.update({torch.complex64: torch.complex128,
                               torch.complex32: torch.complex128})
        elif dtype == torch.float32:
            self.lower[torch.complex32] = torch.complex64

    def _low(self, dtype):
        return dtype in self.lower

    def where(self):
        return self.path[-1] if self.path else self.root

    def _event(self, func, what):
        text = f"{self.where()}: {_op(func)} {what}"
        if self.strict:
            raise LowPrecisionError(
                f"{text} in a {_name(self.dtype)} run; fisher_ref's results would not be "
                f"{_name(self.dtype)}-exact. Pass strict=False to run this op in "
                f"{_name(self.dtype)}, or fix the module")
        self.events[text] = self.events.get(text, 0) + 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if "dtype" in kwargs and self._low(kwargs["dtype"]):
            self._event(func, f"to {_name(kwargs['dtype'])}")
            kwargs = {**kwargs, "dtype": self.lower[kwargs["dtype"]]}
        if any(self._low(x.dtype) for x in _tensors(args)):
            def up(x):
                if isinstance(x, torch.Tensor) and self._low(x.dtype):
                    self._event(func, f"reads a {_name(x.dtype)} tensor {tuple(x.shape)}")
                    return x.to(self.lower[x.dtype])
                return x
            args = tree_map(up, args)
        out = func(*args, **kwargs)
        low = [x for x in (out if isinstance(out, (tuple, list)) else (out,))
               if isinstance(x, torch.Tensor) and self._low(x.dtype)]
        if low:
            raise LowPrecisionError(
                f"{self.where()}: {_op(func)} returns {_name(low[0].dtype)} in a "
                f"{_name(self.dtype)} run, with every cast already rewritten; fisher_ref "
                "cannot make this op exact")
        return out


def _tensors(args):
    """The tensors among ``args`` and one level of lists in them (``aten.cat``'s)."""
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, torch.Tensor))


def _op(func):
    """``aten._to_copy`` from ``aten._to_copy.default``; overloads other than default kept."""
    name = str(func)
    return name[:-len(".default")] if name.endswith(".default") else name


@contextlib.contextmanager
def _module_names(module, audit):
    """Forward pre/post hooks on every submodule of ``module`` keep ``audit.path``."""
    handles = []
    for name, sub in module.named_modules():
        if not name:
            continue

        def pre(_mod, _args, name=name):
            audit.path.append(name)

        def post(_mod, _args, _out, name=name):
            if audit.path and audit.path[-1] == name:
                audit.path.pop()

        handles.append(sub.register_forward_pre_hook(pre))
        handles.append(sub.register_forward_hook(post, always_call=True))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def run_dtype(module, dtype, strict=False, events=None, root="module"):
    """Evaluate ``module`` in ``dtype`` throughout (see the module docstring).

    Args:
        module: the ``torch.nn.Module`` about to be called (its submodules get name hooks
            for the duration).
        dtype: the run's ``torch.dtype``.
        strict: raise :class:`LowPrecisionError` at the first op below ``dtype``.
        events: a dict the rewrites are counted into (``{"path: op to dtype": count}``).
        root: the name used for ops outside any submodule.

    Example:
        >>> lin = torch.nn.Linear(2, 2).double()
        >>> ev = {}
        >>> with run_dtype(lin, torch.float64, events=ev):
        ...     y = lin(torch.ones(1, 2, dtype=torch.float64)).float()
        >>> y.dtype, list(ev)
        (torch.float64, ['module: aten._to_copy to float32'])
    """
    from torch.nn.attention import SDPBackend, sdpa_kernel
    audit = DtypeAudit(dtype, strict, root)
    default = torch.get_default_dtype()
    with _module_names(module, audit), sdpa_kernel(SDPBackend.MATH), audit:
        try:
            if RANK.get(dtype, 2) > RANK[default]:
                torch.set_default_dtype(dtype)  # factories without a dtype, literals
            yield audit
        finally:
            torch.set_default_dtype(default)
            if events is not None:
                for k, v in audit.events.items():
                    events[k] = events.get(k, 0) + v


def prepare(module, dtype):
    """Settings of a private copy of ``module`` that a ``dtype`` run needs: the ``eager``
    experts of a ``transformers`` mixture-of-experts model in float64 (its default
    ``grouped_mm`` kernel has no float64 version; the eager loop computes the same
    function). Returns ``module``."""
    setter = getattr(module, "set_experts_implementation", None)
    if dtype == torch.float64 and callable(setter) and any(
            "expert" in name for name, _ in module.named_modules()):
        try:
            setter("eager")
        except (ValueError, AttributeError, NotImplementedError):
            pass  # a model without a choice of experts kernel
    return module
