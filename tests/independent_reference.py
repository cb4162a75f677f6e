r"""An independent implementation of the golden files, written from the documents alone
(``docs/golden_format.md`` and ``docs/theory.md`` §2–§6).

It imports nothing from fisher_ref: its own MLP forward pass and sensitivities
(backpropagation of one logit at a time, by hand), its own GPT-2 forward pass
written from the documented equations and layout (sensitivities by HIPS
autograd's Jacobian of that pass), its own recursive enumeration of every
response, and every quantity as a sum over responses or states.
``tests/test_golden.py`` holds every shipped golden file against it, so the
golden files are checked by a second route, not only by the code that wrote them.

Entry point: :func:`reference(meta, theta)` returns a dict with the keys of a
golden file (``docs/golden_format.md``).

Kept, beside the readable judge in the package (``fisher_ref/reference.py``), on purpose.
The judge is what a reader follows to see how the numbers are made, and it shares the
package's models, sensitivities, rewards, samplers and formulas, so a mistake there would
reach the fast engine and the judge alike and they would agree on it. This file shares no
code with the package: it is the one route to the golden files that such a mistake cannot
reach. It stays under ``tests/`` and stays independent: it must never import fisher_ref.
"""
from __future__ import annotations

import autograd.numpy as anp
import numpy as np
from autograd import jacobian


# --- the models (docs/theory.md §4) -----------------------------------------------------

def mlp_blocks(model, theta):
    """Split theta into E (V+1, d), W1 (k d, H), b1 (H,), W2 (H, V), b2 (V,)."""
    V, k, d, H = model["vocab_size"], model["context"], model["embed_dim"], model["hidden"]
    shapes = [(V + 1, d), (k * d, H), (H,), (H, V), (V,)]
    out, i = [], 0
    for s in shapes:
        n = int(np.prod(s))
        out.append(theta[i:i + n].reshape(s))
        i += n
    assert i == theta.size, "theta length does not match the MLP spec"
    return out


def mlp_logits_and_jacobian(model, theta, window):
    """Logits ``z (V,)`` and ``J (P, V)``, ``J[i, a] = dz_a/dtheta_i``, for one window."""
    E, W1, b1, W2, b2 = mlp_blocks(model, theta)
    V, d = model["vocab_size"], model["embed_dim"]
    e = np.concatenate([E[c] for c in window])  # (k d,)
    hid = np.tanh(e @ W1 + b1)  # (H,)
    z = hid @ W2 + b2  # (V,)
    J = np.zeros((theta.size, V))
    for a in range(V):  # backpropagate the single logit z_a
        gE, gW1 = np.zeros_like(E), np.zeros_like(W1)
        gW2, gb2 = np.zeros_like(W2), np.zeros_like(b2)
        gb2[a] = 1.0
        gW2[:, a] = hid
        dpre = (1.0 - hid * hid) * W2[:, a]  # (H,) through tanh
        gb1 = dpre
        gW1 += np.outer(e, dpre)
        de = W1 @ dpre  # (k d,)
        for pos, c in enumerate(window):
            gE[c] += de[pos * d:(pos + 1) * d]
        J[:, a] = np.concatenate([g.ravel() for g in (gE, gW1, gb1, gW2, gb2)])
    return z, J


def tabular_logits_and_jacobian(model, theta, window):
    """Tabular model: theta is a ((V+1)^k, V) table, one row per window."""
    V = model["vocab_size"]
    row = 0
    for c in window:  # base V+1 digits, oldest first
        row = row * (V + 1) + c
    z = theta.reshape(-1, V)[row].copy()
    J = np.zeros((theta.size, V))
    J[row * V + np.arange(V), np.arange(V)] = 1.0
    return z, J


def gpt2_blocks(model, theta):
    """Named blocks of a GPT-2 theta, in the documented order and shapes."""
    V, d, L, n = (model[k] for k in ("vocab_size", "embed_dim", "n_layer", "n_positions"))
    shapes = [("wte", (V + 1, d)), ("wpe", (n, d))]
    for l in range(L):
        shapes += [(f"{l}.ln_1.w", (d,)), (f"{l}.ln_1.b", (d,)), (f"{l}.attn.w", (d, 3 * d)),
                   (f"{l}.attn.b", (3 * d,)), (f"{l}.proj.w", (d, d)), (f"{l}.proj.b", (d,)),
                   (f"{l}.ln_2.w", (d,)), (f"{l}.ln_2.b", (d,)), (f"{l}.fc.w", (d, 4 * d)),
                   (f"{l}.fc.b", (4 * d,)), (f"{l}.fc2.w", (4 * d, d)), (f"{l}.fc2.b", (d,))]
    shapes += [("ln_f.w", (d,)), ("ln_f.b", (d,))]
    out, i = {}, 0
    for name, shape in shapes:
        size = int(np.prod(shape))
        out[name] = anp.reshape(theta[i:i + size], shape)
        i += size
    assert i == theta.size, "theta length does not match the GPT-2 spec"
    return out


