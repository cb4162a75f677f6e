"""The trainers' own loss code through fisher_ref: TRL's installed ``GRPOTrainer._compute_loss``
(every loss type, every ``scale_rewards``) and verl's ``core_algos`` glue (on a stand-in)."""
import inspect
import warnings

import numpy as np
import pytest
import torch

from fisher_ref.checks.tolerances import EXACT_RTOL
from fisher_ref.estimators import check_loss, expected_loss_gradient, presets
from fisher_ref.estimators.batch import make_batch
from fisher_ref.estimators.trainers import (TRL_ADVANTAGE_EPS, trl_advantages, trl_loss,
                                            verl_loss)

from . import verl_standin
from .brute import tiny_task

G = 2
LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")
SCALES = ("group", "batch", "none")


@pytest.fixture(scope="module")
def task():
    return tiny_task(reference={"kind": "perturbed", "scale": 0.3, "seed": 5})


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():  # GRPOConfig's own FutureWarning (gradient_checkpointing)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def trl_by_hand(loss_type, scale, length):
    """TRL 1.16's GRPO loss for one group, written out from its documentation (first step:
    the ratio is 1 in value, ``A ∇log p`` in gradient)."""
    def loss(b):
        R = b.rewards
        A = R - R.mean()
        if scale != "none":  # one group: the group's std is the batch's
            A = A / (R.std() + 1e-4)
        m = b.mask.to(R.dtype)
        lt = -A[:, None].detach() * torch.exp(b.logp - b.logp.detach()) * m  # (B, T)
        if loss_type == "grpo":
            return (lt.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
        if loss_type in ("bnpo", "dapo"):
            return lt.sum() / m.sum()
        return lt.sum() / (R.shape[0] * length)
    return loss


def _close(a, b):
    return np.abs(a - b).max() <= EXACT_RTOL * max(np.abs(b).max(), 1e-300)


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_trl_loss_is_trls_documented_loss(task, loss_type, scale):
    lg = expected_loss_gradient(task, trl_loss(loss_type, scale_rewards=scale), G)
    ref = expected_loss_gradient(task, trl_by_hand(loss_type, scale, task.max_len), G)
    assert _close(lg.mean, ref.mean), (loss_type, scale, np.abs(lg.mean - ref.mean).max())
    assert _close(lg.variance, ref.variance)


def test_trl_verdicts_are_the_maths(task):
    """Dr. GRPO without the std is the group-mean baseline over a constant: unbiased up to
    the scale (1 - 1/G)/T. The std and the per-response or per-batch token counts make
    the others biased on a task whose responses differ in length and reward."""
    v = check_loss(task, trl_loss("dr_grpo", scale_rewards="none"), G, "unbiased-up-to-scale")
    assert v, v.message
    assert abs(v.scale + (1 - 1 / G) / task.max_len) <= EXACT_RTOL
    for loss_type in LOSS_TYPES:
        for scale in SCALES:
            if (loss_type, scale) == ("dr_grpo", "none"):
                continue
            v = check_loss(task, trl_loss(loss_type, scale_rewards=scale), G,
                           "unbiased-up-to-scale")
            assert not v and v.relative_bias > 1e-3, (loss_type, scale, v.message)


def test_trl_dr_grpo_equals_the_preset(task):
    """TRL's ``dr_grpo`` with ``scale_rewards="none"`` is :func:`presets.dr_grpo`."""
    a = expected_loss_gradient(task, trl_loss("dr_grpo", scale_rewards="none"), G)
    b = expected_loss_gradient(task, presets.dr_grpo(), G)
    assert _close(a.mean, b.mean)


def test_trl_epsilon_is_not_the_presets(task):
    """TRL divides by std + 1e-4, the presets (verl) by std + 1e-6: the expected gradients
    differ, by an amount of the order of the epsilons' difference."""
    a = expected_loss_gradient(task, trl_loss("grpo"), G).mean
    b = expected_loss_gradient(task, presets.grpo(), G).mean
    rel = np.linalg.norm(a - b) / np.linalg.norm(b)
    assert 1e-7 < rel < 1e-2, rel


def test_dapo_is_bnpo_for_one_group(task):
    """``num_items_in_batch`` is the batch's token count: one group of one step, dapo's
    divisor is bnpo's."""
    a = expected_loss_gradient(task, trl_loss("dapo"), G).mean
    b = expected_loss_gradient(task, trl_loss("bnpo"), G).mean
    assert _close(a, b)


def test_metrics_sink_changes_no_number(task):
    """The default (collectives returning zeros, vectorised) and TRL's metrics as written
    (``.item()``, one group at a time) give the same expected gradient."""
    for loss_type in ("grpo", "dapo"):
        a = expected_loss_gradient(task, trl_loss(loss_type), G)
        b = expected_loss_gradient(task, trl_loss(loss_type, metrics=True), G)
        assert _close(a.mean, b.mean) and _close(a.variance, b.variance)


def test_trl_k3_term_is_linear_in_beta(task):
    """``beta != 0`` adds TRL's k3 term, per token, 1/|y| per response (``grpo``), times
    the differentiable ratio ``p / p_old`` (``use_bias_correction_kl``, on by default in
    TRL 1.16: the gradient is that of :func:`presets.rho_k3`); off, k3 alone."""
    base = expected_loss_gradient(task, trl_loss("grpo"), G).mean
    with_kl = expected_loss_gradient(task, trl_loss("grpo", beta=0.1), G).mean

    plain = expected_loss_gradient(task, trl_loss("grpo", beta=0.1,
                                                  use_bias_correction_kl=False), G).mean

    def k3(rho):
        def loss(b):
            d = b.ref_logp - b.logp
            m = b.mask.to(d.dtype)
            w = torch.exp(b.logp - b.logp.detach()) if rho else 1.0
            return 0.1 * (((w * (torch.exp(d) - d - 1)) * m).sum(-1) / m.sum(-1)).mean()
        return loss
    assert _close(with_kl - base, expected_loss_gradient(task, k3(True), G).mean)
    assert _close(plain - base, expected_loss_gradient(task, k3(False), G).mean)


def test_trl_advantages_mirror_the_installed_source():
    """The statements :func:`trl_advantages` repeats are in the installed TRL."""
    from trl import GRPOTrainer
    src = inspect.getsource(GRPOTrainer._generate_and_score_completions)
    for line in ("std_rewards = nanstd(rewards.view(-1, num_generations), dim=1)",
                 "std_rewards = nanstd(rewards).expand_as(rewards)",
                 "advantages = rewards - mean_grouped_rewards",
                 "advantages = advantages / (std_rewards + 1e-4)"):
        assert line in src, line
    assert TRL_ADVANTAGE_EPS == 1e-4


def _batch(K, G_, seed=0):
    rng = np.random.default_rng(seed)
    B, T, V = K * G_, 3, 4
    z = torch.tensor(rng.normal(size=(B, T, V)))
    lpa = torch.log_softmax(z, -1).requires_grad_(True)
    lengths = torch.tensor(rng.integers(1, T + 1, size=B))
    mask = torch.arange(T)[None] < lengths[:, None]
    tokens = torch.where(mask, torch.tensor(rng.integers(0, V, size=(B, T))), -1)
    b = make_batch(lpa, lpa.detach(), None, tokens, mask, torch.tensor(rng.normal(size=B)), 0)
    b.groups = torch.arange(K).repeat_interleave(G_)
    return b


def test_trl_advantages_over_groups_and_batch():
    """K groups of G consecutive rows: "group" whitens each group, "batch" centres each
    group and divides by the whole batch's std. TRL's ``nanstd`` takes its Bessel factor
    ``n / (n - 1)`` as int64 / int64, which torch rounds to float32: 6/5 here (3/2, a
    float32, for the groups of 3)."""
    R = torch.tensor([0.0, 1.0, 3.0, 1.0, 2.0, 2.5], dtype=torch.float64)
    g = R.view(2, 3)
    dev = (g - g.mean(1, keepdim=True)).reshape(-1)
    group = dev / (g.std(1).repeat_interleave(3) + 1e-4)
    bessel = float(np.float32(6 / 5))  # TRL's, not 1.2
    batch = dev / (torch.sqrt(((R - R.mean()) ** 2).mean() * bessel) + 1e-4)
    assert not torch.allclose(batch, dev / (R.std() + 1e-4), rtol=1e-9, atol=0)
    assert torch.allclose(trl_advantages(R, 3, "group"), group, rtol=1e-12, atol=0)
    assert torch.allclose(trl_advantages(R, 3, "batch"), batch, rtol=1e-12, atol=0)
    assert torch.allclose(trl_advantages(R, 3, "none"), dev, rtol=1e-12, atol=0)


def test_trl_loss_reads_the_batch_groups():
    """With ``groups``, ``num_generations`` is G and dapo divides by the whole batch's
    tokens: the loss of two groups is the token-weighted mean of theirs."""
    b = _batch(2, 3)
    loss = trl_loss("dapo", scale_rewards="group")
    whole = float(loss(b).detach())
    parts, tokens = [], []
    for k in range(2):
        rows = slice(3 * k, 3 * k + 3)
        sub = make_batch(b.logp_all[rows], b.sampler_logp_all[rows], None, b.tokens[rows],
                         b.mask[rows], b.rewards[rows], 0)
        parts.append(float(loss(sub).detach()))
        tokens.append(float(b.mask[rows].sum()))
    assert abs(whole - np.dot(parts, tokens) / sum(tokens)) <= 1e-12


def test_trl_loss_refuses_what_it_does_not_mirror(task):
    from trl import GRPOConfig
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        trl_loss(config=GRPOConfig(gradient_accumulation_steps=2, report_to="none",
                                   use_cpu=True, bf16=False))
    with pytest.raises(TypeError, match="config"):
        trl_loss(config=GRPOConfig(report_to="none", use_cpu=True, bf16=False), beta=0.1)
    with pytest.raises(ValueError, match="top_entropy_quantile"):
        trl_loss(top_entropy_quantile=0.5)
    with pytest.raises(ValueError, match="max_completion_length"):
        trl_loss(max_completion_length=1)(_batch(1, 2))
    with pytest.raises(ValueError, match="reference"):
        trl_loss(beta=0.1)(_batch(1, 2))
    b = _batch(2, 2)
    b.groups = torch.tensor([0, 1, 0, 1])
    with pytest.raises(ValueError, match="groups"):
        trl_loss()(b)


class _ActorConfig(dict):
    """What verl's vanilla policy loss reads of ``ActorConfig``."""
    clip_ratio = clip_ratio_low = clip_ratio_high = 0.2
    clip_ratio_c = 3.0
    global_batch_info = {}


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_verl_glue_on_the_standin(task, mode):
    """The verl recipe's glue (token-level rewards on the last token, ``index`` from the
    groups, verl's argument names) on the stand-in module gives the GRPO presets, which
    follow verl's conventions (seq-mean-token-mean to verl's 1e-8 in its divisor)."""
    loss = verl_loss(verl_standin, loss_agg_mode=mode, actor_config=_ActorConfig())
    a = expected_loss_gradient(task, loss, G).mean
    b = expected_loss_gradient(task, presets.grpo(mode), G).mean
    tol = 1e-7 if mode == "seq-mean-token-mean" else EXACT_RTOL
    assert np.abs(a - b).max() <= tol * np.abs(b).max()
