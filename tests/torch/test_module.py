"""Any torch causal LM, exactly (fisher_ref.torch.module): user-defined modules with their
own architectures against a brute-force enumeration written here with plain torch
autograd, one backward pass per token score, and no fisher_ref code on the expected side."""

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from cases import all_responses  # noqa: E402
from fisher_ref.torch.module_model import causal_lm_task
from fisher_ref.torch.exact import exact_causal_lm
from fisher_ref.torch.module import from_module

pytestmark = pytest.mark.torch

RTOL = 1e-10  # float64 against float64: the same sums in another order


class GRULM(torch.nn.Module):
    """Embedding, a one-layer GRU, a linear head: (b, n) ids -> (b, n, V) logits."""

    def __init__(self, V, d=4, hidden=5):
        super().__init__()
        self.emb = torch.nn.Embedding(V + 1, d)
        self.gru = torch.nn.GRU(d, hidden, batch_first=True)
        self.head = torch.nn.Linear(hidden, V)

    def forward(self, ids):
        out, _ = self.gru(self.emb(ids))
        return self.head(out)


class CausalConvLM(torch.nn.Module):
    """A causal convolution over the last 2 positions, tanh, and a head tied to the
    embedding (V + 1 output columns; the BOS column is dropped by the adapter)."""

    def __init__(self, V, d=3):
        super().__init__()
        self.emb = torch.nn.Embedding(V + 1, d)
        self.conv = torch.nn.Conv1d(d, d, kernel_size=2)
        self.head = torch.nn.Linear(d, V + 1, bias=False)
        self.head.weight = self.emb.weight  # tied: one tensor, counted once in theta

    def forward(self, ids):  # (b, n) -> (b, n, V+1)
        x = self.emb(ids).transpose(1, 2)  # (b, d, n)
        x = torch.nn.functional.pad(x, (1, 0))  # left pad: position t sees t-1 and t
        return self.head(torch.tanh(self.conv(x)).transpose(1, 2))


def reward(prompt, response):
    return float(list(response).count(2)) + 0.25 * len(response) - 0.1 * len(prompt)


def brute_force(module, prompts, weights, T, V, eos, bos, baseline):
    """Every response by recursion; scores d log p(a|s) / d theta by torch.autograd.grad,
    theta = the module's named_parameters() (tied once) flattened row-major."""
    params = [p for _, p in module.named_parameters()]

    def log_probs(state):
        ids = torch.tensor([([bos] if bos is not None else []) + list(state)])
        out = module(ids)
        return torch.log_softmax(out[0, -1, :V], dim=-1)  # (V,)

    def score(lp, a):
        grads = torch.autograd.grad(lp[a], params, retain_graph=True)
        return torch.cat([g.reshape(-1) for g in grads]).detach()  # (P,)

    states, resp = [], []  # (reach, f); (prob, R, xi list, prompt, tokens)

    def visit(pi, state, depth, reach, xis):
        lp = log_probs(state)
        p = lp.exp().detach()
        sc = torch.stack([score(lp, a) for a in range(V)])  # (V, P)
        states.append((pi, tuple(state), depth, reach, p, (p[:, None] * sc ** 2).sum(0)))
        for a in range(V):
            ys = xis + [sc[a]]
            if depth + 1 == T or (eos and a == 0):
                resp.append((reach * p[a], reward(prompts[pi], tuple(state[len(prompts[pi]):])
                                                  + (a,)), ys))
            else:
                visit(pi, state + [a], depth + 1, reach * p[a], ys)

    for pi, pr in enumerate(prompts):
        visit(pi, list(pr), 0, torch.tensor(weights[pi], dtype=torch.float64), [])
    P = sum(p.numel() for p in params)
    w = torch.stack([r[0] for r in resp])  # (M,)
    R = torch.tensor([r[1] for r in resp], dtype=torch.float64)  # (M,)
    hist = torch.zeros(len(resp), T, P, dtype=torch.float64)  # (M, T, P)
    for m, (_, _, ys) in enumerate(resp):
        for t, x in enumerate(ys):
            hist[m, t] = x
    h = hist.sum(1)  # (M, P)
    F = w @ h ** 2
    ER = w @ R
    std = torch.sqrt(w @ (R - ER) ** 2)
    b = ER if baseline == "mean" else baseline
    out = {"sequence_fisher": F, "score_mean": w @ h,
           "token_fisher_sum": sum(r * f for _, _, _, r, _, f in states),
           "cross_terms": torch.einsum("m,mup,mtp->utp", w, hist, hist),
           "gradient": (w * (R - b)) @ h, "bound": std * F.sqrt(),
           "covariance": (w * (R - ER)) @ h, "reward_std": std, "expected_reward": ER}
    # the exact expected reward, differentiated by autograd on a fresh graph
    total = 0.0
    for pi, pr in enumerate(prompts):
        for y in all_responses(V, T, eos):
            logP = sum(log_probs(list(pr) + list(y[:t]))[y[t]] for t in range(len(y)))
            total = total + weights[pi] * torch.exp(logP) * reward(pr, y)
    out["gradient_autodiff"] = torch.cat([g.reshape(-1) for g in
                                          torch.autograd.grad(total, params)])
    order = sorted(range(len(states)), key=lambda i: (states[i][0], states[i][2], states[i][1]))
    out["states.token_fisher"] = torch.stack([states[i][5] for i in order])
    return {k: v.detach().numpy() if isinstance(v, torch.Tensor) else v for k, v in out.items()}


