"""expected_loss_gradient against an independent brute force (tests/estimators/brute.py):
every ordered group, autograd with respect to theta per group, at 1e-10."""
import numpy as np
import pytest
import torch

import cases
from fisher_ref import exact, load_config
from fisher_ref.estimators import expected_loss_gradient
from fisher_ref.samplers import make_sampler

from .brute import brute_force, tiny_task

RTOL = cases.RTOL
STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
REF = {"kind": "perturbed", "scale": 0.3, "seed": 5}


def _seq(b):
    return (b.logp * b.mask).sum(1)


def reinforce(b):
    return -(b.rewards * _seq(b)).mean()


def grpo_token_mean(b):  # std-normalised, clipped ratio, token-mean aggregation
    a = (b.rewards - b.rewards.mean()) / (b.rewards.std() + 1e-6) if b.logp.shape[0] > 1 \
        else b.rewards
    ratio = torch.exp(b.logp - b.sampler_logp)
    pg = -torch.minimum(ratio * a[:, None], ratio.clamp(0.8, 1.2) * a[:, None])
    return (pg * b.mask).sum() / b.mask.sum()


def asymmetric(b):  # treats the first response differently from the others
    w = torch.arange(1, b.logp.shape[0] + 1, dtype=torch.float64)
    return -(w * b.rewards * _seq(b)).sum() + 0.3 * (b.logp[0] ** 2).sum()


def full_vocab_kl(b):  # reads the whole distribution, k3 per token and a leaked mask
    kl = (b.logp_all.exp() * (b.logp_all - b.ref_logp_all)).sum(-1)  # (B, T)
    d = b.ref_logp - b.logp
    k3 = (torch.exp(d) - 1 - d) * b.mask
    return kl.sum() + k3.sum() - 0.1 * b.logp_all.sum()


def seq_is(b):
    rho = torch.exp(((b.logp - b.sampler_logp) * b.mask).sum(1)).detach()
    return -(rho * (b.rewards - b.rewards.mean()) * _seq(b)).mean()


LOSSES = {"reinforce": reinforce, "grpo": grpo_token_mean, "asymmetric": asymmetric,
          "seq_is": seq_is}
TASKS = {"on": lambda: tiny_task(reference=REF), "off": lambda: tiny_task(STALE, REF),
         "no_eos": lambda: tiny_task({"kind": "temperature", "temperature": 1.7}, REF,
                                     eos=False),
         "off1": lambda: tiny_task(STALE, REF, one_prompt=True),
         "on1": lambda: tiny_task(reference=REF, one_prompt=True)}


def _close(a, b):
    assert cases.rel(a, b) <= RTOL, cases.rel(a, b)


CASES = [(n, t, G) for n in list(LOSSES) + ["full_vocab_kl"] for t in ("on", "off", "no_eos")
         for G in (1, 2)]
CASES += [("grpo", "off1", 3), ("asymmetric", "on1", 3)]  # one prompt: 343 groups


@pytest.mark.parametrize("name,task_id,G", CASES)
def test_mean_and_variance_are_brute_force(name, task_id, G):
    task = TASKS[task_id]()
    loss = full_vocab_kl if name == "full_vocab_kl" else LOSSES[name]
    lg = expected_loss_gradient(task, loss, group_size=G)
    mean, var, klg = brute_force(task, loss, G)
    _close(lg.mean, mean)
    _close(lg.variance, var)
    _close(lg.kl_gradient, klg)


def test_symmetric_multisets_equal_ordered_tuples():
    task = tiny_task(STALE, REF)
    for G in (2, 3):
        a = expected_loss_gradient(task, grpo_token_mean, group_size=G)
        b = expected_loss_gradient(task, grpo_token_mean, group_size=G, symmetric=True)
        _close(a.mean, b.mean)
        _close(a.variance, b.variance)
        assert b.n_groups < a.n_groups


@pytest.mark.parametrize("name", ["default", "weighted_prompts", "offpolicy_stale",
                                  "gpt2_offpolicy", "no_eos"])
def test_policy_gradient_is_the_engines(name):
    task = load_config(name)
    lg = expected_loss_gradient(task, reinforce)
    _close(lg.policy_gradient, exact(task, progress=False).gradient)
    assert lg.kl_gradient is None


