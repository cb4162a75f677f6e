"""Test cases as data: every shipped config plus hand-made tasks, and an
independent brute-force reference for each.

``CASES`` maps a readable id to a builder returning a :class:`fisher_ref.Task`.
:func:`brute_force` enumerates responses by plain recursion and takes every
score by autograd of ``log_softmax(model.logits(...))`` at each state — it never
calls the library's sensitivities, token Fisher or enumeration code, so it is a
second route to every quantity of docs/theory.md §2.9.
"""
from __future__ import annotations

import functools
import itertools

import autograd.numpy as anp
import numpy as np
from autograd import jacobian

from fisher_ref import (FunctionModel, FunctionReward, LogitsSampler, MLPModel, ModelSpec,
                        RoundedSampler, TabularModel, Task, TemperatureSampler, exact,
                        list_configs, load_config)
from fisher_ref.rewards import CountReward, LengthReward, MatchReward

RTOL = 1e-10  # exact float64 identities (docs/theory.md §9.3)

# Largest relative error seen per (identity, case); printed by conftest when
# FISHER_REF_ERROR_TABLE=1.
ERRORS: dict = {}


def with_options(kw):
    """Keywords of ``exact`` from ``kw``: the knobs that never change a number (``chunk=``,
    ``keep_states=``, ``budgets=``, ...) moved into its ``options``."""
    from fisher_ref.engine.plan import MOVED, EngineOptions
    kw = dict(kw)
    knobs = {k: kw.pop(k) for k in list(kw) if k in MOVED}
    return {**kw, "options": EngineOptions(**knobs)} if knobs else kw


def rel(a, b, scale=None):
    """max|a-b| / max(max|a|, max|b|) (or / ``scale``); 0 when both are 0."""
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    num = float(np.max(np.abs(a - b))) if a.size else 0.0
    den = scale if scale is not None else max(float(np.max(np.abs(a), initial=0.0)),
                                              float(np.max(np.abs(b), initial=0.0)))
    if num == 0.0:
        return 0.0
    return num / den if den > 0 else float("inf")


def all_responses(V, T, eos):
    """Every response by brute force: token tuples of length <= T, ending at the first EOS
    (id 0) or at length T."""
    out = []
    for n in range(1, T + 1):
        for y in itertools.product(range(V), repeat=n):
            if eos and 0 in y[:-1]:
                continue
            if n < T and not (eos and y[-1] == 0):
                continue
            out.append(y)
    return out


def record(identity, case, err):
    """Remember the largest error of ``identity`` and return it."""
    key = (identity, case)
    ERRORS[key] = max(ERRORS.get(key, 0.0), float(err))
    return err


# ---------------------------------------------------------------- hand-made models

def sine_model(V=4, k=2, d=2, H=5, eos=True, seed=11):
    """A custom architecture: ``z = sin(e @ A) @ B + c`` (not the shipped MLP)."""
    sizes = [(V + 1) * d, k * d * H, H * V, V]
    P = sum(sizes)

    def logits(theta, windows):
        o = np.cumsum([0] + sizes)
        E = anp.reshape(theta[o[0]:o[1]], (V + 1, d))
        A = anp.reshape(theta[o[1]:o[2]], (k * d, H))
        B = anp.reshape(theta[o[2]:o[3]], (H, V))
        e = anp.reshape(E[windows], (windows.shape[0], k * d))  # (B, k*d)
        return anp.dot(anp.sin(anp.dot(e, A)), B) + theta[o[3]:o[4]]  # (B, V)

    model = FunctionModel(logits, P, V, k, eos=eos, name="sine")
    theta = np.random.default_rng(seed).normal(size=P)
    return model, theta


def scaled_mlp(scale, **spec):
    """The MLP with its logits multiplied by ``scale`` (extreme logits for large scale)."""
    base = MLPModel(ModelSpec(**spec))
    model = FunctionModel(lambda th, w: scale * base.logits(th, w), base.num_params,
                          base.vocab_size, base.context, eos=base.eos, name="scaled_mlp")
    return model, base.init_params()


def masked_mlp(**spec):
    """The MLP plus a -inf mask: token ``(last + 1) % V`` is forbidden (never token 0)."""
    base = MLPModel(ModelSpec(**spec))
    V = base.vocab_size

    def logits(th, w):
        nxt = (w[:, -1] + 1) % (V + 1)  # (B,)
        mask = np.where((np.arange(V)[None, :] == nxt[:, None]) & (nxt[:, None] != 0),
                        -np.inf, 0.0)  # (B, V)
        return base.logits(th, w) + mask

    model = FunctionModel(logits, base.num_params, V, base.context, eos=base.eos,
                          name="masked_mlp")
    return model, base.init_params()


