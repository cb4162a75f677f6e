"""What a test of a trainer's applied gradients sees, on a correct sampler and on a biased
one: the covariance tests (fisher_ref.testing.check_applied_covariance: Bennett's bound on
each direction, and the chi-square with and without the kurtosis rule), the diagonal
chi-square, and the per-parameter max |z| with the exact variance (the normal quantile,
and Bennett's bound) and with the sample variance. Steps are drawn i.i.d. from the enumerated distribution of one GRPO group's
gradient (fisher_ref.estimators.enumerated_gradients) on `offpolicy_stale` (GRPO, G = 2,
symmetric: most groups have equal rewards and a zero gradient). Writes
docs/bench/estimators/applied_covariance.json, which docs/check/applied_gradient.md
quotes.

    PYTHONPATH=. python benchmarks/estimators/applied_covariance.py
"""
import argparse
import datetime
import json
import time
from pathlib import Path

import numpy as np
from scipy import stats

from fisher_ref import load_config
from fisher_ref.estimators import enumerated_gradients, expected_loss_gradient, presets
from fisher_ref.perf.scaling import git_commit, machine
from fisher_ref.testing import check_applied_covariance, check_applied_gradient

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "bench" / "estimators" / "applied_covariance.json"
TASK, G, SEED = "offpolicy_stale", 2, 20261205
#: the power runs: the heavy-tailed task above and a light-tailed one (tabular, G = 3)
POWER_TASKS = {"offpolicy_stale": 2, "tabular": 3}
RUNS, ALPHA_CAL, ALPHA = 2000, 0.05, 1e-6
CAL_STEPS = (100, 300, 1000)
#: the Bennett-bound tests' calibration: runs and step counts
BENNETT_RUNS, BENNETT_STEPS = 1000, (5, 40, 300, 1000)
SMALL_STEPS = (5, 10, 20, 40, 100, 300)
BIAS, POWER_AT, POWER_SEEDS, GRID = 0.02, 1000, 20, (50, 100, 200, 300, 500, 1000, 2000, 5000, 10000, 20000,
                                     50000)


class Draw:
    """i.i.d. steps from the enumerated distribution (inverse CDF)."""

    def __init__(self, g, p):
        self.g, self.cdf, self.distribution = g, np.cumsum(p) / p.sum(), (g, p)

    def __call__(self, rng, n):
        idx = np.minimum(np.searchsorted(self.cdf, rng.random(n), side="right"),
                         len(self.cdf) - 1)
        return self.g[idx]  # (n, P)


def per_parameter_z(samples, mean, var):
    """z per parameter of nonzero variance, with the given standard error."""
    live = var > 0
    n = len(samples)
    return (samples.mean(0) - mean)[live] / np.sqrt(var[live] / n)


def bonferroni(z, alpha):
    return float(np.abs(z).max()) > stats.norm.isf(alpha / 2 / len(z))


