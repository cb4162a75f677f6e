"""The model architectures a task file can name, and :func:`make_model` to build one.

``"arch"``: ``"mlp_window"`` (the default, :class:`fisher_ref.models.mlp.MLPModel`),
``"tabular"`` (:class:`fisher_ref.models.tabular.TabularModel`) or ``"gpt2"``
(:class:`fisher_ref.models.gpt2.GPT2Model`). See docs/theory.md for each model.
"""
from __future__ import annotations

from fisher_ref.models.gpt2 import GPT2Model, GPT2Spec
from fisher_ref.models.mlp import MLPModel
from fisher_ref.models.base import ModelSpec
from fisher_ref.models.tabular import TabularModel

__all__ = ["make_model", "ARCHS"]

ARCHS = ("mlp_window", "tabular", "gpt2")

_COMMON = {"vocab_size", "eos", "init_seed", "init_scale"}
#: arch -> (the task-file keys it takes, how to build it from them)
_BUILDERS = {
    "mlp_window": (_COMMON | {"context", "embed_dim", "hidden"},
                   lambda s: MLPModel(ModelSpec(**s))),
    "tabular": (_COMMON | {"context"}, lambda s: TabularModel(**s)),
    "gpt2": (_COMMON | {"n_positions", "embed_dim", "n_layer", "n_head"},
             lambda s: GPT2Model(GPT2Spec(**s))),
}


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
    if arch not in _BUILDERS:
        raise ValueError(f"unknown model arch {arch!r}; known: {', '.join(map(repr, ARCHS))}")
    allowed, build = _BUILDERS[arch]
    extra = set(spec) - allowed
    if extra:
        raise ValueError(f"unknown model keys {sorted(extra)} for arch {arch!r}; "
                         f"allowed: {sorted(allowed)}")
    if "vocab_size" not in spec:
        raise ValueError("model.vocab_size is required")
    return build(spec)
