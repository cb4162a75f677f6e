r"""How the exact engine's time and peak memory grow: ``bench --scaling``.

:func:`measure` times one :func:`fisher_ref.exact.exact` run and records its
peak traced memory (``tracemalloc``: every numpy and Python allocation, so the
peak of one run, not of the process). :func:`sweep` does it over a grid of
model sizes (:data:`GRID`), and :func:`write_table` / :func:`plot` write a CSV,
a markdown table and a log-log plot of time and peak memory against the work
size :math:`N \cdot P \cdot V` (states x parameters x vocabulary: the size of
the full sensitivity array, which the engine never holds).

:func:`budget_run` runs a task whose full ``(N, P, V)`` array would need more
than 24 GiB within a stated memory budget and reports the measured peak.

Run as ``python -m fisher_ref bench --scaling docs [--budget-run]``.
"""
from __future__ import annotations

import csv
from importlib import resources
import json
import platform
import time
import tracemalloc
from pathlib import Path

import numpy as np

__all__ = ["GRID", "BUDGET_TASK", "load_scale_config", "scale_task", "measure", "sweep",
           "write_table", "plot", "budget_run", "engine_speedup", "machine", "git_commit"]

_SCALE_DIR = Path(str(resources.files("fisher_ref") / "configs" / "scale"))

# (vocab_size, max_len, hidden): the sweep of model sizes (context 2, embed 8, EOS).
GRID = [(4, 3, 8), (6, 3, 16), (8, 3, 16), (8, 4, 16), (10, 4, 32), (12, 4, 32),
        (16, 4, 32), (12, 4, 128)]
# A task whose full (N, P, V) sensitivity array needs 28 GiB: V=16, T=5, hidden 128.
BUDGET_TASK = (16, 5, 128)


def load_scale_config(name):
    """A config of ``fisher_ref/configs/scale/`` (kept apart from the shipped configs
    so that tests parametrised over :func:`fisher_ref.tasks.list_configs` skip it).

    Example:
        >>> load_scale_config("medium").model.num_params
        1044
    """
    from fisher_ref.tasks import task_from_json
    path = _SCALE_DIR / f"{name}.json"
    if not path.is_file():
        names = sorted(p.stem for p in _SCALE_DIR.glob("*.json"))
        raise ValueError(f"unknown scale config {name!r}; known: {names}")
    with open(path) as fh:
        return task_from_json(json.load(fh))


def scale_task(vocab_size, max_len, hidden, embed_dim=8, context=2):
    """A one-prompt MLP task of the given size (count-of-token-2 reward, mean baseline)."""
    from fisher_ref.tasks import task_from_json
    return task_from_json({
        "model": {"vocab_size": vocab_size, "context": context, "embed_dim": embed_dim,
                  "hidden": hidden, "eos": True, "init_seed": 0, "init_scale": 1.0},
        "prompts": [[1, 2 % vocab_size]], "max_len": max_len,
        "reward": {"name": "count", "token": 2 % vocab_size}, "baseline": "mean"})


def measure(task, separate_timing=False, **exact_kwargs):
    """Wall time and peak traced memory of ``exact(task)``.

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        separate_timing: time a second, untraced run (tracing every allocation
            slows numpy down); else the time is that of the traced run.
        **exact_kwargs: passed to :func:`fisher_ref.engine.fast.exact` (the knobs,
            ``chunk=``, ``keep_states=``, ..., in its ``options``).

    Returns:
        dict: ``V``, ``T``, ``P``, ``n_states`` (N), ``n_responses``, ``NPV`` (N*P*V),
        ``full_sens_bytes`` (8*N*P*V), ``seconds``, ``peak_bytes``.
    """
    from fisher_ref.engine.fast import exact  # one process: the sweep measures the engine
    from fisher_ref.engine.plan import MOVED, EngineOptions
    exact_kwargs.setdefault("progress", False)
    knobs = {k: exact_kwargs.pop(k) for k in list(exact_kwargs) if k in MOVED}
    if knobs:
        exact_kwargs["options"] = EngineOptions(**knobs)
    tracemalloc.start()
    try:
        t0 = time.perf_counter()
        r = exact(task, **exact_kwargs)
        seconds = time.perf_counter() - t0
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    if separate_timing:
        t0 = time.perf_counter()
        exact(task, **exact_kwargs)
        seconds = time.perf_counter() - t0
    m = task.model
    npv = r.n_states * m.num_params * m.vocab_size
    return {"V": m.vocab_size, "T": task.max_len, "P": m.num_params, "n_states": r.n_states,
            "n_responses": r.n_responses, "NPV": npv, "full_sens_bytes": 8 * npv,
            "seconds": seconds, "peak_bytes": int(peak)}


def sweep(grid=GRID, **exact_kwargs):
    """:func:`measure` (untraced times) on :func:`scale_task` of every ``(V, T, hidden)``;
    per-state and per-response arrays are not kept (the engine's own working memory)."""
    exact_kwargs.setdefault("keep_states", False)
    exact_kwargs.setdefault("keep_sequences", False)
    return [measure(scale_task(V, T, H), separate_timing=True, **exact_kwargs)
            for V, T, H in grid]


