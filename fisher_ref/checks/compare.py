r"""``python -m fisher_ref compare``: the torch engine against fisher_ref's exact engine.

For each dtype the torch engine (:func:`fisher_ref.torch.exact.torch_exact`, with the
adapter of the task's model: the MLP, the tabular model, the GPT-2 through
``transformers``, or a user's torch module) computes every exact quantity on the device,
and each is held against fisher_ref's float64 numpy engine. A row passes when its
relative error, on the scale of the quantity (:mod:`fisher_ref.checks.tolerances`: derived
ratios such as the correlation are judged by error propagation from their parts), is at
most its dtype's tolerance (1e-10 in float64, 2e-5 in float32, 0.1 in bfloat16).

A Monte Carlo row per quantity (``E[h^2]`` and the token sum) draws ``--mc``
responses with the torch sampler (float64, ``torch.Generator`` seeded with
``--seed``) and passes when every parameter's :math:`|\hat m - m|` is below
the Bernstein half-width :func:`bernstein_threshold` (exact variance from
fisher_ref; range ``b`` from the float64 torch enumeration) for a
false-failure rate of :data:`MC_ALPHA` per row (Bonferroni over parameters),
floored at the rounding level of the quantity (a parameter whose per-response
value is constant, such as the BOS embedding's token sum, has a variance and
range that are rounding noise: it is compared to rounding,
:func:`fisher_ref.monte_carlo.ztests.bernstein_ratio`). The ``statistic`` is the largest
:math:`|\hat m - m| / t` (pass: <= 1); the JSON row also holds ``max_abs_z``
(:math:`|\hat m - m|/\sqrt{\mathrm{Var}/n}`, 0 where the variance is rounding noise).
"""
from __future__ import annotations

import contextlib

import numpy as np

from fisher_ref.checks.tolerances import (TOL_BFLOAT16, TOL_FLOAT32, TOL_FLOAT64, TOLERANCES,
                           gradient_judge_scale, rel_error, scale)
from fisher_ref.limits import check_seed
from fisher_ref.results import require_all_quantities

__all__ = ["TOLERANCES", "TOL_FLOAT64", "TOL_FLOAT32", "TOL_BFLOAT16", "MC_ALPHA",
           "DEFAULT_MC", "bernstein_threshold", "compare", "exact_state_sensitivities",
           "sensitivity_errors", "check_compare_cost", "rel_error",
           "format_table", "check_dtypes", "DEFAULT_DTYPES"]

MC_ALPHA = 1e-6  # false-failure rate of one Monte Carlo row (Bonferroni over parameters)
_SENS_BYTES = 2 ** 28  # sensitivities held at once
DEFAULT_MC = 4000
DEFAULT_DTYPES = ("float64", "float32")


@contextlib.contextmanager
def highest_matmul_precision():
    """float32 matmuls in full precision (no TF32) inside the block; restored after."""
    import torch
    old = (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32,
           torch.backends.cudnn.allow_tf32)
    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(old[0])
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = old[1:]