def eos_masked_mlp(**spec):
    """The MLP with EOS (token 0) forbidden (-inf) at every state whose last window token
    is even (BOS included when ``V`` is even): responses that end in a masked EOS have
    probability 0 and stop before ``max_len``."""
    base = MLPModel(ModelSpec(**spec))
    V = base.vocab_size

    def logits(th, w):
        mask = np.where((np.arange(V)[None, :] == 0) & (w[:, -1:] % 2 == 0), -np.inf, 0.0)
        return base.logits(th, w) + mask  # (B, V)

    model = FunctionModel(logits, base.num_params, V, base.context, eos=True,
                          name="eos_masked_mlp")
    return model, base.init_params()


def shifted(model, theta):
    """``model`` plus a theta- and window-dependent constant on every logit (a uniform
    shift): every quantity of docs/theory.md §2.9 must be unchanged."""
    def logits(th, w):
        z = model.logits(th, w)  # (B, V)
        shift = anp.sin(anp.sum(th[:3]) + w[:, -1:] * th[3])  # (B, 1)
        return z + shift
    return FunctionModel(logits, model.num_params, model.vocab_size, model.context,
                         eos=model.eos, name="shifted")


def _task(model, theta, prompts, max_len, reward, **kw):
    weights = kw.pop("prompt_weights", np.full(len(prompts), 1.0 / len(prompts)))
    return Task(model=model, theta=theta, prompts=prompts, prompt_weights=weights,
                max_len=max_len, reward=reward, **kw)


def _sampler_table(V, seed):
    rng = np.random.default_rng(seed)
    table = rng.normal(size=(V + 1, V))  # by last window token
    return LogitsSampler(lambda w: table[w[:, -1]])


def _case_sine():
    m, th = sine_model()
    return _task(m, th, [(1,), (2, 3)], 3, CountReward(2), baseline=0.25)


def _case_tabular_context2():
    m = TabularModel(3, context=2, eos=False, init_seed=5)
    return _task(m, m.init_params(), [(), (1,)], 2, MatchReward([2, 1], eos=False),
                 prompt_weights=[0.4, 0.6], baseline="mean")


def _case_extreme():
    m, th = scaled_mlp(300.0, vocab_size=4, context=2, embed_dim=2, hidden=4, init_seed=3)
    return _task(m, th, [(1,), (3,)], 3, CountReward(1))


def _case_masked():
    m, th = masked_mlp(vocab_size=5, context=2, embed_dim=2, hidden=4, init_seed=8)
    return _task(m, th, [(1,), (4, 2)], 3, LengthReward(), baseline="mean")


def _case_masked_eos():
    m, th = eos_masked_mlp(vocab_size=4, context=2, embed_dim=2, hidden=3, init_seed=12)
    return _task(m, th, [(1,), (2,)], 3, CountReward(3), baseline=0.5)


def _case_masked_rounded_sampler():
    m, th = masked_mlp(vocab_size=4, context=1, embed_dim=2, hidden=3, init_seed=9)
    return _task(m, th, [(2,)], 3, CountReward(3), sampler=RoundedSampler(0), baseline=1.0)


def _case_logits_sampler():
    m = MLPModel(ModelSpec(vocab_size=4, context=2, embed_dim=2, hidden=5, init_seed=6))
    return _task(m, m.init_params(), [(1, 2), ()], 3, CountReward(1),
                 sampler=_sampler_table(4, 2), baseline="mean")


def _case_custom_reward():
    m = MLPModel(ModelSpec(vocab_size=3, context=3, embed_dim=2, hidden=4, eos=False,
                           init_seed=4, init_scale=1.5))
    reward = FunctionReward(lambda p, r: float(len(set(r))) - 0.5 * sum(r) + 0.1 * len(p))
    return _task(m, m.init_params(), [(), (2,)], 3, reward, prompt_weights=[0.25, 0.75],
                 sampler=TemperatureSampler(0.6), baseline=-0.3)


