r"""``python -m fisher_ref compare``: the torch implementation against fisher_ref.

For each dtype the torch side (:mod:`fisher_ref.torch.exact`) computes every
quantity of DESIGN §1 on the device and each is held against fisher_ref's
float64 exact engine. The error of a torch array ``a`` against the exact ``b``:

.. math:: \text{abs} = \max|a - b|,\qquad \text{rel} = \max|a - b| \,/\, \max|b|

(the denominator is the largest exact entry, so small entries are judged on
the scale of the quantity; for ``score_mean``, exactly 0 on-policy, the scale
is :math:`\max(\max|b|, \sqrt{\max F})`, the score's own spread; for the
gradients :math:`E[Ah]`, a cancellation of terms as large as
:math:`(\sqrt{E[R^2]} + |b|)\sqrt{\max F}` when the baseline ``b`` is large,
the scale is at least that size (:func:`fisher_ref.verify.gradient_scale`); an
all-zero exact array is judged by the absolute error). A row passes when
``rel <= tolerance`` of its dtype:

- ``float64``: :data:`TOL_FLOAT64` = 1e-10 — both sides are float64 and run
  the same arithmetic in a different order; measured errors are ~1e-14.
- ``float32`` (matmul precision ``"highest"``, TF32 off): eps32 = 1.2e-7
  times a conditioning factor. The factor covers the tanh layer, the softmax,
  centering :math:`j - \bar j` (cancellation) and sums over up to ``V^T``
  responses. Measured worst rel error on the shipped configs (2-core x86_64
  CPU): 2.2e-6 (``raw.correlation`` of ``offpolicy_stale``, a ratio; factor
  ~18); :data:`TOL_FLOAT32` = 2e-5 (factor ~170) leaves a 10x margin for
  bigger tasks and GPU reduction orders.
- ``bfloat16`` (eps = 2^-7 = 7.8e-3): logits and sensitivities in bfloat16,
  probabilities and every sum in float32 (:func:`fisher_ref.torch.model.accumulation_dtype`).
  Errors are dominated by the bfloat16 rounding of ``theta``, the logits and
  ``j``; measured worst rel error on the shipped configs: 3.0e-2
  (``centered.cross_terms`` of ``offpolicy_stale``; about 4 eps);
  :data:`TOL_BFLOAT16` = 0.1 (about 13 eps, a 3x margin).

A Monte Carlo row per quantity (``E[h^2]`` and the token sum) draws ``--mc``
responses with the torch sampler (float64, ``torch.Generator`` seeded with
``--seed``) and passes when every parameter's :math:`|\hat m - m|` is below
the Bernstein half-width :func:`bernstein_threshold` (exact variance from
fisher_ref; range ``b`` from the float64 torch enumeration) for a
false-failure rate of :data:`MC_ALPHA` per row (Bonferroni over parameters),
floored at the rounding level of the quantity (a parameter whose per-response
value is constant, such as the BOS embedding's token sum, has a variance and
range that are rounding noise: it is compared to rounding,
:func:`fisher_ref.mc_stats.bernstein_ratio`). The ``statistic`` is the largest
:math:`|\hat m - m| / t` (pass: <= 1); the JSON row also holds ``max_abs_z``
(:math:`|\hat m - m|/\sqrt{\mathrm{Var}/n}`, 0 where the variance is rounding noise).
"""
from __future__ import annotations

import contextlib
import json
import sys

import numpy as np

from .command import task_from_args

__all__ = ["TOLERANCES", "TOL_FLOAT64", "TOL_FLOAT32", "TOL_BFLOAT16", "MC_ALPHA",
           "DEFAULT_MC", "bernstein_threshold", "compare", "rel_error", "add_arguments", "run", "format_table"]

