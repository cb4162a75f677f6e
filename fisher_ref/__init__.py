"""fisher_ref: exact float64 Fisher information of sampling from a softmax language model.

Every response of a tiny model is enumerated, so every expectation is exact;
Monte Carlo estimates are held against those exact values.

Example:
    >>> from fisher_ref import load_config, exact
    >>> r = exact(load_config("default"))
    >>> r.sequence_fisher.shape == r.token_fisher_sum.shape
    True
"""
from .enumeration import EnumerationTooLarge, estimate_cost
from .conformance import check_token_fisher
from .exact import exact
from .golden import GoldenFileError, compare_golden, export_golden, load_golden
from .monte_carlo import (CheckRow, Estimate, MCResult, bonferroni_z, check_monte_carlo,
                          estimate, sample)
from .architectures import make_model
from .gpt2 import GPT2Model, GPT2Spec
from .model import FunctionModel, MLPModel, ModelSpec, TabularModel
from .results import ExactResult, topk_overlap
from .rewards import CountReward, FunctionReward, LengthReward, MatchReward
from .samplers import LogitsSampler, PerturbedSampler, RoundedSampler, TemperatureSampler
from .version import __version__
from .tasks import Task, list_configs, load_config, load_task, task_from_json
from .token_fisher import token_fisher, token_fisher_pairwise, uniform_token_fisher


__all__ = [
    "exact", "ExactResult", "EnumerationTooLarge", "estimate_cost", "topk_overlap",
    "ModelSpec", "MLPModel", "TabularModel", "FunctionModel", "make_model", "GPT2Spec", "GPT2Model",
    "CountReward", "MatchReward", "LengthReward", "FunctionReward",
    "TemperatureSampler", "PerturbedSampler", "RoundedSampler", "LogitsSampler",
    "Task", "task_from_json", "load_task", "load_config", "list_configs",
    "token_fisher", "token_fisher_pairwise", "uniform_token_fisher", "__version__",
    "sample", "estimate", "MCResult", "Estimate", "bonferroni_z", "check_monte_carlo",
    "CheckRow", "export_golden", "load_golden", "compare_golden", "GoldenFileError", "check_token_fisher",
]