def _layer_norm(x, w, b):
    mu = anp.mean(x, axis=-1, keepdims=True)
    var = anp.mean((x - mu) ** 2, axis=-1, keepdims=True)  # biased variance
    return (x - mu) / anp.sqrt(var + 1e-5) * w + b


def _gelu(x):
    return 0.5 * x * (1.0 + anp.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


def gpt2_logits(model, theta, state):
    """Logits ``(V,)`` of one state: the documented pre-LN GPT-2 on ``[BOS] + state``."""
    p = gpt2_blocks(model, theta)
    V, d, H = model["vocab_size"], model["embed_dim"], model["n_head"]
    u = [V] + list(state)
    n, dh = len(u), d // H
    X = p["wte"][np.array(u)] + p["wpe"][:n]  # (n, d)
    mask = np.where(np.tril(np.ones((n, n))) > 0, 0.0, -np.inf)  # key r <= query q
    for l in range(model["n_layer"]):
        qkv = anp.dot(_layer_norm(X, p[f"{l}.ln_1.w"], p[f"{l}.ln_1.b"]), p[f"{l}.attn.w"]) \
            + p[f"{l}.attn.b"]  # (n, 3d)
        heads = []
        for h in range(H):
            q = qkv[:, h * dh:(h + 1) * dh]
            k = qkv[:, d + h * dh:d + (h + 1) * dh]
            v = qkv[:, 2 * d + h * dh:2 * d + (h + 1) * dh]
            e = anp.exp(anp.dot(q, k.T) / np.sqrt(dh) + mask)  # (n, n), small scores here
            heads.append(anp.dot(e / anp.sum(e, axis=1, keepdims=True), v))
        X = X + anp.dot(anp.concatenate(heads, axis=1), p[f"{l}.proj.w"]) + p[f"{l}.proj.b"]
        hid = _gelu(anp.dot(_layer_norm(X, p[f"{l}.ln_2.w"], p[f"{l}.ln_2.b"]), p[f"{l}.fc.w"])
                    + p[f"{l}.fc.b"])
        X = X + anp.dot(hid, p[f"{l}.fc2.w"]) + p[f"{l}.fc2.b"]
    last = _layer_norm(X[n - 1], p["ln_f.w"], p["ln_f.b"])  # (d,)
    return anp.dot(p["wte"], last)[:V]  # tied head, BOS column dropped


def gpt2_logits_and_jacobian(model, theta, state):
    z = gpt2_logits(model, theta, state)
    J = jacobian(lambda th: gpt2_logits(model, th, state))(theta)  # (V, P)
    return np.asarray(z), np.ascontiguousarray(J.T)


def logits_and_jacobian(model, theta, state):
    """Logits ``(V,)`` and ``J (P, V)`` of the state (prompt + generated tokens)."""
    if model["arch"] == "gpt2":
        return gpt2_logits_and_jacobian(model, theta, state)
    k, bos = model["context"], model["vocab_size"]
    window = ([bos] * k + list(state))[-k:]
    fn = {"mlp_window": mlp_logits_and_jacobian,
          "tabular": tabular_logits_and_jacobian}[model["arch"]]
    return fn(model, theta, window)


def logits_only(model, theta, state):
    if model["arch"] == "gpt2":
        return np.asarray(gpt2_logits(model, theta, state))
    return logits_and_jacobian(model, theta, state)[0]


def softmax(z):
    z = z - np.max(z)
    w = np.exp(z)
    return w / w.sum()


# --- rewards, samplers -------------------------------------------------------------------

def reward_of(spec, eos, response):
    body = list(response)
    if eos and body and body[-1] == 0:
        stripped = body[:-1]
    else:
        stripped = body
    if spec["name"] == "count":
        return float(body.count(spec["token"]))
    if spec["name"] == "match":
        return float(stripped == list(spec["target"]))
    if spec["name"] == "length":
        return float(len(stripped))
    raise ValueError(f"the reference has no reward {spec['name']!r}")


def sampler_setup(sampler, theta):
    """(theta the sampler runs with, function z -> sampler logits)."""
    if sampler is None:
        return None, None
    kind = sampler["kind"]
    if kind == "temperature":
        return theta, lambda z: z / sampler["temperature"]
    if kind == "perturbed":
        eps = np.random.default_rng(sampler["seed"]).standard_normal(theta.size)
        return theta + sampler["scale"] * eps, lambda z: z
    if kind == "rounded":
        return theta, lambda z: np.round(z, sampler["decimals"])
    raise ValueError(f"the reference has no sampler {kind!r}")


# --- enumeration -------------------------------------------------------------------------

def enumerate_task(meta, theta):
    """Every state and every response, by recursion over the prefix tree."""
    model, task = meta["model"], meta["task"]
    V, T, eos = model["vocab_size"], task["max_len"], model["eos"]
    theta_mu, mu_logits = sampler_setup(task["sampler"], theta)
    states, responses = [], []

    def visit(x, prompt, gen, reach_p, reach_q, steps):
        z, J = logits_and_jacobian(model, theta, list(prompt) + gen)
        p = softmax(z)
        if mu_logits is None:
            q = p
        else:
            zq = z if theta_mu is theta else logits_only(model, theta_mu, list(prompt) + gen)
            q = softmax(mu_logits(zq))
        st = {"prompt": x, "tokens": list(prompt) + gen, "depth": len(gen), "reach": reach_p,
              "sampler_reach": reach_q, "z": z, "p": p, "q": q, "J": J}
        states.append(st)
        for a in range(V):
            path = steps + [(st, a)]
            if len(gen) + 1 == T or (eos and a == 0):
                responses.append({"prompt": x, "tokens": gen + [a], "prob": reach_p * p[a],
                                  "sampler_prob": reach_q * q[a], "steps": path})
            else:
                visit(x, prompt, gen + [a], reach_p * p[a], reach_q * q[a], path)

    for x, (prompt, w) in enumerate(zip(task["prompts"], task["prompt_weights"])):
        visit(x, prompt, [], w, w, [])
    states.sort(key=lambda s: (s["prompt"], s["depth"], tuple(s["tokens"])))
    responses.sort(key=lambda r: (r["prompt"], tuple(r["tokens"] + [-1] * (T - len(r["tokens"])))))
    return states, responses, theta_mu


# --- §1 quantities -----------------------------------------------------------------------

def fisher(probs, J):
    """f_i = sum_a p_a (J_ia - sum_b p_b J_ib)^2."""
    c = J - (J @ probs)[:, None]
    return (c * c) @ probs


def covariance(probs, J):
    """(P, P) covariance of the sensitivity vectors under ``probs``."""
    c = J - (J @ probs)[:, None]  # (P, V)
    return (c * probs) @ c.T


def scores(resp, T, center):
    """(T, P) token scores xi_t = J[:, y_t] - center(state); 0 after the response ends."""
    P = resp["steps"][0][0]["J"].shape[0]
    xi = np.zeros((T, P))
    for t, (st, a) in enumerate(resp["steps"]):
        xi[t] = st["J"][:, a] - st["J"] @ st[center]
    return xi


def stream(responses, weight, T, center, baseline, rewards):
    """Response-level expectations under weights ``weight`` with scores centered at ``center``."""
    w = np.array([r[weight] for r in responses])  # (M,)
    xis = np.stack([scores(r, T, center) for r in responses])  # (M, T, P)
    h = xis.sum(axis=1)  # (M, P)
    ER = w @ rewards / w.sum()
    b = ER if baseline == "mean" else float(baseline)
    A = rewards - b
    std_A = np.sqrt(max(w @ (rewards - ER) ** 2, 0.0))
    F = w @ (h * h)
    cov = w @ ((rewards - ER)[:, None] * h)
    bound = std_A * np.sqrt(F)
    safe = np.where(bound > 0, bound, 1.0)
    return {"sequence_fisher": F, "score_mean": w @ h, "gradient": w @ (A[:, None] * h),
            "covariance": cov, "bound": bound,
            "correlation": np.where(bound > 0, np.abs(cov) / safe, 0.0),
            "cross_terms": np.einsum("m,mup,mtp->utp", w, xis, xis),
            "expected_reward": ER, "reward_std": std_A, "baseline": b, "A": A, "h": h}


def reference(meta, theta):
    """Every golden-file array, recomputed from ``meta`` and ``theta`` alone."""
    model, task = meta["model"], meta["task"]
    T, eos = task["max_len"], model["eos"]
    states, responses, theta_mu = enumerate_task(meta, theta)
    L = max(len(p) for p in task["prompts"]) + T - 1
    out = {"theta": theta, "prompt_weights": np.array(task["prompt_weights"], dtype=float)}
    pad = lambda tk, n: tk + [-1] * (n - len(tk))  # noqa: E731
    out["state_tokens"] = np.array([pad(s["tokens"], L) for s in states], dtype=np.int64)
    out["state_prompt"] = np.array([s["prompt"] for s in states], dtype=np.int64)
    out["state_depth"] = np.array([s["depth"] for s in states], dtype=np.int64)
    out["state_reach"] = np.array([s["reach"] for s in states])
    out["state_logits"] = np.stack([s["z"] for s in states])
    out["state_probs"] = np.stack([s["p"] for s in states])
    out["state_token_fisher"] = np.stack([fisher(s["p"], s["J"]) for s in states])
    V = model["vocab_size"]
    out["state_uniform_token_fisher"] = np.stack(
        [fisher(np.full(V, 1.0 / V), s["J"]) for s in states])
    out["seq_tokens"] = np.array([pad(r["tokens"], T) for r in responses], dtype=np.int64)
    out["seq_prompt"] = np.array([r["prompt"] for r in responses], dtype=np.int64)
    out["seq_prob"] = np.array([r["prob"] for r in responses])
    R = np.array([reward_of(task["reward"], eos, r["tokens"]) for r in responses])
    out["seq_reward"] = R
    on = stream(responses, "prob", T, "p", task["baseline"], R)
    out["seq_advantage"] = on["A"]
    out["seq_score"] = on["h"]
    if meta["matrices"]:
        w = out["seq_prob"]
        out["sequence_fisher_matrix"] = (on["h"] * w[:, None]).T @ on["h"]  # sum_y P h h^T
        out["token_fisher_matrix_sum"] = sum(s["reach"] * covariance(s["p"], s["J"])
                                             for s in states)
    out["token_fisher_sum"] = out["state_reach"] @ out["state_token_fisher"]
    # d E[R] / d theta = sum_y R(y) dP(y) = sum_y P(y) R(y) h(y)  (score-function identity)
    out["gradient_autodiff"] = (out["seq_prob"] * R) @ on["h"]
    for key in ("sequence_fisher", "score_mean", "gradient", "covariance", "bound",
                "correlation", "cross_terms", "expected_reward", "reward_std", "baseline"):
        out[key] = np.asarray(on[key])
    if task["sampler"] is None:
        return out
    out["sampler_theta"] = theta_mu
    out["sampler_reach"] = np.array([s["sampler_reach"] for s in states])
    out["sampler_probs"] = np.stack([s["q"] for s in states])
    out["sampler_token_fisher"] = np.stack([fisher(s["q"], s["J"]) for s in states])
    out["sampler_raw_score_mean"] = np.stack([s["J"] @ (s["q"] - s["p"]) for s in states])
    out["seq_sampler_prob"] = np.array([r["sampler_prob"] for r in responses])
    cen = stream(responses, "sampler_prob", T, "q", task["baseline"], R)
    raw = stream(responses, "sampler_prob", T, "p", task["baseline"], R)
    out["seq_sampler_advantage"] = cen["A"]
    out["offpolicy_token_fisher_sum"] = out["sampler_reach"] @ out["sampler_token_fisher"]
    for key in ("sequence_fisher", "score_mean", "gradient", "covariance", "bound",
                "correlation", "cross_terms", "expected_reward", "reward_std", "baseline"):
        out["offpolicy_" + key] = np.asarray(cen[key])
    out["offpolicy_gradient_uncentered"] = raw["gradient"]
    out["offpolicy_score_mean_uncentered"] = raw["score_mean"]
    out["offpolicy_sequence_fisher_uncentered"] = raw["sequence_fisher"]
    # E_mu[(P/mu) A h] = sum_y P(y) A(y) h(y), A with the sampler's baseline
    out["offpolicy_importance_gradient"] = (out["seq_prob"] * raw["A"]) @ on["h"]
    return out


def init_theta(model, num_params):
    """theta = init_scale * N(0, 1) draws from numpy.random.default_rng(init_seed)."""
    return model["init_scale"] * np.random.default_rng(model["init_seed"]).standard_normal(
        num_params)
