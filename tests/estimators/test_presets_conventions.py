"""The presets against plain re-implementations of the trainers' formulas, written from
their conventions (verl's ``compute_grpo_outcome_advantage`` and ``agg_loss``, TRL's
``dr_grpo``, OpenRLHF's KL estimators, GSPO, CISPO): value and gradient with respect to
``logp_all`` on random batches with padding, group sizes 1-3, at 1e-12."""
import pytest
import torch

from fisher_ref.estimators import presets as P

from .test_independent import Batch

EPS = 1e-6  # verl's GRPO epsilon


def random_batch(G, T=4, V=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, T + 1, (G,), generator=g)
    lengths[0] = T  # one full row, so the padded width is T
    mask = torch.arange(T)[None, :] < lengths[:, None]
    tokens = torch.where(mask, torch.randint(0, V, (G, T), generator=g), -1)

    def dist():
        return torch.log_softmax(torch.randn(G, T, V, generator=g, dtype=torch.float64), -1) \
            * mask[..., None]
    lpa = dist().requires_grad_(True)
    spa, rpa = dist(), dist()
    idx = tokens.clamp(min=0)[..., None]

    def at(a):
        return torch.where(mask, a.gather(-1, idx)[..., 0], 0.0)
    logp = at(lpa)
    R = torch.randint(0, 3, (G,), generator=g).double()
    return Batch(logp=logp, old_logp=logp.detach(), sampler_logp=at(spa), ref_logp=at(rpa),
                 mask=mask, rewards=R, lengths=lengths, tokens=tokens, prompt=0,
                 logp_all=lpa, sampler_logp_all=spa, ref_logp_all=rpa)


def verl_grpo_adv(R):
    if len(R) == 1:
        mean, std = torch.tensor(0.0).double(), torch.tensor(1.0).double()
    else:
        mean, std = torch.mean(R), torch.std(R)  # unbiased
    return (R - mean) / (std + EPS)


def verl_agg(loss_mat, m, mode):
    m = m.double()
    if mode == "token-mean":
        return (loss_mat * m).sum() / m.sum()
    if mode == "seq-mean-token-sum":
        return torch.mean(torch.sum(loss_mat * m, -1))
    if mode == "seq-mean-token-mean":
        return torch.mean(torch.sum(loss_mat * m, -1) / torch.sum(m, -1))
    if mode == "seq-mean-token-sum-norm":
        return torch.sum(loss_mat * m) / m.shape[-1]
    raise AssertionError(mode)


def ref_grpo(agg):
    def f(b):
        A = verl_grpo_adv(b.rewards)[:, None]
        return verl_agg(-A * b.logp, b.mask, agg)
    return f


def ref_dr_grpo(b):  # TRL loss_type="dr_grpo": sum / (B * max_completion_length)
    A = (b.rewards - b.rewards.mean())[:, None]
    return (-A * b.logp * b.mask).sum() / (b.logp.shape[0] * b.logp.shape[1])


def ref_rloo(b):
    G = len(b.rewards)
    A = b.rewards - (b.rewards.sum() - b.rewards) / (G - 1)
    return -(A * (b.logp * b.mask).sum(1)).mean()


def _lr(b):
    return ((b.logp - b.sampler_logp) * b.mask).detach()


def ref_token_tis(cap):
    def f(b):
        w = torch.clamp(torch.exp(_lr(b)), max=cap)
        return -(w * b.rewards[:, None] * b.logp * b.mask).sum(1).mean()
    return f


def ref_sequence_mis(lo, hi):
    def f(b):
        rho = torch.exp(_lr(b).sum(1))
        w = rho * ((rho >= lo) & (rho <= hi))
        return -(w * b.rewards * (b.logp * b.mask).sum(1)).mean()
    return f


def ref_prefix_is(b):
    w = torch.exp(torch.cumsum(_lr(b), 1))
    return -(w * b.rewards[:, None] * b.logp * b.mask).sum(1).mean()


def ref_gspo(el, eh):
    def f(b):
        A = verl_grpo_adv(b.rewards)
        m = b.mask.double()
        s = torch.exp(((b.logp - b.sampler_logp) * m).sum(-1) / m.sum(-1).clamp(min=1.0))
        return (-torch.min(s * A, torch.clamp(s, 1 - el, 1 + eh) * A)).mean()
    return f


def ref_cispo(eh):
    def f(b):
        A = verl_grpo_adv(b.rewards)[:, None]
        r = torch.clamp(torch.exp(b.logp - b.old_logp), max=1 + eh).detach()
        m = b.mask.double()
        return (-r * A * b.logp * m).sum() / m.sum()
    return f


def ref_kl(kind, beta):  # OpenRLHF compute_approx_kl, summed per sequence, mean over B
    def f(b):
        lr = b.logp - b.ref_logp
        k = {"k1": lr, "k2": lr ** 2 / 2, "k3": (-lr).exp() - 1 + lr}[kind]
        return beta * (k * b.mask).sum(1).mean()
    return f


def ref_kl_in_reward(beta):
    def f(b):
        kl = ((b.logp - b.ref_logp) * b.mask).sum(1).detach()
        return -(-beta * kl * (b.logp * b.mask).sum(1)).mean()
    return f


CASES = [
    ("grpo", P.grpo(), ref_grpo("seq-mean-token-mean"), (1, 2, 3)),
    ("grpo_token_mean", P.grpo("token-mean"), ref_grpo("token-mean"), (1, 2, 3)),
    ("grpo_sum_norm", P.grpo("seq-mean-token-sum-norm"), ref_grpo("seq-mean-token-sum-norm"),
     (1, 2, 3)),
    ("dapo", P.dapo(), ref_grpo("token-mean"), (2, 3)),
    ("dr_grpo", P.dr_grpo(), ref_dr_grpo, (1, 2, 3)),
    ("rloo", P.rloo(), ref_rloo, (2, 3)),
    ("token_tis", P.token_tis(1.3), ref_token_tis(1.3), (1, 3)),
    ("sequence_mis", P.sequence_mis((0.2, 3.0)), ref_sequence_mis(0.2, 3.0), (1, 3)),
    ("prefix_is", P.prefix_is(), ref_prefix_is, (1, 3)),
    ("gspo", P.gspo(0.3, 0.4), ref_gspo(0.3, 0.4), (2, 3)),
    ("cispo", P.cispo(0.2), ref_cispo(0.2), (1, 2, 3)),
    ("k1", P.kl_loss("k1", 0.7), ref_kl("k1", 0.7), (1, 2)),
    ("k2", P.kl_loss("k2", 0.7), ref_kl("k2", 0.7), (1, 2)),
    ("k3", P.kl_loss("k3", 0.7), ref_kl("k3", 0.7), (1, 2)),
    ("k1_in_reward", P.kl_in_reward(0.7), ref_kl_in_reward(0.7), (1, 2)),
]


@pytest.mark.parametrize("name,preset,ref,G",
                         [(n, p, r, G) for n, p, r, gs in CASES for G in gs])
@pytest.mark.parametrize("seed", [0, 1])
def test_preset_is_the_trainers_formula(name, preset, ref, G, seed):
    b = random_batch(G, seed=seed)
    a, c = preset(b), ref(b)
    (ga,) = torch.autograd.grad(a, b.logp_all, retain_graph=True)
    (gc,) = torch.autograd.grad(c, b.logp_all, retain_graph=True)
    assert float(a.detach()) == pytest.approx(float(c.detach()), rel=1e-12, abs=1e-14), name
    scale = max(float(gc.abs().max()), 1e-300)
    assert float((ga - gc).abs().max()) <= 1e-12 * scale, name