def correct_sampler(draw, lg, rng):
    live = lg.variance > 0
    out = {"covariance_test": {}, "diagonal_chi2": {}, "sample_variance_z": {},
           "exact_variance_z": {}, "bennett_covariance": {}, "bennett_per_parameter": {},
           "bennett_covariance_1e-6": {}, "bennett_per_parameter_1e-6": {}}
    out["kurtosis_rule"], out["kurtosis_rule_directions"] = {}, {}
    for n in CAL_STEPS:
        flags = [not check_applied_covariance(draw(rng, n), lg, alpha=ALPHA_CAL, method="chi2")
                 for _ in range(RUNS)]
        out["covariance_test"][str(n)] = float(np.mean(flags))
        vs = [check_applied_covariance(draw(rng, n), lg, alpha=ALPHA_CAL, method="chi2",
                                       distribution=draw.distribution) for _ in range(RUNS)]
        out["kurtosis_rule"][str(n)] = float(np.mean([not v for v in vs]))
        out["kurtosis_rule_directions"][str(n)] = vs[0].m
    for n in BENNETT_STEPS:
        for key, alpha in (("", ALPHA_CAL), ("_1e-6", ALPHA)):
            cov = per = 0
            for _ in range(BENNETT_RUNS):
                s = draw(rng, n)
                cov += not check_applied_covariance(s, lg, alpha=alpha, min_steps=2,
                                                    distribution=draw.distribution)
                per += not check_applied_gradient(s, lg, alpha=alpha, min_steps=2)
            out["bennett_covariance" + key][str(n)] = cov / BENNETT_RUNS
            out["bennett_per_parameter" + key][str(n)] = per / BENNETT_RUNS
    chi2 = []
    for _ in range(RUNS):
        z = per_parameter_z(draw(rng, 300), lg.mean, lg.variance)
        chi2.append(float(z @ z))
    chi2, df = np.array(chi2), int(live.sum())
    out["diagonal_chi2"] = {"steps": 300, "df": df, "rate": float(np.mean(
        stats.chi2.sf(chi2, df) < ALPHA_CAL)), "mean_over_df": float(chi2.mean() / df),
        "sd_over_df": float(chi2.std() / df), "chi2_sd_over_df": float(np.sqrt(2 / df))}
    for n in SMALL_STEPS:
        sv = ex = 0
        for _ in range(RUNS):
            s = draw(rng, n)
            var = s.var(0, ddof=1)
            z = per_parameter_z(s, lg.mean, lg.variance)
            ex += bonferroni(z, ALPHA)
            ok = live & (var > 0)  # a parameter whose steps all agree is skipped
            zs = (s.mean(0) - lg.mean)[ok] / np.sqrt(var[ok] / n)
            sv += bool(ok.any()) and bonferroni(zs, ALPHA)
        out["sample_variance_z"][str(n)] = sv / RUNS
        out["exact_variance_z"][str(n)] = ex / RUNS
    return out


def _flags(samples, lg, distribution):
    """The covariance test with the kurtosis rule passes (no direction usable yet: pass)."""
    try:
        return check_applied_covariance(samples, lg, alpha=ALPHA, distribution=distribution,
                                        method="chi2")
    except ValueError:
        return True


def power(draw, lg, rng):
    lam, U = np.linalg.eigh(lg.covariance)
    lam, U = lam[::-1], U[:, ::-1]
    kept = check_applied_covariance(draw(rng, POWER_AT), lg, distribution=draw.distribution,
                                    method="chi2")
    m = int(np.argmin(np.abs(lam - kept.eigenvalues.min())))  # the lowest kept, in lam
    bias = BIAS * np.linalg.norm(lg.mean) * U[:, m]  # (P,)
    live = lg.variance > 0
    zc = stats.norm.isf(ALPHA / 2 / live.sum())
    expected = {"covariance_noncentrality_per_step": float(bias @ bias / lam[m]),
                "per_parameter_max_z_per_sqrt_step": float(
                    (np.abs(bias[live]) / np.sqrt(lg.variance[live])).max())}
    first = {"covariance_test": [], "per_parameter_z": [], "bennett_covariance": []}
    for _ in range(POWER_SEEDS):
        s = draw(rng, GRID[-1]) + bias  # (N, P)
        c = next((n for n in GRID if not _flags(s[:n], lg, draw.distribution)), None)
        first["bennett_covariance"].append(next((n for n in GRID if not check_applied_covariance(
            s[:n], lg, alpha=ALPHA, distribution=draw.distribution)), None))
        sums = np.cumsum(s, axis=0)
        p = next((n for n in GRID if np.abs((sums[n - 1] / n - lg.mean)[live]
                                            / np.sqrt(lg.variance[live] / n)).max() > zc), None)
        first["covariance_test"].append(c)
        first["per_parameter_z"].append(p)
    return {"bias": f"{BIAS:g} |E g| along the lowest-variance direction the kurtosis rule "
            f"keeps at {POWER_AT} steps",
            "group_size": int(lg.group_size), "rank": int((lam > 1e-10 * lam[0]).sum()),
            "direction": m + 1, "directions_kept": kept.m, "eigenvalue": float(lam[m]),
            "largest_eigenvalue":
            float(lam[0]), "alpha": ALPHA, "grid": list(GRID), "seeds": POWER_SEEDS,
            "first_flagged": first, "expected": expected,
            "per_parameter_steps_at_threshold": float(
                (zc / expected["per_parameter_max_z_per_sqrt_step"]) ** 2)}