TOL_FLOAT64 = 1e-10  # same arithmetic, other order: measured ~1e-14
TOL_FLOAT32 = 2e-5  # eps32 1.2e-7 x conditioning ~170 (measured worst 2.2e-6)
TOL_BFLOAT16 = 0.1  # ~13 eps_bf16; bf16 compute, fp32 sums (measured worst 3.0e-2)
TOLERANCES = {"float64": TOL_FLOAT64, "float32": TOL_FLOAT32, "bfloat16": TOL_BFLOAT16}
MC_ALPHA = 1e-6  # false-failure rate of one Monte Carlo row (Bonferroni over parameters)
DEFAULT_MC = 4000
DEFAULT_DTYPES = ("float64", "float32")


def rel_error(a, b, scale=None):
    """``(max|a-b|, max|a-b| / max|b|)``; ``scale`` overrides the denominator.

    Example:
        >>> rel_error(np.array([1.0, 2.5]), np.array([1.0, 2.0]))
        (0.5, 0.25)
    """
    a, b = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if a.shape != b.shape:
        raise ValueError(f"shape mismatch: torch {a.shape} vs fisher_ref {b.shape}")
    err = float(np.max(np.abs(a - b))) if a.size else 0.0
    den = float(np.max(np.abs(b))) if scale is None else float(scale)
    if not np.isfinite(err):
        return err, float("inf")
    return err, (err / den if den > 0 else err)


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


# E[A h] with A = R - b is a cancellation when |b| >> |E[A h]|: its rounding error
# scales with the summands, so it is judged against their Cauchy–Schwarz size
# (sqrt(E[R^2]) + |b|) sqrt(max F) — verify.gradient_scale, the same scale verify uses.
GRADIENT_QUANTITIES = ("gradient", "importance_gradient")


def _pairs(task, ref, out, tm, theta_t):
    """(name, torch array, exact array, scale) for every compared quantity."""
    import torch
    from .enumeration import state_windows
    from .sensitivities import sensitivities
    from .torch.exact import STREAM_QUANTITIES
    from .verify import gradient_scale
    st = ref.states
    lengths = np.array([len(task.prompts[p]) for p in st["prompt"]]) + st["depth"]
    W = state_windows(st["tokens"], lengths, tm.context, tm.bos)  # (N, k)
    with torch.no_grad():
        J = tm.sensitivities(theta_t, torch.as_tensor(W, device=tm.device))  # (N, P, V)
    yield "sensitivities", J.to("cpu", torch.float64).numpy(), sensitivities(
        task.model, task.theta, W), None
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
            b = getattr(exact_s, q)
            scale = None
            if q == "score_mean":
                scale = max(float(np.max(np.abs(b))),
                            float(np.sqrt(np.max(exact_s.sequence_fisher))))
            elif q in GRADIENT_QUANTITIES:
                scale = max(float(np.max(np.abs(b))), gradient_scale(exact_s))
            yield prefix + q, d[q], b, scale
    yield "gradient_autodiff", out["gradient_autodiff"], ref.gradient_autodiff, max(
        float(np.max(np.abs(ref.gradient_autodiff))), gradient_scale(ref.streams["policy"]))


def _row(quantity, dtype, device, abs_err, rel_err, test, stat, tol):
    return {"quantity": quantity, "dtype": dtype, "device": str(device),
            "max_abs_error": abs_err, "max_rel_error": rel_err, "test": test,
            "statistic": stat, "tolerance": tol, "passed": bool(stat <= tol)}