def test_unvectorisable_loss_falls_back_to_one_group_at_a_time():
    task = tiny_task(STALE)

    def branchy(b):  # .item() and a data-dependent branch: vmap refuses both
        scale = 2.0 if b.rewards.sum().item() > 0 else 1.0
        return scale * grpo_token_mean(b)
    a = expected_loss_gradient(task, branchy, group_size=2)
    b = expected_loss_gradient(task, branchy, group_size=2, vectorize=False)
    mean, var, _ = brute_force(task, branchy, 2)
    _close(a.mean, mean)
    _close(b.mean, mean)
    _close(a.variance, var)


@pytest.mark.parametrize("bad,error,match", [
    ({"group_size": 0}, ValueError, "group_size"),
    ({"group_size": 1.5}, ValueError, "group_size"),
    ({"loss": "reinforce"}, TypeError, "loss must be a callable"),
    ({"loss": lambda b: b.logp}, ValueError, "scalar"),
    ({"loss": lambda b: 1.0}, TypeError, "torch scalar"),
])
def test_bad_input_names_the_problem(bad, error, match):
    kw = {"loss": reinforce, "group_size": 1, **bad}
    with pytest.raises(error, match=match):
        expected_loss_gradient(tiny_task(), kw.pop("loss"), **kw)


def test_scale_cosine_bias_and_mse():
    task = tiny_task(STALE)
    def token_is(b):  # biased off policy
        rho = torch.exp(b.logp - b.sampler_logp).detach()
        return -(rho * b.rewards[:, None] * b.logp * b.mask).sum()
    lg = expected_loss_gradient(task, token_is)
    g = lg.policy_gradient
    alpha = lg.mean @ g / (g @ g)
    assert lg.scale == pytest.approx(alpha, rel=1e-12)
    assert lg.cosine == pytest.approx(lg.mean @ g / np.linalg.norm(lg.mean) / np.linalg.norm(g))
    bias = lg.mean - alpha * g
    assert lg.relative_bias == pytest.approx(np.linalg.norm(bias) / np.linalg.norm(alpha * g))
    assert lg.mse(4) == pytest.approx(bias @ bias + lg.variance.sum() / 4)
    with pytest.raises(ValueError, match="batches"):
        lg.mse(0)


def test_reference_is_a_task_key():
    task = tiny_task(reference=REF)
    assert task.reference.to_json() == {"kind": "perturbed", "scale": 0.3, "seed": 5}
    assert task.to_json()["reference"] == task.reference.to_json()
    assert task.with_(baseline=0.5).reference is task.reference
    assert "reference" not in tiny_task().to_json()
    with pytest.raises(ValueError, match="reference: unknown sampler kind"):
        tiny_task(reference={"kind": "nope"})
    with pytest.raises(TypeError, match="reference must be"):
        task.with_(reference="perturbed")


def test_tabular_model_is_brute_force():
    task = load_config("tabular").with_(
        max_len=2, sampler=make_sampler({"kind": "temperature", "temperature": 0.7}),
        reference=make_sampler(REF))
    for loss in (grpo_token_mean, full_vocab_kl):
        lg = expected_loss_gradient(task, loss, group_size=2)
        mean, var, klg = brute_force(task, loss, 2)
        _close(lg.mean, mean)
        _close(lg.variance, var)
        _close(lg.kl_gradient, klg)


@pytest.mark.parametrize("loss", [
    lambda b: reinforce(b).detach(),
    lambda b: torch.tensor(1.0, dtype=torch.float64),
    lambda b: (b.rewards * _seq(b).detach()).mean(),
], ids=["detached", "constant", "no-path-to-logp"])
@pytest.mark.parametrize("vectorize", [True, False])
def test_a_loss_that_never_reaches_logp_is_refused(loss, vectorize):
    """issue 46 item 11: a loss with no path to batch.logp gave an all-zero expected
    gradient and the verdict 'the expected gradient vanishes'."""
    with pytest.raises(ValueError, match="does not depend on the log-probabilities"):
        expected_loss_gradient(tiny_task(), loss, 2, vectorize=vectorize)


def test_a_loss_whose_gradient_is_zero_through_logp_is_not_refused():
    """A loss that reaches logp with a zero coefficient has E[grad] = 0 in value, which
    is the verdict's business (the 'vanishes' message), not a refusal."""
    lg = expected_loss_gradient(tiny_task(), lambda b: 0.0 * _seq(b).sum(), 2)
    assert not lg.mean.any()


@pytest.mark.parametrize("pg,match", [
    (np.zeros(3), r"shape \("),
    (np.full(35, np.nan), "NaN"),
    ("abc", "policy_gradient"),
])
def test_a_bad_policy_gradient_is_refused(pg, match):
    """issue 46 item 12: a policy_gradient= of the wrong shape or all NaN was stored, and
    .scale then failed with a broadcast error or every derived number was NaN."""
    task = tiny_task()
    assert task.theta.shape == (35,)
    with pytest.raises(ValueError, match=match):
        expected_loss_gradient(task, reinforce, policy_gradient=pg)


