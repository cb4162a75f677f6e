"""The model architectures a task file can name, and :func:`make_model` to build one.

``"arch"``: ``"mlp_window"`` (the default, :class:`fisher_ref.model.MLPModel`),
``"tabular"`` (:class:`fisher_ref.model.TabularModel`) or ``"gpt2"``
(:class:`fisher_ref.gpt2.GPT2Model`). See docs/theory.md for each model.
"""
from __future__ import annotations

from .gpt2 import GPT2Model, GPT2Spec
from .model import MLPModel, ModelSpec, TabularModel

__all__ = ["make_model", "ARCHS"]

ARCHS = ("mlp_window", "tabular", "gpt2")


def make_model(spec):
    """Build a model from a JSON-like dict (a task file's ``model``), a ModelSpec or a GPT2Spec."""
    if isinstance(spec, ModelSpec):
        return MLPModel(spec)
    if isinstance(spec, GPT2Spec):
        return GPT2Model(spec)
    if not isinstance(spec, dict):
        raise TypeError(f"model spec must be a dict or ModelSpec, got {type(spec).__name__}")
    spec = dict(spec)
    arch = spec.pop("arch", "mlp_window")
    spec.pop("bos", None)
    if arch == "mlp_window":
        allowed = {"vocab_size", "context", "embed_dim", "hidden", "eos", "init_seed",
                   "init_scale"}
        extra = set(spec) - allowed
        if extra:
            raise ValueError(f"unknown model keys {sorted(extra)}; allowed: {sorted(allowed)}")
        if "vocab_size" not in spec:
            raise ValueError("model.vocab_size is required")
        return MLPModel(ModelSpec(**spec))
    if arch == "tabular":
        allowed = {"vocab_size", "context", "eos", "init_seed", "init_scale"}
        extra = set(spec) - allowed
        if extra:
            raise ValueError(f"unknown model keys {sorted(extra)} for arch 'tabular'; "
                             f"allowed: {sorted(allowed)}")
        if "vocab_size" not in spec:
            raise ValueError("model.vocab_size is required")
        return TabularModel(**spec)
    if arch == "gpt2":
        allowed = {"vocab_size", "eos", "n_positions", "embed_dim", "n_layer", "n_head",
                   "init_seed", "init_scale"}
        extra = set(spec) - allowed
        if extra:
            raise ValueError(f"unknown model keys {sorted(extra)} for arch 'gpt2'; "
                             f"allowed: {sorted(allowed)}")
        if "vocab_size" not in spec:
            raise ValueError("model.vocab_size is required")
        return GPT2Model(GPT2Spec(**spec))
    raise ValueError(f"unknown model arch {arch!r}; known: 'mlp_window', 'tabular', 'gpt2'")
