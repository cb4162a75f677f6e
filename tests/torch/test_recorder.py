"""GradientRecorder on the real TRL GRPOTrainer: what it records, and its refusals (a
run that would move or clip the weights, a model with no trained parameter, weights that
moved, memory past its cap, too few steps for a verdict). The end-to-end checks of what
it records are in test_trl_end_to_end.py."""
import warnings

import numpy as np
import pytest
import torch

from fisher_ref.estimators import trl_expected
from fisher_ref.testing import check_applied_gradient
from fisher_ref.torch import GradientRecorder
from fisher_ref.torch.tiny import tiny_llama

from .test_trl_end_to_end import MODEL, V, grpo_args, make_trainer


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def run_grpo(loss_type, steps, **over):
    rec = GradientRecorder()
    make_trainer(grpo_args(loss_type, steps, **over), callbacks=[rec]).train()
    return rec


def _args(loss_type, steps):
    return grpo_args(loss_type, steps)


def test_one_step_is_refused_and_the_layout_is_the_models():
    trainer = make_trainer(grpo_args("grpo", 1), callbacks=[rec := GradientRecorder()])
    target = trl_expected(trainer)
    trainer.train()
    assert rec.steps == 1 and rec.samples().shape == (1, target.exact.mean.size)
    assert [n for n, _, _ in rec.layout] == rec.names == target.names
    assert rec.layout[-1][0] == "lm_head.weight"
    with pytest.raises(ValueError, match="fewer than min_steps"):
        check_applied_gradient(rec, target.exact)
    with pytest.raises(ValueError, match="parameters per step"):
        check_applied_gradient(rec.samples()[:, 1:].repeat(40, 0), target.exact)


def test_recorder_refuses_moving_weights_and_clipping():
    with pytest.raises(ValueError, match="learning_rate"):
        run_grpo("grpo", 2, learning_rate=1e-3)
    with pytest.raises(ValueError, match="max_grad_norm"):
        run_grpo("grpo", 2, max_grad_norm=1.0)


def test_recorder_refuses_a_model_with_no_trained_parameter():
    model = tiny_llama(V, **MODEL)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trained parameter"):
        GradientRecorder().on_train_begin(_args("grpo", 1), None, None, model=model)


def test_recorder_sees_weights_that_moved_and_caps_memory():
    model = tiny_llama(V, **MODEL)
    rec = GradientRecorder(max_bytes=2 * 8 * sum(p.numel() for p in model.parameters()))
    args = _args("grpo", 1)
    rec.on_train_begin(args, None, None, model=model)
    for _ in range(2):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    with pytest.raises(MemoryError, match="keep_samples=False"):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    s, s2, n = rec.running_sums()
    assert n == 2 and rec.samples().shape == (2, s.size) and not s.any()
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    with pytest.raises(ValueError, match="moved"):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    sums_only = GradientRecorder(keep_samples=False)
    sums_only.on_train_begin(args, None, None, model=model)
    sums_only.on_pre_optimizer_step(args, None, None, model=model)
    assert sums_only.samples() is None and sums_only.running_sums()[2] == 1


def test_target_check_without_distribution_and_a_sums_only_recorder():
    """Without the distribution the target's check is the per-parameter test at the whole
    alpha; a recorder that kept only running sums serves it, and the covariance test
    refuses it by name."""
    from fisher_ref.testing import check_applied_covariance
    rec = GradientRecorder(keep_samples=False)
    trainer = make_trainer(grpo_args("grpo", 40), callbacks=[rec])
    target = trl_expected(trainer)
    trainer.train()
    v = target.check(rec, alpha=1e-6)
    assert v, f"seed 0: {v.message}"  # a clean run: false failure <= 1e-6
    assert v.covariance is None and v.per_parameter.alpha == 1e-6
    assert np.isnan(v.per_parameter.scale_se)  # the steps were not kept
    with pytest.raises(ValueError, match="keep_samples=False"):
        check_applied_covariance(rec, target.exact, distribution=([0], [1]))


def test_checkable_trainer_takes_args_or_settings_not_both():
    from fisher_ref.torch.tiny import checkable_grpo_trainer, tiny_tokenizer
    with pytest.raises(TypeError, match="not both"):
        checkable_grpo_trainer(tiny_llama(V, **MODEL), tiny_tokenizer(V), lambda **k: [0.0],
                               "t1", args=grpo_args(), num_generations=3)


def test_a_recorder_holding_nan_is_refused():
    model = tiny_llama(V, **MODEL)
    rec = GradientRecorder()
    args = _args("grpo", 1)
    rec.on_train_begin(args, None, None, model=model)
    for _ in range(40):
        model.lm_head.weight.grad = torch.full_like(model.lm_head.weight, float("nan"))
        rec.on_pre_optimizer_step(args, None, None, model=model)
    P = rec.running_sums()[0].size
    exact = (np.zeros(P), np.ones(P), -np.ones(P), np.ones(P))
    with pytest.raises(ValueError, match="NaN"):
        check_applied_gradient(rec, exact)
