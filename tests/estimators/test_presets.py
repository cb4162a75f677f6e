"""The presets: closed forms of their expected gradients, the project's centered and
top-k streams, and values against plain re-implementations of the same formulas."""
import math

import numpy as np
import pytest
import torch

import cases
from fisher_ref import exact
from fisher_ref.estimators.batch import LossBatch
from fisher_ref.estimators.gradient import expected_loss_gradient
from fisher_ref.estimators import presets as P
from fisher_ref.engine.plan import EngineOptions

from .brute import state_kl_gradient, tiny_task

RTOL = cases.RTOL
STALE = {"kind": "perturbed", "scale": 0.4, "seed": 3}
REF = {"kind": "perturbed", "scale": 0.3, "seed": 5}


def _close(a, b, scale=None):
    assert cases.rel(a, b, scale) <= RTOL, cases.rel(a, b, scale)


@pytest.fixture(scope="module")
def on():
    return tiny_task(reference=REF, baseline=0.3)


@pytest.fixture(scope="module")
def off():
    return tiny_task(STALE, REF, baseline=0.3)


def test_reinforce_is_unbiased(on):
    lg = expected_loss_gradient(on, P.reinforce(0.3))
    _close(lg.mean, -lg.policy_gradient)


@pytest.mark.parametrize("G", [2, 3])
def test_group_mean_baseline_scales_by_one_minus_one_over_G(on, G):
    lg = expected_loss_gradient(on, P.group_mean_reinforce(), group_size=G, symmetric=True)
    _close(lg.mean, -(1 - 1 / G) * lg.policy_gradient)


@pytest.mark.parametrize("G", [2, 3])
def test_rloo_is_unbiased(off, G):
    lg = expected_loss_gradient(off.with_(sampler=None), P.rloo(), group_size=G, symmetric=True)
    _close(lg.mean, -lg.policy_gradient)


def test_dr_grpo_is_unbiased_up_to_its_scale(on):
    G, T = 2, on.max_len
    lg = expected_loss_gradient(on, P.dr_grpo(), group_size=G, symmetric=True)
    _close(lg.mean, -(1 - 1 / G) / T * lg.policy_gradient)


def test_on_policy_importance_weights_are_reinforce(on):
    ref = expected_loss_gradient(on, P.reinforce(0.3)).mean
    for loss in (P.sequence_is(baseline=0.3), P.token_is(baseline=0.3),
                 P.prefix_is(baseline=0.3), P.sequence_tis(1.5, baseline=0.3),
                 P.token_mis((0.5, 2.0), baseline=0.3)):
        _close(expected_loss_gradient(on, loss).mean, ref)


def test_sequence_is_is_unbiased_off_policy_and_token_is_is_not(off):
    seq = expected_loss_gradient(off, P.sequence_is(baseline=0.3))
    _close(seq.mean, -seq.policy_gradient)
    tok = expected_loss_gradient(off, P.token_is(baseline=0.3))
    assert tok.relative_bias > 1e-3


def _rho(table_task):
    """Sequence weights p(y)/mu(y) of every response, by the engine's kept responses."""
    r = exact(table_task, progress=False, options=EngineOptions(keep_sequences=True))
    s = r.sequences
    return s, s["prob"] / s["sampler_prob"]


def test_truncation_and_mask_bias_closed_forms(off):
    s, rho = _rho(off)
    C, (a, b) = 1.05, (0.9, 1.1)
    lg = expected_loss_gradient(off, P.sequence_tis(C, baseline=0.3))
    mis = expected_loss_gradient(off, P.sequence_mis((a, b), baseline=0.3))
    # bias = -E_p[(1 - C/rho)_+ A h] and -E_p[1[rho not in [a,b]] A h], by reweighting the
    # sequence-IS loss response by response (a loss that reads the weights it needs)
    trunc = expected_loss_gradient(off, _reweighted(lambda r: torch.clamp(1 - C / r, min=0.0)))
    out = expected_loss_gradient(off, _reweighted(lambda r: ((r < a) | (r > b)).double()))
    assert rho.max() > C and ((rho < a) | (rho > b)).any()  # the caps bite here
    _close(lg.mean, -lg.policy_gradient + trunc.mean, np.linalg.norm(lg.policy_gradient))
    _close(mis.mean, -mis.policy_gradient + out.mean, np.linalg.norm(lg.policy_gradient))


def _reweighted(f):
    """``-E_p[f(rho) A h]`` written as a sequence-IS loss: ``-sg(rho f(rho)) A sum logp``."""
    def loss(b):
        rho = torch.exp(((b.logp - b.sampler_logp) * b.mask).sum(1)).detach()
        return (rho * f(rho) * (b.rewards - 0.3) * (b.logp * b.mask).sum(1)).mean()
    return loss