def median_steps(values):
    """The median first-flagged step count; ``None`` (never within the grid) counts high."""
    v = sorted(np.inf if x is None else x for x in values)
    return v[len(v) // 2]


def table(r):
    """The Markdown tables docs/check/applied_gradient.md shows (a test holds the page to
    them)."""
    c, s = r["correct"], r["correct"]["sample_variance_z"]
    e = r["correct"]["exact_variance_z"]
    d = c["diagonal_chi2"]
    lines = ["| test, correct sampler | steps | flagged (nominal) |", "|---|---|---|"]
    for n, rate in c["covariance_test"].items():
        lines.append(f"| covariance chi-square, every direction | {n} | {rate:.3f} "
                     f"({ALPHA_CAL:g}) |")
    for n, rate in c["kurtosis_rule"].items():
        lines.append(f"| covariance chi-square, kurtosis rule "
                     f"({c['kurtosis_rule_directions'][n]} directions) | {n} | {rate:.3f} "
                     f"({ALPHA_CAL:g}) |")
    lines.append(f"| diagonal chi-square | {d['steps']} | {d['rate']:.3f} ({ALPHA_CAL:g}) |")
    for n in s:
        lines.append(f"| max \\|z\\|, sample variance | {n} | {s[n]:.3f} ({ALPHA:g}) |")
    for n in e:
        lines.append(f"| max \\|z\\|, exact variance | {n} | {e[n]:.4f} ({ALPHA:g}) |")
    for key, label in (("bennett_per_parameter", "max \\|z\\|, Bennett's bound"),
                       ("bennett_covariance", "covariance, Bennett's bound, every direction")):
        for suffix, alpha in (("", ALPHA_CAL), ("_1e-6", ALPHA)):
            for n, rate in c[key + suffix].items():
                lines.append(f"| {label} | {n} | {rate:.4f} ({alpha:g}) |")
    lines += ["", "| biased sampler | test | median steps to flag | flagged in every seed by |",
              "|---|---|---|---|"]
    fmt = lambda x: "never" if x == np.inf else f"{x:,}"  # noqa: E731
    for task, p in r["power"].items():
        for name, key in (("covariance chi-square, kurtosis rule", "covariance_test"),
                          ("covariance, Bennett's bound", "bennett_covariance"),
                          ("max \\|z\\|, exact variance", "per_parameter_z")):
            worst = max(np.inf if x is None else x for x in p["first_flagged"][key])
            lines.append(f"| {task}, G = {p['group_size']}, direction {p['direction']} of "
                         f"{p['rank']} | {name} | {fmt(median_steps(p['first_flagged'][key]))} "
                         f"| {fmt(worst)} |")
    return "\n".join(lines)


def main(argv=None):
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args(argv)
    t0 = time.perf_counter()
    task, loss = load_config(TASK), presets.grpo()
    g, p = enumerated_gradients(task, loss, G, True)
    lg = expected_loss_gradient(task, loss, G, True, covariance=True)
    lam = np.linalg.eigvalsh(lg.covariance)
    draw, rng = Draw(g, p), np.random.default_rng(SEED)
    record = {"command": "python benchmarks/estimators/applied_covariance.py",
              "commit": git_commit(ROOT), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "task": TASK, "loss": "presets.grpo()", "group_size": G, "symmetric": True,
              "seed": SEED, "runs": RUNS, "bennett_runs": BENNETT_RUNS,
              "parameters": int(task.theta.size),
              "rank": int((lam > 1e-10 * lam.max()).sum()),
              "zero_gradient_share": float(p[np.abs(g).max(1) == 0].sum()),
              "correct": correct_sampler(draw, lg, rng), "power": {}}
    for name, size in POWER_TASKS.items():
        t = load_config(name)
        g, p = enumerated_gradients(t, loss, size, True)
        record["power"][name] = power(Draw(g, p), expected_loss_gradient(
            t, loss, size, True, covariance=True), rng)
    record["seconds"] = round(time.perf_counter() - t0, 1)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))


if __name__ == "__main__":
    main()