def _case_zero_weight_prompt():
    m = MLPModel(ModelSpec(vocab_size=3, context=1, embed_dim=2, hidden=3, init_seed=2))
    return _task(m, m.init_params(), [(1,), (2,)], 3, CountReward(2),
                 prompt_weights=[1.0, 0.0])


def _case_shifted_default():
    t = load_config("default")
    return t.with_(model=shifted(t.model, t.theta), name="shifted_default")


CASES = {f"config:{n}": functools.partial(load_config, n) for n in list_configs()}
CASES.update({
    "sine_model": _case_sine,
    "tabular_context2": _case_tabular_context2,
    "extreme_logits": _case_extreme,
    "masked_logits": _case_masked,
    "masked_eos": _case_masked_eos,
    "masked_rounded_sampler": _case_masked_rounded_sampler,
    "logits_sampler": _case_logits_sampler,
    "custom_reward": _case_custom_reward,
    "zero_weight_prompt": _case_zero_weight_prompt,
    "shifted_default": _case_shifted_default,
})


@functools.lru_cache(maxsize=None)
def get_task(case):
    return CASES[case]()


def offpolicy_cases():
    return [c for c in CASES if get_task(c).sampler is not None]


@functools.lru_cache(maxsize=None)
def get_result(case):
    task = get_task(case)
    topk = tuple(range(1, task.model.vocab_size + 1)) if task.sampler is not None else ()
    return exact(task, topk=topk, progress=False)


# ---------------------------------------------------------------- brute force

@functools.lru_cache(maxsize=None)
def get_brute(case):
    return brute_force(get_task(case))


def reference_window(model, state):
    """The input the model reads at ``state`` (a token tuple), built here from the
    model's definition, not by the library: GPT-2 reads ``[BOS] + state`` padded on
    the right with -1 to ``n_positions``; a window model reads the last ``context``
    tokens, BOS on the left where the state is shorter."""
    state = [int(t) for t in state]
    if getattr(model, "name", "") == "gpt2":
        row = [model.bos] + state
        return row + [-1] * (model.context - len(row))
    k = model.context
    return [model.bos] * max(0, k - len(state)) + state[max(0, len(state) - k):]


def reference_windows(model, states):
    """:func:`reference_window` of each state: ``(len(states), k)`` int64."""
    return np.array([reference_window(model, s) for s in states], dtype=np.int64)


def reference_log_softmax(z):
    """Row-wise log-probabilities written here (autograd): ``z - m - log sum exp(z - m)``
    with ``m`` the row's largest finite logit held constant, so ``-inf`` logits stay
    ``-inf`` and their derivatives finite."""
    zv = np.asarray(getattr(z, "_value", z), dtype=float)
    while hasattr(zv, "_value"):
        zv = zv._value
    m = np.where(np.isfinite(zv), zv, -np.inf).max(axis=-1, keepdims=True)  # (B, 1)
    u = z - m
    return u - anp.log(anp.sum(anp.exp(u), axis=-1, keepdims=True))


def _softmax_np(z):
    return np.exp(np.asarray(reference_log_softmax(np.asarray(z, dtype=float))))