def exact_state_sensitivities(task, ref):
    """The distinct windows ``W (U, k)`` of the kept states (``U <= N``: states that read
    the same window have the same sensitivities), their exact sensitivities ``J (U, P, V)``
    when they fit in ``_SENS_BYTES`` (else ``None``: :func:`sensitivity_errors` forms
    them block by block) and their largest size per parameter ``(P,)``: computed once,
    for every dtype."""
    from fisher_ref.models.sensitivities import sensitivities
    st, m = ref.states, task.model
    lengths = (st["tokens"] >= 0).sum(axis=1)  # (N,) prompt plus generated tokens
    W = np.unique(m.windows(st["tokens"], lengths), axis=0)  # (U, k)
    P, V = m.num_params, m.vocab_size
    chunk = max(1, _SENS_BYTES // (8 * P * V))
    blocks = [sensitivities(m, task.theta, W[a:a + chunk]) for a in range(0, len(W), chunk)]
    jmax = np.max([np.abs(J).max(axis=(0, 2)) for J in blocks], axis=0) if blocks \
        else np.zeros(P)  # (P,)
    keep = len(W) <= chunk
    return W, (blocks[0] if blocks else np.zeros((0, P, V))) if keep else None, jmax


def sensitivity_errors(task, tm, exact_sens):
    """``(max|J_torch - J|, that over max|J|)`` over the distinct windows, in blocks of at
    most ``_SENS_BYTES``: the ``sensitivities`` row without an ``(N, P, V)`` array."""
    import torch
    from fisher_ref.models.sensitivities import sensitivities
    W, J_kept, _ = exact_sens
    m = task.model
    chunk = max(1, _SENS_BYTES // (8 * m.num_params * m.vocab_size))
    err = top = 0.0
    for a in range(0, len(W), chunk):
        w = W[a:a + chunk]
        J = J_kept[a:a + chunk] if J_kept is not None else sensitivities(m, task.theta, w)
        with torch.no_grad():
            Jt = tm.sensitivities(tm.theta(task.theta), torch.as_tensor(w, device=tm.device))
        d = np.abs(Jt.to("cpu", torch.float64).numpy() - J)  # (B, P, V)
        err = max(err, float(np.max(d, initial=0.0)))
        top = max(top, float(np.max(np.abs(J), initial=0.0)))
    if not np.isfinite(err):
        return err, float("inf")
    return err, err / top if top > 0 else err


def check_compare_cost(task, dtypes, max_bytes=None):
    """Refuse (``EnumerationTooLarge``, before anything runs) a comparison whose per-state
    and per-response arrays, kept by the exact engine and by the torch engine for each
    dtype, would not fit in ``max_bytes``; the message names the prompts, states and
    responses (each prompt adds its whole subtree)."""
    from fisher_ref.engine.plan import DEFAULT_MAX_BYTES, EnumerationTooLarge, estimate_cost
    from fisher_ref.limits import check_limit, readable
    max_bytes = check_limit(DEFAULT_MAX_BYTES if max_bytes is None else max_bytes, "max_bytes")
    kept = estimate_cost(task, keep_states=True, keep_sequences=True)
    bare = estimate_cost(task)
    need = bare.bytes + (kept.bytes - bare.bytes) * (1 + len(dtypes)) + _SENS_BYTES
    if need > max_bytes:
        raise EnumerationTooLarge(
            f"compare refused: it keeps every state's and response's arrays once per engine "
            f"and dtype, about {need / 2 ** 30:,.2f} GiB for {len(task.prompts):,} prompts, "
            f"{readable(kept.n_states)} states and {readable(kept.n_responses)} responses "
            f"(P={readable(kept.num_params)}), more than {max_bytes / 2 ** 30:,.2f} GiB; "
            "compare fewer prompts (the identities do not depend on their number) or fewer dtypes")
    return need


def _pairs(task, ref, out, tm, exact_sens):
    """(name, torch array, exact array, scale) for every compared quantity;
    ``exact_sens`` is :func:`exact_state_sensitivities`."""
    from fisher_ref.torch.exact import STREAM_QUANTITIES
    st, jmax = ref.states, exact_sens[2]
    for key in ("reach", "probs", "token_fisher", "uniform"):
        yield f"states.{key}", out["states"][key], st[key], None
    yield "sequences.prob", out["sequences"]["prob"], ref.sequences["prob"], None
    if task.sampler is not None:
        yield "sequences.sampler_prob", out["sequences"]["sampler_prob"], \
            ref.sequences["sampler_prob"], None
    for sname, d in out["streams"].items():
        exact_s = ref.streams[sname]
        prefix = "" if sname == "policy" else sname + "."
        for q in STREAM_QUANTITIES:
            yield prefix + q, d[q], getattr(exact_s, q), scale(q, exact_s, jmax, task.max_len)
    yield "gradient_autodiff", out["gradient_autodiff"], ref.gradient_autodiff, \
        gradient_judge_scale(ref.gradient_autodiff, ref.streams["policy"])


def _row(quantity, dtype, device, abs_err, rel_err, test, stat, tol):
    return {"quantity": quantity, "dtype": dtype, "device": str(device),
            "max_abs_error": abs_err, "max_rel_error": rel_err, "test": test,
            "statistic": stat, "tolerance": tol, "passed": bool(stat <= tol)}


def bernstein_threshold(var, b, n, alpha=MC_ALPHA, m=1):
    r"""Half-width ``t`` with :math:`P(|\bar X - \mu| \ge t) \le \alpha/m` for each of ``m`` means.

    :func:`fisher_ref.monte_carlo.ztests.bernstein_halfwidth` (Bernstein's inequality, variance
    ``var``, :math:`|X - \mu| \le b`) at :math:`\delta = \alpha/m`:
    :math:`t = (2bL/3 + \sqrt{(2bL/3)^2 + 8 n \sigma^2 L}) / (2n)`, :math:`L = \ln(2m/\alpha)`.

    Unlike a normal z-threshold it needs no central limit theorem, which fails in
    the far tail for the skewed :math:`h^2` (measured on ``default``, n = 4000:
    max|z| over parameters reached 5.1 in 40 seeds and 6.3 on a GPU, past the
    Bonferroni-normal 5.8).

    Example:
        >>> round(float(bernstein_threshold(1.0, 0.0, 100, alpha=2 * np.exp(-2.0))), 6)
        0.2
    """
    from fisher_ref.monte_carlo.ztests import bernstein_halfwidth
    return bernstein_halfwidth(n, var, b, alpha / m)


def _mc_rows(task, ref, device, n, seed, ranges):
    """Bernstein rows of the torch Monte Carlo; ``ranges`` from a float64 enumeration."""
    import torch
    from fisher_ref.monte_carlo.ztests import ZERO_VAR_RTOL, bernstein_ratio
    from fisher_ref.torch.monte_carlo import torch_monte_carlo
    gen = torch.Generator(device=device).manual_seed(int(seed))
    est = torch_monte_carlo(task, n, gen, device=device, dtype="float64")
    pol = ref.streams["policy"]
    rows = []
    for q, var_key in (("sequence_fisher", "h2"), ("token_fisher_sum", "token_sum")):
        mean, _ = est[q]
        exact, var = getattr(pol, q), pol.variances[var_key]  # (P,), (P,)
        diff = mean - exact  # (P,)
        # |diff| / max(Bernstein half-width, rounding level): a constant's noise-sized
        # variance and range are judged to rounding (mc_stats.bernstein_ratio)
        stat = bernstein_ratio(diff, n, var, ranges[q], MC_ALPHA / exact.size, exact)  # (P,)
        live = var > ZERO_VAR_RTOL * (np.abs(var) + exact ** 2)  # (P,) not rounding noise
        z = np.abs(diff) / np.sqrt(np.where(live, var, 1.0) / n) * live  # (P,)
        abs_err, rel_err = rel_error(mean, exact)
        row = _row(f"mc.{q} (n={n}, seed={seed})", "float64", device, abs_err, rel_err,
                   "bern", float(np.max(stat)), 1.0)
        row["max_abs_z"] = float(np.max(z))
        rows.append(row)
    return rows


def check_dtypes(dtypes):
    """The dtype names as a list, refusing an empty or unknown one (``ValueError``)."""
    dtypes = list(dtypes)
    if not dtypes:
        raise ValueError(f"no dtype to compare: give one or more of {', '.join(TOLERANCES)} "
                         "(--dtype float64,float32)")
    for d in dtypes:
        if d not in TOLERANCES:
            raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(TOLERANCES)}")
    return dtypes


def compare(task, device="cpu", dtypes=DEFAULT_DTYPES, mc=DEFAULT_MC, seed=0, ref=None):
    """Rows of errors of the torch engine against fisher_ref, per quantity and dtype.

    Args:
        task: a :class:`fisher_ref.tasks.Task` whose model has a torch adapter (MLP,
            tabular, GPT-2, a torch module from :func:`fisher_ref.torch.causal_lm_task`).
        device: ``"cpu"`` or ``"cuda"``.
        dtypes: names from ``float64``, ``float32``, ``bfloat16`` (at least one).
        mc: Monte Carlo draws for the Bernstein rows (0: none).
        seed: seed of the ``torch.Generator``.
        ref: a precomputed ``fisher_ref.exact.exact(task)`` with states and sequences kept
            (else computed here).

    Returns:
        list of dicts with keys ``quantity, dtype, device, max_abs_error,
        max_rel_error, test, statistic, tolerance, passed``.
    """
    import torch
    from fisher_ref.engine.fast import exact
    from fisher_ref.engine.plan import EngineOptions
    from fisher_ref.torch import exact as tex
    from fisher_ref.torch.registry import torch_model
    dtypes = check_dtypes(dtypes)
    if isinstance(mc, bool) or not isinstance(mc, (int, np.integer)) or mc < 0:
        raise ValueError(f"mc must be a non-negative integer number of draws, got {mc!r}")
    seed = check_seed(seed)
    if ref is None:
        check_compare_cost(task, dtypes)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if ref is not None:
        require_all_quantities(ref, "compare")
    if ref is None:
        ref = exact(task, progress=False,
                    options=EngineOptions(keep_states=True, keep_sequences=True))
    rows, ranges, exact_sens = [], None, exact_state_sensitivities(task, ref)
    with highest_matmul_precision():
        for d in dtypes:
            tm = torch_model(task.model, device=device, dtype=d)
            # no row reads the variances; the float64 run's ranges serve the MC rows
            out = tex.torch_exact(task, device=device, dtype=d, adapter=tm,
                                  keep_states=True, keep_sequences=True,
                                  variances=d == "float64")
            ranges = out["ranges"] if d == "float64" else ranges
            abs_err, rel_err = sensitivity_errors(task, tm, exact_sens)
            rows.append(_row("sensitivities", d, device, abs_err, rel_err, "rel", rel_err,
                             TOLERANCES[d]))
            for name, a, b, s in _pairs(task, ref, out, tm, exact_sens):
                abs_err, rel_err = rel_error(a, b, s)
                rows.append(_row(name, d, device, abs_err, rel_err, "rel", rel_err,
                                 TOLERANCES[d]))
        if mc:
            if ranges is None:
                ranges = tex.torch_exact(task, device=device, dtype="float64",
                                         keep_states=False, keep_sequences=False)["ranges"]
            rows += _mc_rows(task, ref, device, int(mc), seed, ranges)
    return rows


def format_table(rows, title=""):
    """The rows as a fixed-width text table."""
    head = f"{'quantity':<40} {'dtype':<9} {'device':<6} {'max abs err':>11} " \
           f"{'max rel err':>11} {'test':>4} {'statistic':>9} {'tolerance':>9} pass"
    lines = [title] if title else []
    lines += [head, "-" * len(head)]
    for r in rows:
        lines.append(f"{r['quantity']:<40} {r['dtype']:<9} {r['device']:<6} "
                     f"{r['max_abs_error']:>11.2e} {r['max_rel_error']:>11.2e} {r['test']:>4} "
                     f"{r['statistic']:>9.2e} {r['tolerance']:>9.2e} "
                     f"{'ok' if r['passed'] else 'FAIL'}")
    return "\n".join(lines)