@pytest.mark.parametrize("vectorize", [True, False])
def test_a_loss_writing_into_the_mask_in_place_runs(vectorize):
    """issue 46 item 17: a loss that writes into batch.mask in place got torch's
    'modified by an inplace operation'; the loss now gets a mask of its own, and its
    result is that of the same loss written out of place."""
    def in_place(b):
        b.mask[:, 0] = False  # drops the first token from the loss
        return -(b.rewards * (b.logp * b.mask).sum(1)).mean()

    def out_of_place(b):
        m = b.mask.clone()
        m[:, 0] = False
        return -(b.rewards * (b.logp * m).sum(1)).mean()
    task = tiny_task()
    got = expected_loss_gradient(task, in_place, 2, vectorize=vectorize)
    want = expected_loss_gradient(task, out_of_place, 2, vectorize=vectorize)
    assert cases.rel(got.mean, want.mean) <= RTOL and cases.rel(got.variance, want.variance) <= RTOL
    assert np.abs(got.mean).max() > 0


def test_a_loss_writing_into_logp_all_in_place_is_named():
    """issue 46 item 17: a write into a tensor the gradient needs names the field."""
    def writes_logp_all(b):
        b.logp_all.mul_(2.0)
        return reinforce(b)
    with pytest.raises(ValueError, match=r"batch\.logp_all in place"):
        expected_loss_gradient(tiny_task(), writes_logp_all, 1)


COV_CASES = [("grpo", "off", 2, False), ("full_vocab_kl", "on", 2, False),
             ("grpo", "off1", 3, True), ("seq_is", "no_eos", 1, False)]


@pytest.mark.parametrize("name,task_id,G,symmetric", COV_CASES)
def test_covariance_is_brute_force(name, task_id, G, symmetric):
    task = TASKS[task_id]()
    loss = full_vocab_kl if name == "full_vocab_kl" else LOSSES[name]
    lg = expected_loss_gradient(task, loss, group_size=G, symmetric=symmetric,
                                covariance=True)
    mean, var, _, cov = brute_force(task, loss, G, covariance=True)
    _close(lg.mean, mean)
    _close(lg.covariance, cov)
    assert lg.covariance.shape == (task.theta.size,) * 2


def test_covariance_diagonal_is_the_variance_and_it_is_psd():
    task = tiny_task(STALE, REF)
    lg = expected_loss_gradient(task, grpo_token_mean, group_size=2, covariance=True)
    np.testing.assert_allclose(np.diag(lg.covariance), lg.variance, rtol=1e-12, atol=0)
    assert np.array_equal(lg.covariance, lg.covariance.T)
    eig = np.linalg.eigvalsh(lg.covariance)
    assert eig.min() >= -1e-12 * eig.max()
    assert expected_loss_gradient(task, grpo_token_mean, group_size=2).covariance is None


def test_covariance_merged_over_many_chunks_is_one_chunks(monkeypatch):
    """The co-moment merged chunk by chunk (Chan) equals the one-chunk sum."""
    import fisher_ref.estimators.gradient as gradient
    task = tiny_task(STALE, REF)
    one = expected_loss_gradient(task, grpo_token_mean, group_size=2, covariance=True)
    monkeypatch.setattr(gradient, "_VMAP_GROUPS", 7)  # chunks of 7 groups
    many = expected_loss_gradient(task, grpo_token_mean, group_size=2, covariance=True)
    _close(many.covariance, one.covariance)


@pytest.mark.parametrize("kw,error,match", [
    ({"covariance": 1}, TypeError, "covariance must be True or False"),
    ({"covariance": True, "max_bytes": 6000}, ValueError, r"covariance=True refused: P = 35"),
])
def test_covariance_past_its_limit_is_refused(kw, error, match):
    with pytest.raises(error, match=match):
        expected_loss_gradient(tiny_task(), reinforce, **kw)


def test_covariance_past_max_parameters_is_refused(monkeypatch):
    import fisher_ref.estimators.gradient as gradient
    monkeypatch.setattr(gradient, "MAX_COVARIANCE_PARAMETERS", 34)
    with pytest.raises(ValueError, match=r"covariance.*P = 35.*at most P = 34"):
        expected_loss_gradient(tiny_task(), reinforce, covariance=True)
