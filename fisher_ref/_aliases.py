"""Old module paths, kept for one release: ``import fisher_ref.verify`` still works, warns
(``DeprecationWarning``) and gives a module that forwards every attribute to the new home
(``fisher_ref.checks.identities``). The public paths ``fisher_ref.testing``,
``fisher_ref.conformance``, ``fisher_ref.hf``, ``fisher_ref.monte_carlo`` and
``fisher_ref.torch`` are real modules, not aliases.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import types
import warnings

__all__ = ["MOVED", "install"]

MOVED = {  # old module (under fisher_ref) -> its home since the reorganisation
    "progress": "_progress",
    "architectures": "models",
    "model": ("models.base", "models.mlp", "models.tabular", "models.function", "numerics"),
    "gpt2": "models.gpt2",
    "sensitivities": "models.sensitivities",
    "token_fisher": "numerics",
    "enumeration": "engine.plan",
    "walk": ("engine.run", "engine.autodiff"),
    "exact_reference": "reference",
    "window_cache": ("engine.window_cache", "engine.run"),
    "grouped": "engine.parent_sums",
    "mc_stats": "monte_carlo",
    "error_scales": "checks.tolerances",
    "verify": "checks.identities",
    "compare": "checks.compare",
    "golden_format": "golden.format",
    "bench": "perf.bench",
    "scaling": "perf.scaling",
    "peak_memory": "perf.memory",
    "quizzes": "teaching.quizzes",
    "judging": "teaching.exercise",
    "exercises": "teaching.exercises",
    "exercises_transformer": "teaching.exercises_transformer",
    "alignment": "teaching.views",
    "training": "teaching.training",
    "command": "cli._common",
    "torch.model": "torch.adapters",
    "torch.windows": "torch.window_cache",
}


class _Alias(types.ModuleType):
    """A module that forwards attribute reads to its new home."""

    def __init__(self, name, target):
        super().__init__(name, f"Moved to {target}; this alias goes in the next release.")
        self.__dict__["_target"] = target

    def _targets(self):
        t = self.__dict__["_target"]
        return [importlib.import_module(m) for m in ((t,) if isinstance(t, str) else t)]

    def __getattr__(self, attr):
        for mod in self._targets():
            if hasattr(mod, attr):
                return getattr(mod, attr)
        raise AttributeError(f"module {self.__name__!r} has no attribute {attr!r}")

    def __dir__(self):
        return sorted({n for mod in self._targets() for n in dir(mod)})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix("fisher_ref.")
        if not fullname.startswith("fisher_ref.") or old not in MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        new = MOVED[spec.name.removeprefix("fisher_ref.")]
        return _Alias(spec.name, "fisher_ref." + new if isinstance(new, str)
                      else tuple("fisher_ref." + m for m in new))

    def exec_module(self, module):
        warnings.warn(f"{module.__name__} has moved to {module.__dict__['_target']}; the old "
                      "path is an alias for one release", DeprecationWarning, stacklevel=2)


def install():
    """Put the alias finder on ``sys.meta_path`` (once)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder())