def rel(a, b):
    a, b = np.asarray(a, float), np.asarray(b, float)
    d = float(np.max(np.abs(a - b))) if a.size else 0.0
    s = float(np.max(np.abs(b))) if b.size else 0.0
    return d / s if s > 0 else d


CASES = {
    "gru_eos": dict(make=lambda: GRULM(4), V=4, eos=True, bos=4, prompts=[[1], [2, 3]],
                    weights=[0.4, 0.6], T=3, baseline="mean", vectorize=False),
    "causal_conv_tied": dict(make=lambda: CausalConvLM(3), V=3, eos=False, bos=3,
                             prompts=[[], [2]], weights=[0.5, 0.5], T=3, baseline=0.3,
                             vectorize=True),
    "gru_no_bos": dict(make=lambda: GRULM(3), V=3, eos=True, bos=None, prompts=[[1, 2]],
                       weights=[1.0], T=3, baseline=0.0, vectorize=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_user_module_matches_brute_force(case):
    c = CASES[case]
    torch.manual_seed(7)
    module = c["make"]().double().eval()
    want = brute_force(module, c["prompts"], c["weights"], c["T"], c["V"], c["eos"], c["bos"],
                       c["baseline"])
    out = exact_causal_lm(module, c["prompts"], c["T"], reward, vocab_size=c["V"],
                          eos=c["eos"], bos=c["bos"], prompt_weights=c["weights"],
                          baseline=c["baseline"], vectorize=c["vectorize"])
    pol = out["streams"]["policy"]
    got = {k: pol[k] for k in ("sequence_fisher", "token_fisher_sum", "cross_terms",
                               "gradient", "bound", "covariance", "reward_std",
                               "expected_reward")}
    got["gradient_autodiff"] = out["gradient_autodiff"]
    got["states.token_fisher"] = out["states"]["token_fisher"]
    bad = {k: rel(got[k], want[k]) for k in got if not rel(got[k], want[k]) <= RTOL}
    assert not bad, f"{case}: {bad}"
    # E[h] = 0 holds on the scale of the score's spread
    assert np.max(np.abs(pol["score_mean"])) <= RTOL * np.sqrt(np.max(want["sequence_fisher"]))


def test_theta_is_named_parameters_once_each():
    torch.manual_seed(0)
    m = CausalConvLM(3).double()
    ad = from_module(m, 3, eos=False, bos=3, positions=4)
    named = list(m.named_parameters())
    assert ad.names == [n for n, _ in named] and "head.weight" not in ad.names
    np.testing.assert_array_equal(ad.theta0, torch.cat([p.detach().reshape(-1)
                                                        for _, p in named]).numpy())
    assert ad.num_params == sum(p.numel() for _, p in named)


def test_the_callers_module_is_not_changed():
    m = GRULM(3)  # float32, train mode
    from_module(m, 3, eos=True, bos=3, positions=4, dtype="float64")
    assert m.training and next(m.parameters()).dtype == torch.float32


@pytest.mark.parametrize("kwargs, match", [
    (dict(vocab_size=0, eos=True, bos=3, positions=4), "vocab_size must be a positive"),
    (dict(vocab_size=3, eos=True, bos=-1, positions=4), "bos must be a non-negative"),
    (dict(vocab_size=3, eos=True, bos=3, positions=0), "positions must be a positive"),
])
def test_bad_adapter_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        from_module(GRULM(3), **kwargs)


def test_not_a_module_is_refused():
    with pytest.raises(TypeError, match="torch.nn.Module"):
        from_module(lambda ids: ids, 3, eos=True, bos=3, positions=4)


def test_empty_prompt_without_bos_is_refused():
    with pytest.raises(ValueError, match="empty prompt needs a bos"):
        causal_lm_task(GRULM(3), [[]], 2, reward, vocab_size=3, eos=True)


def test_too_few_output_columns_are_named():
    class Narrow(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 2)

        def forward(self, ids):
            return self.lin(ids[:, -1:].double())

    with pytest.raises(ValueError, match="fewer than vocab_size=3"):
        exact_causal_lm(Narrow(), [[1]], 2, reward, vocab_size=3, eos=True, bos=3)


class _Bigram(torch.nn.Module):
    def __init__(self, V=3):
        super().__init__()
        self.table = torch.nn.Embedding(V + 1, V)

    def forward(self, ids):  # (b, n) -> (b, V)
        return self.table(ids[:, -1])


@pytest.mark.parametrize("eos, words", [
    (0, "got the integer 0; if id 0 ends a response, write eos=True"),
    (2, "got the integer 2; a vocabulary whose EOS is id 2 must be reordered"),
    (99, "got the integer 99"), (-1, "got the integer -1"),
    (np.int64(2), "got the integer 2"), ("yes", "got str 'yes'"), (None, "got NoneType"),
    (1.0, "got float 1.0"),
], ids=["0", "2", "99", "minus_1", "np_int", "yes", "none", "float"])
def test_eos_must_be_a_bool_and_is_never_coerced(eos, words):
    """issue 46 item 8: ``eos`` was read as ``bool(eos)``: ``eos=0`` (a tokenizer's
    ``eos_token_id`` of 0) silently meant no EOS, and 2, 99, -1, "yes" meant "id 0 ends".
    Every entry point refuses anything but a bool, naming fisher_ref's convention."""
    kw = dict(vocab_size=3, eos=eos, bos=3)
    args = (_Bigram(), [[1]], 2, lambda p, r: r.count(2))
    for entry in (exact_causal_lm, causal_lm_task):
        with pytest.raises(ValueError, match=r"eos must be True or False \(whether id 0 ends a "
                           r"response: fisher_ref's EOS is always id 0\), " + words):
            entry(*args, **kw)
    with pytest.raises(ValueError, match="eos must be True or False"):
        from_module(_Bigram(), 3, eos, 3, positions=2)


def test_eos_numpy_bool_is_a_bool():
    """issue 46 item 8: numpy's bool is a bool (read as True and False are)."""
    args = (_Bigram(), [[1]], 2, lambda p, r: r.count(2))
    torch.manual_seed(0)
    module = _Bigram()
    for flag in (True, False):
        a = causal_lm_task(module, *args[1:], vocab_size=3, eos=flag, bos=3)
        b = causal_lm_task(module, *args[1:], vocab_size=3, eos=np.bool_(flag), bos=3)
        assert a.model.eos is b.model.eos is flag