def brute_force(task):
    """Every response and state by recursion; scores by autograd of log p.

    Returns a dict: per state ``reach``, ``reach_mu``, ``p``, ``q`` ``(N, V)``,
    ``scores`` ``(N, V, P)`` (:math:`\\partial\\log p_a`), ``tokens`` (list),
    ``depth``; per response ``P``, ``Pmu``, ``R`` ``(M,)``, ``xi`` ``(M, T, P)``
    (policy score), ``xc`` ``(M, T, P)`` (centered at the sampler's mean),
    ``g`` ``(M, P)`` (:math:`\\sum_t f(s_t)` along the response, ``f = p S^2``),
    ``gc`` ``(M, P)`` (:math:`\\sum_t` of the sampler's centered second moment
    :math:`\\sum_a q_a (S_a - qS)^2`), ``prompt``, ``response``, ``length``.
    """
    model, theta, T, V = task.model, task.theta, task.max_len, task.model.vocab_size
    st = {k: [] for k in ("reach", "reach_mu", "p", "q", "scores", "tokens", "depth")}
    sq = {k: [] for k in ("P", "Pmu", "R", "xi", "xc", "g", "gc", "prompt", "response",
                          "length")}

    def visit(pi, tokens, depth, reach, reach_mu, xi, xc, g, gc):
        w = reference_windows(model, [tokens])  # (1, k)
        logp = lambda th: reference_log_softmax(model.logits(th, w))[0]  # (V,)
        p = np.exp(np.asarray(logp(theta), dtype=float))
        S = np.asarray(jacobian(logp)(theta))  # (V, P)
        q = p if task.sampler is None else _softmax_np(
            task.sampler.logits(model, theta, w))[0]
        for k, v in zip(st, (reach, reach_mu, p, q, S, tokens, depth)):
            st[k].append(v)
        b = q @ S  # (P,) E_mu[score | s]
        g2, gc2 = g + p @ S ** 2, gc + q @ (S - b) ** 2  # (P,) path sums through s
        for a in range(V):
            xi2, xc2 = xi.copy(), xc.copy()
            xi2[depth], xc2[depth] = S[a], S[a] - b
            r, rm = reach * p[a], reach_mu * q[a]
            nt = tokens + (a,)
            if depth + 1 == T or (model.eos and a == 0):
                resp = nt[len(task.prompts[pi]):]
                for k, v in zip(sq, (r, rm, float(task.reward(task.prompts[pi], resp)),
                                     xi2, xc2, g2, gc2, pi, resp, depth + 1)):
                    sq[k].append(v)
            else:
                visit(pi, nt, depth + 1, r, rm, xi2, xc2, g2, gc2)

    P = model.num_params
    for pi, pr in enumerate(task.prompts):
        w = task.prompt_weights[pi]
        visit(pi, tuple(pr), 0, w, w, np.zeros((T, P)), np.zeros((T, P)), np.zeros(P),
              np.zeros(P))
    out = {k: (np.array(v) if k not in ("tokens", "response") else v) for k, v in st.items()}
    out.update({k: (np.array(v) if k != "response" else v) for k, v in sq.items()})
    return out


def brute_values(case, stream):
    """Per-response values of a stream from the brute force: ``(w, h^2, g, rows)`` with
    ``w`` the probability under the drawing distribution, ``h^2`` and ``g`` the path sum
    of the token second moment ``(M, P)`` (``"policy"``: drawn from and centered at
    ``p``; ``"centered"``: at ``mu``), and ``rows`` mapping ``(prompt, response)`` to
    the row."""
    b = get_brute(case)
    h = (b["xi"] if stream == "policy" else b["xc"]).sum(axis=1)  # (M, P)
    g = b["g"] if stream == "policy" else b["gc"]  # (M, P)
    w = b["P"] if stream == "policy" else b["Pmu"]
    rows = {(int(pi), tuple(int(t) for t in y)): i
            for i, (pi, y) in enumerate(zip(b["prompt"], b["response"]))}
    return w, h * h, g, rows


def brute_ratio(w, h2, g):
    """``(Var(h^2) / Var(g), Var(g))`` under ``w``, each a sum over enumerated responses."""
    def var(x):
        return w @ (x - w @ x) ** 2
    with np.errstate(divide="ignore", invalid="ignore"):
        return var(h2) / var(g), var(g)


def rows_of_draws(draws, rows):
    """Row of each drawn response (``tokens (n, T)`` -1 padded, ``prompt (n,)``) in ``rows``."""
    return np.array([rows[(int(pi), tuple(int(t) for t in y if t >= 0))]
                     for pi, y in zip(draws["prompt"], draws["tokens"])])


def expected_reward_fn(task, brute):
    """``theta -> sum_y P_theta(y) R(y)`` over the responses of nonzero probability,
    written independently of the library (autograd-differentiable)."""
    model = task.model
    keep = np.flatnonzero(brute["P"] > 0)
    wins, toks, owner = [], [], []
    for n, m in enumerate(keep):
        prompt = task.prompts[brute["prompt"][m]]
        resp = brute["response"][m]
        for t, a in enumerate(resp):
            wins.append(reference_window(model, prompt + tuple(resp[:t])))
            toks.append(a)
            owner.append(n)
    W = np.array(wins, dtype=np.int64)  # (K, k)
    toks, owner = np.array(toks), np.array(owner)
    S = (owner[None, :] == np.arange(len(keep))[:, None]).astype(float)  # (M, K)
    wx = task.prompt_weights[brute["prompt"][keep]]  # (M,)
    R = brute["R"][keep]

    def f(th):
        lp = reference_log_softmax(model.logits(th, W))[np.arange(len(toks)), toks]  # (K,)
        return anp.sum(wx * anp.exp(anp.dot(S, lp)) * R)

    return f