def engine_speedup(task, repeats=3):
    """Median wall times of the readable judge (``reference=True``) and the fast engine,
    interleaved.

    Returns:
        dict: ``reference_s``, ``fast_s`` (medians) and ``speedup`` (their ratio).
    """
    import statistics
    from fisher_ref.engine.fast import exact
    runs = {"reference_s": [], "fast_s": []}
    for _ in range(repeats):
        for key, ref in (("reference_s", True), ("fast_s", False)):
            t0 = time.perf_counter()
            exact(task, progress=False, reference=ref).gathered()
            runs[key].append(time.perf_counter() - t0)
    out = {k: statistics.median(v) for k, v in runs.items()}
    out["speedup"] = out["reference_s"] / out["fast_s"]
    return out


#: The paths whose changes make a measurement's code differ from its commit.
CODE_PATHS = ("fisher_ref", "benchmarks")


def git_commit(cwd=None, short=True):
    """The hash of the checkout's HEAD (short by default), with ``+dirty`` when a file of
    the code (:data:`CODE_PATHS`, under ``cwd``: the checkout this package was imported
    from by default) differs from it or is new and not yet committed, so that the numbers
    were measured on code no commit holds; ``"unknown"`` outside a git checkout. A record
    written in ``docs/`` does not make the next one dirty."""
    import subprocess
    from pathlib import Path
    cwd = Path(__file__).resolve().parents[2] if cwd is None else cwd

    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, check=True,
                              cwd=cwd).stdout.strip()
    try:
        head = git("rev-parse", *(["--short"] if short else []), "HEAD")
        dirty = git("status", "--porcelain", "--", *CODE_PATHS)  # relative to cwd
        return head + ("+dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def machine():
    """One line naming the machine the numbers were measured on (its C library too: the
    memory conditions of the benchmarks are glibc's)."""
    import os
    libc = " ".join(platform.libc_ver()).strip() or "C library unknown"
    return (f"{platform.machine()} CPU, {os.cpu_count()} cores, Python "
            f"{platform.python_version()}, numpy {np.__version__}, {libc}")


def write_table(rows, csv_path, md_path=None):
    """Write ``rows`` (from :func:`sweep`) as CSV and (optionally) a markdown table."""
    keys = list(rows[0])
    with open(csv_path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    if md_path is None:
        return
    lines = [f"Measured on {machine()} by `python -m fisher_ref bench --scaling`.", "",
             "| V | T | P | states N | responses | N·P·V | full (N,P,V) array | time s | peak MiB |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['V']} | {r['T']} | {r['P']:,} | {r['n_states']:,} | "
                     f"{r['n_responses']:,} | {r['NPV']:.3g} | "
                     f"{r['full_sens_bytes'] / 2**30:.3g} GiB | {r['seconds']:.3g} | "
                     f"{r['peak_bytes'] / 2**20:.1f} |")
    Path(md_path).write_text("\n".join(lines) + "\n")


def plot(rows, png_path, budget=None):
    """Log-log plot of time and peak memory against ``N * P * V`` (plus the
    :func:`budget_run` result ``budget`` when given)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = sorted(rows, key=lambda r: r["NPV"]) + ([budget] if budget else [])
    x = np.array([r["NPV"] for r in rows], dtype=float)
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 3.6))
    a1.loglog(x, [r["seconds"] for r in rows], "o-")
    a1.set_xlabel("states x parameters x vocabulary (N P V)")
    a1.set_ylabel("exact() wall time (s)")
    a2.loglog(x, [r["peak_bytes"] / 2 ** 20 for r in rows], "o-", label="peak traced memory")
    a2.loglog(x, 8 * x / 2 ** 20, "--", label="full (N, P, V) float64 array")
    if budget:
        a1.annotate("budget run ", (x[-1], budget["seconds"]), fontsize=8, ha="right")
        a2.axhline(budget["budget_bytes"] / 2 ** 20, color="gray", lw=0.8,
                   label=f"budget {budget['budget_bytes'] / 2**30:.0f} GiB")
    a2.set_xlabel("N P V")
    a2.set_ylabel("MiB")
    a2.legend(fontsize=8)
    fig.suptitle(f"fisher_ref exact engine scaling ({machine()})", fontsize=9)
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


def budget_run(task=None, budget_bytes=2 * 2 ** 30):
    """Run ``exact`` on a task whose full sensitivity array exceeds 24 GiB within
    ``budget_bytes`` (refused by the cost estimate otherwise), and measure the peak.

    Returns:
        :func:`measure`'s dict plus ``budget_bytes`` and ``within_budget``.
    """
    from fisher_ref.perf.memory import peak_rss_bytes
    task = scale_task(*BUDGET_TASK) if task is None else task
    out = measure(task, keep_states=False, keep_sequences=False, max_bytes=budget_bytes,
                  max_seconds=3600.0)
    out["budget_bytes"] = int(budget_bytes)
    out["within_budget"] = out["peak_bytes"] <= budget_bytes
    out["max_rss_bytes"] = peak_rss_bytes()
    return out