def bernstein_threshold(var, b, n, alpha=MC_ALPHA, m=1):
    r"""Half-width ``t`` with :math:`P(|\bar X - \mu| \ge t) \le \alpha/m` for each of ``m`` means.

    :func:`fisher_ref.mc_stats.bernstein_halfwidth` (Bernstein's inequality, variance
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
    from .mc_stats import bernstein_halfwidth
    return bernstein_halfwidth(n, var, b, alpha / m)


def _mc_rows(task, ref, device, n, seed):
    import torch
    from .torch import exact as tex
    from .mc_stats import ZERO_VAR_RTOL, bernstein_ratio
    from .torch.monte_carlo import torch_monte_carlo
    gen = torch.Generator(device=device).manual_seed(int(seed))
    est = torch_monte_carlo(task, n, gen, device=device, dtype="float64")
    ranges = tex.torch_exact(task, device=device, dtype="float64")["ranges"]
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


def compare(task, device="cpu", dtypes=DEFAULT_DTYPES, mc=DEFAULT_MC, seed=0, ref=None):
    """Rows of errors of the torch side against fisher_ref, per quantity and dtype.

    Args:
        task: a :class:`fisher_ref.tasks.Task` with an MLP model.
        device: ``"cpu"`` or ``"cuda"``.
        dtypes: names from ``float64``, ``float32``, ``bfloat16``.
        mc: Monte Carlo draws for the z-score rows (0: none).
        seed: seed of the ``torch.Generator``.
        ref: a precomputed ``fisher_ref.exact.exact(task)`` (else computed here).

    Returns:
        list of dicts with keys ``quantity, dtype, device, max_abs_error,
        max_rel_error, test, statistic, tolerance, passed``.
    """
    import torch
    from .torch import exact as tex
    from .exact import exact
    from .torch.model import resolve_dtype, torch_model
    dtypes = [d for d in dtypes]
    for d in dtypes:
        resolve_dtype(d)
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    ref = exact(task, progress=False, keep_states=True, keep_sequences=True) if ref is None else ref
    rows = []
    with highest_matmul_precision():
        for d in dtypes:
            tm = torch_model(task.model, device=device, dtype=d)
            out = tex.torch_exact(task, device=device, dtype=d)
            for name, a, b, scale in _pairs(task, ref, out, tm, tm.theta(task.theta)):
                abs_err, rel_err = rel_error(a, b, scale)
                rows.append(_row(name, d, device, abs_err, rel_err, "rel", rel_err,
                                 TOLERANCES[d]))
        if mc:
            rows += _mc_rows(task, ref, device, int(mc), seed)
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


def _default_device():
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def _dtype_list(values):
    out = []
    for v in values or [",".join(DEFAULT_DTYPES)]:
        for d in v.split(","):
            d = d.strip()
            if d and d not in TOLERANCES:
                raise ValueError(f"unknown dtype {d!r}; choose from {', '.join(TOLERANCES)}")
            if d and d not in out:
                out.append(d)
    return out


def add_arguments(parser):
    """``--device``, ``--dtype`` (repeatable or comma list), ``--json``, ``--mc``, ``--seed``."""
    parser.add_argument("--device", choices=("cpu", "cuda"), default=None,
                        help="torch device (default: cuda when available, else cpu)")
    parser.add_argument("--dtype", action="append", default=None,
                        help="float64, float32, bfloat16; repeatable or comma separated "
                             "(default: float64,float32)")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--mc", type=int, default=DEFAULT_MC,
                        help=f"Monte Carlo draws for the z-score rows (default {DEFAULT_MC}; 0: none)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the torch.Generator")


def run(args):
    """Print the table (and write ``--json``); exit code 1 if any row fails."""
    task = task_from_args(args)
    device = args.device or _default_device()
    dtypes = _dtype_list(args.dtype)
    try:
        rows = compare(task, device=device, dtypes=dtypes, mc=args.mc, seed=args.seed)
    except NotImplementedError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = [r for r in rows if not r["passed"]]
    print(format_table(rows, title=f"fisher_ref compare: task {task.name!r}, device {device}; "
                                   "rel = max|torch - exact| / max|exact|"))
    print(f"{len(rows) - len(failed)}/{len(rows)} rows pass"
          + (f"; FAILED: {', '.join(r['quantity'] + ' ' + r['dtype'] for r in failed)}"
             if failed else ""))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"task": task.name, "device": device, "dtypes": dtypes,
                       "relative_error": "max|torch - exact| / max|exact|",
                       "tolerances": TOLERANCES, "rows": rows}, fh, indent=1)
    sys.stdout.flush()
    return 1 if failed else 0