def test_centering_agrees_with_the_centered_and_topk_streams(off):
    r = exact(off, topk=(1, 2), progress=False)
    _close(expected_loss_gradient(off, P.centered(0.3)).mean, -r.streams["centered"].gradient)
    for k in (1, 2):
        _close(expected_loss_gradient(off, P.topk_centered(k, 0.3)).mean,
               -r.streams[f"top{k}"].gradient)


def test_kl_in_the_reward_gives_the_sequence_kl_gradient(on):
    lg = expected_loss_gradient(on, P.kl_in_reward(0.7))
    _close(lg.mean, 0.7 * lg.kl_gradient)


def test_k1_in_the_loss_has_no_expected_gradient_on_policy(on):
    lg = expected_loss_gradient(on, P.kl_loss("k1"))
    assert np.linalg.norm(lg.mean) <= RTOL * np.linalg.norm(lg.kl_gradient)


def test_k2_and_k3_in_the_loss_follow_the_per_state_kls(on, off):
    _close(expected_loss_gradient(on, P.kl_loss("k2")).mean, state_kl_gradient(on, "reverse"))
    _close(expected_loss_gradient(on, P.kl_loss("k3")).mean, state_kl_gradient(on, "forward"))
    # off policy the draw is mu's, and k3 no longer follows the forward KL
    assert cases.rel(expected_loss_gradient(off, P.kl_loss("k3")).mean,
                     state_kl_gradient(off, "forward")) > 1e-3


def test_rho_k3_is_k2_on_policy(on):
    _close(expected_loss_gradient(on, P.rho_k3()).mean,
           expected_loss_gradient(on, P.kl_loss("k2")).mean)


def test_kl_losses_need_a_reference():
    with pytest.raises(ValueError, match="reference"):
        expected_loss_gradient(tiny_task(), P.kl_loss("k3"))


# ---- values against plain re-implementations, on random batches ----

def _random_batch(seed, B=3, T=4, V=5):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (B,), generator=g)
    mask = torch.arange(T)[None, :] < lengths[:, None]
    tokens = torch.where(mask, torch.randint(0, V, (B, T), generator=g), -1)

    def dist():
        z = torch.randn(B, T, V, generator=g, dtype=torch.float64)
        return torch.where(mask[..., None], torch.log_softmax(z, -1), 0.0)
    lpa = dist().requires_grad_(True)
    spa, rpa = dist(), dist()

    def at(a):
        return torch.where(mask, a.gather(-1, tokens.clamp(min=0)[..., None])[..., 0], 0.0)
    logp = at(lpa)
    R = torch.randint(0, 3, (B,), generator=g).double()
    return LossBatch(logp, logp.detach(), at(spa), at(rpa), mask, R, lengths, tokens, 0, lpa,
                     spa, rpa)


def _plain_grpo(b, agg):
    B = len(b.rewards)
    r = [float(x) for x in b.rewards]
    mean = sum(r) / B
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (B - 1))
    A = [(x - mean) / (std + 1e-6) for x in r]
    per = [[-A[i] * b.logp[i, t] for t in range(int(b.lengths[i]))] for i in range(B)]
    if agg == "seq-mean-token-mean":
        return sum(sum(p) / len(p) for p in per) / B
    if agg == "token-mean":
        return sum(sum(p) for p in per) / sum(len(p) for p in per)
    return sum(sum(p) for p in per) / b.logp.shape[1]  # verl: loss_mask.shape[-1]


def _plain_is(b, level, cap=None, band=None):
    out = 0.0
    for i in range(len(b.rewards)):
        n = int(b.lengths[i])
        lr = [float((b.logp[i, t] - b.sampler_logp[i, t]).detach()) for t in range(n)]
        for t in range(n):
            w = {"sequence": math.exp(sum(lr)), "token": math.exp(lr[t]),
                 "prefix": math.exp(sum(lr[:t + 1]))}[level]
            if cap is not None:
                w = min(w, cap)
            if band is not None and not band[0] <= w <= band[1]:
                w = 0.0
            out = out - w * (float(b.rewards[i]) - 0.25) * b.logp[i, t]
    return out / len(b.rewards)


def _plain_gspo(b, lo, hi):
    out = 0.0
    r = [float(x) for x in b.rewards]
    mean, B = sum(r) / len(r), len(r)
    std = math.sqrt(sum((x - mean) ** 2 for x in r) / (B - 1))
    for i in range(B):
        n = int(b.lengths[i])
        s = torch.exp(sum(b.logp[i, t] - b.sampler_logp[i, t] for t in range(n)) / n)
        A = (r[i] - mean) / (std + 1e-6)
        out = out - min(s * A, min(max(s, 1 - lo), 1 + hi) * A)
    return out / B


def _plain_k(b, kind):
    out = 0.0
    for i in range(len(b.rewards)):
        for t in range(int(b.lengths[i])):
            d = b.logp[i, t] - b.ref_logp[i, t]
            out = out + {"k1": d, "k2": d * d / 2, "k3": torch.exp(-d) - 1 + d}[kind]
    return out / len(b.rewards)


