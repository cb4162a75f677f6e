"""fisher_ref: exact float64 Fisher information of sampling from a softmax language model.

Every response of a tiny model is enumerated, so every expectation is exact;
Monte Carlo estimates are held against those exact values.

Names are imported on first use (PEP 562), so ``import fisher_ref.testing``
(a golden-file check) loads numpy and nothing of the engines.

Example:
    >>> from fisher_ref import load_config, exact
    >>> r = exact(load_config("default"))
    >>> r.sequence_fisher.shape == r.token_fisher_sum.shape
    True
"""
import importlib

from fisher_ref.version import __version__

# public name -> the module that defines it
_WHERE = {
    "engine.plan": ("EnumerationTooLarge", "estimate_cost"),
    "checks.conformance": ("check_token_fisher",),
    "parallel.run": ("exact",),
    "golden.export": ("export_golden",),
    "golden.format": ("GoldenFileError", "load_golden"),
    "golden.check": ("compare_golden", "compare_to_golden"),
    "monte_carlo": ("CheckRow", "Estimate", "MCResult", "bonferroni_z", "check_monte_carlo",
                    "estimate", "sample"),
    "models": ("make_model",),
    "models.gpt2": ("GPT2Model", "GPT2Spec"),
    "models.base": ("ModelSpec",),
    "models.mlp": ("MLPModel",),
    "models.tabular": ("TabularModel",),
    "models.function": ("FunctionModel",),
    "results": ("ExactResult", "FisherStreamResult", "StreamResult", "topk_overlap"),
    "rewards": ("CountReward", "FunctionReward", "LengthReward", "MatchReward"),
    "samplers": ("LogitsSampler", "PerturbedSampler", "RoundedSampler", "TemperatureSampler"),
    "tasks": ("Task", "list_configs", "load_config", "load_task", "task_from_json"),
    "numerics": ("token_fisher", "token_fisher_pairwise", "uniform_token_fisher"),
}
_MODULE_OF = {name: mod for mod, names in _WHERE.items() for name in names}

__all__ = [
    "exact", "ExactResult", "StreamResult", "FisherStreamResult", "EnumerationTooLarge", "estimate_cost", "topk_overlap",
    "ModelSpec", "MLPModel", "TabularModel", "FunctionModel", "make_model", "GPT2Spec", "GPT2Model",
    "CountReward", "MatchReward", "LengthReward", "FunctionReward",
    "TemperatureSampler", "PerturbedSampler", "RoundedSampler", "LogitsSampler",
    "Task", "task_from_json", "load_task", "load_config", "list_configs",
    "token_fisher", "token_fisher_pairwise", "uniform_token_fisher", "__version__",
    "sample", "estimate", "MCResult", "Estimate", "bonferroni_z", "check_monte_carlo",
    "CheckRow", "export_golden", "load_golden", "compare_golden", "compare_to_golden",
    "GoldenFileError", "check_token_fisher",
]


def __getattr__(name):
    """Import the module that defines public ``name`` on first use (PEP 562)."""
    if name not in _MODULE_OF:
        raise AttributeError(f"module 'fisher_ref' has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{_MODULE_OF[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))