PLAIN = {
    "grpo": (P.grpo(), lambda b: _plain_grpo(b, "seq-mean-token-mean")),
    "dapo": (P.dapo(), lambda b: _plain_grpo(b, "token-mean")),
    "grpo_norm": (P.grpo("seq-mean-token-sum-norm"),
                  lambda b: _plain_grpo(b, "seq-mean-token-sum-norm")),
    "seq_is": (P.sequence_is(baseline=0.25), lambda b: _plain_is(b, "sequence")),
    "token_is": (P.token_is(baseline=0.25), lambda b: _plain_is(b, "token")),
    "prefix_is": (P.prefix_is(baseline=0.25), lambda b: _plain_is(b, "prefix")),
    "seq_tis": (P.sequence_tis(1.5, baseline=0.25), lambda b: _plain_is(b, "sequence", 1.5)),
    "token_tis": (P.token_tis(1.5, baseline=0.25), lambda b: _plain_is(b, "token", 1.5)),
    "seq_mis": (P.sequence_mis((0.5, 2.0), baseline=0.25),
                lambda b: _plain_is(b, "sequence", band=(0.5, 2.0))),
    "token_mis": (P.token_mis((0.5, 2.0), baseline=0.25),
                  lambda b: _plain_is(b, "token", band=(0.5, 2.0))),
    "gspo": (P.gspo(0.05, 0.1), lambda b: _plain_gspo(b, 0.05, 0.1)),
    "k1": (P.kl_loss("k1"), lambda b: _plain_k(b, "k1")),
    "k2": (P.kl_loss("k2"), lambda b: _plain_k(b, "k2")),
    "k3": (P.kl_loss("k3"), lambda b: _plain_k(b, "k3")),
}


@pytest.mark.parametrize("name", list(PLAIN))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_preset_matches_a_plain_reimplementation(name, seed):
    b = _random_batch(seed)
    ours, plain = PLAIN[name]
    a, c = ours(b), plain(b)
    ga = torch.autograd.grad(a, b.logp_all, allow_unused=True, retain_graph=True)[0]
    gc = torch.autograd.grad(c, b.logp_all, allow_unused=True)[0] if torch.is_tensor(c) \
        and c.requires_grad else None
    assert float(a.detach()) == pytest.approx(float(torch.as_tensor(c).detach()), rel=1e-12,
                                              abs=1e-14)
    ga = torch.zeros_like(b.logp_all) if ga is None else ga
    gc = torch.zeros_like(b.logp_all) if gc is None else gc
    assert torch.allclose(ga, gc, rtol=1e-12, atol=1e-14)


def test_unknown_choices_name_themselves():
    with pytest.raises(ValueError, match="aggregation"):
        P.policy_gradient_loss(aggregation="sum")
    with pytest.raises(ValueError, match="advantage"):
        P.policy_gradient_loss(advantage="gae")
    with pytest.raises(ValueError, match="unknown preset"):
        P.preset("ppo")
    with pytest.raises(ValueError, match="RLOO"):
        P.rloo()(_random_batch(0, B=1))


@pytest.mark.parametrize("build,name", [
    (lambda: P.sequence_tis(cap=-1), "cap"),
    (lambda: P.token_tis(cap=0), "cap"),
    (lambda: P.sequence_tis(cap=float("nan")), "cap"),
    (lambda: P.token_mis(band=(2, 1)), "band"),
    (lambda: P.sequence_mis(band=(-1, 2)), "band"),
    (lambda: P.token_mis(band=(0.5,)), "band"),
    (lambda: P.kl_in_reward(float("nan")), "beta"),
    (lambda: P.kl_loss("k3", "0.1"), "beta"),
    (lambda: P.kl_loss("k4"), "KL estimator"),
    (lambda: P.rho_k3(-1.0), "beta"),
    (lambda: P.reinforce(baseline=float("nan")), "baseline"),
    (lambda: P.reinforce(baseline="mean"), "baseline"),
    (lambda: P.centered(baseline=None), "baseline"),
    (lambda: P.gspo(eps_low=-0.1), "eps_low"),
    (lambda: P.cispo(eps_high=float("inf")), "eps_high"),
    (lambda: P.topk_centered(0), "k"),
])
def test_preset_arguments_are_checked_when_the_loss_is_built(build, name):
    """issue 46 item 10: a negative cap gave scale +1 (the loss ascended), a reversed band
    masked every token, a NaN or string beta was built, baseline='mean' failed with a
    tensor-minus-string error and baseline=nan with advice that never named it."""
    with pytest.raises((ValueError, TypeError), match=name):
        build()


def test_a_negative_cap_no_longer_ascends(off):
    """issue 46 item 10: the positive cap the check leaves is the documented TIS."""
    lg = expected_loss_gradient(off, P.sequence_tis(cap=2.0, baseline=0.3))
    assert lg.scale < 0
