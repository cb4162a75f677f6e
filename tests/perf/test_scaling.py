"""The scaling measurement: tables, plot, the memory-budget run and the medium config.

Only correctness and bookkeeping are tested here; speed is left to ``bench``
(no wall-time assertions).
"""
import csv
import os

import numpy as np
import pytest

from fisher_ref.engine.plan import EnumerationTooLarge, count_states, estimate_cost
from fisher_ref.perf.scaling import (BUDGET_TASK, budget_run, load_scale_config, measure, plot,
                                scale_task, sweep, write_table)

TINY_GRID = [(3, 2, 2), (4, 2, 3)]


def test_measure_counts_and_sizes():
    task = scale_task(4, 2, 3)
    row = measure(task)
    N, M = count_states(4, 2, True)
    assert (row["n_states"], row["n_responses"]) == (N, M)
    assert row["NPV"] == N * task.model.num_params * 4
    assert row["full_sens_bytes"] == 8 * row["NPV"]
    assert row["seconds"] > 0 and row["peak_bytes"] > 0


def test_sweep_writes_table_and_plot(tmp_path):
    rows = sweep(TINY_GRID)
    assert [(r["V"], r["T"]) for r in rows] == [(V, T) for V, T, _ in TINY_GRID]
    write_table(rows, tmp_path / "s.csv", tmp_path / "s.md")
    with open(tmp_path / "s.csv") as fh:
        back = list(csv.DictReader(fh))
    assert [int(r["n_states"]) for r in back] == [r["n_states"] for r in rows]
    md = (tmp_path / "s.md").read_text()
    assert "Measured on" in md and md.count("\n| ") == len(rows) + 1
    plot(rows, tmp_path / "s.png")
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_budget_run_reports_peak_against_budget():
    res = budget_run(scale_task(3, 2, 2), budget_bytes=2 ** 30)
    assert res["within_budget"] and res["peak_bytes"] <= res["budget_bytes"] == 2 ** 30


def test_budget_task_would_need_more_than_24_gib():
    """The demonstration task's full (N, P, V) float64 array exceeds 24 GiB, while
    the engine's own estimate of its peak stays within the 2 GiB budget."""
    task = scale_task(*BUDGET_TASK)
    cost = estimate_cost(task)
    assert 8 * cost.n_states * cost.num_params * cost.vocab_size > 24 * 2 ** 30
    assert cost.bytes < 2 * 2 ** 30


def test_budget_refused_when_too_small():
    with pytest.raises(EnumerationTooLarge, match="GiB exceeds the limit.*Monte Carlo"):
        budget_run(scale_task(4, 2, 3), budget_bytes=1000)


def test_medium_config():
    task = load_scale_config("medium")
    assert (task.model.vocab_size, task.max_len, task.model.num_params) == (12, 4, 1044)
    assert estimate_cost(task).n_states == 1464


def test_unknown_scale_config_is_named():
    with pytest.raises(ValueError, match="unknown scale config 'huge'.*medium"):
        load_scale_config("huge")


def test_peak_memory_grows_with_chunk_not_with_the_tree():
    """Peak traced memory is set by the block size: a 5x larger tree at the same
    chunk stays far below 5x the peak (same P and V; T grows by one, so each
    response's history is one slot longer and one more block waits on the stack).
    Measured: 2.9 MB -> 3.6 MB."""
    small = measure(scale_task(6, 4, 16), chunk=4, keep_states=False, keep_sequences=False)
    big = measure(scale_task(6, 5, 16), chunk=4, keep_states=False, keep_sequences=False)
    assert big["n_states"] >= 5 * small["n_states"]
    assert big["peak_bytes"] < 1.6 * small["peak_bytes"], (small, big)
    assert np.isfinite(big["seconds"])


def test_git_commit_says_when_the_checkout_differs_from_its_commit(tmp_path, monkeypatch):
    """A record made from uncommitted changes must not name a commit as if it held them."""
    import shutil
    import subprocess
    from fisher_ref.perf.scaling import git_commit
    if shutil.which("git") is None:
        pytest.skip("no git on this machine")
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "PATH": os.environ["PATH"], "HOME": str(tmp_path),
           "GIT_CEILING_DIRECTORIES": str(tmp_path.parent)}  # no checkout above tmp_path
    for k in ("GIT_DIR", "GIT_WORK_TREE", "GIT_CEILING_DIRECTORIES"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path.parent))
    assert git_commit(tmp_path) == "unknown"  # not a checkout
    run = lambda *a: subprocess.run(["git", *a], cwd=tmp_path, check=True, env=env,  # noqa: E731
                                    capture_output=True)
    run("init", "-q")
    (tmp_path / "fisher_ref").mkdir()
    (tmp_path / "fisher_ref" / "f.py").write_text("a = 1\n")
    (tmp_path / "notes.md").write_text("a record\n")
    run("add", "fisher_ref/f.py", "notes.md")
    run("commit", "-q", "-m", "one")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=tmp_path, text=True,
                          capture_output=True, check=True).stdout.strip()
    (tmp_path / "new.txt").write_text("untracked\n")  # untracked files are not the code run
    assert git_commit(tmp_path) == head
    (tmp_path / "notes.md").write_text("a record written by the run\n")  # not the code
    assert git_commit(tmp_path) == head
    (tmp_path / "fisher_ref" / "g.py").write_text("b = 1\n")  # new code, not yet added
    assert git_commit(tmp_path) == head + "+dirty"
    (tmp_path / "fisher_ref" / "g.py").unlink()
    (tmp_path / "fisher_ref" / "f.py").write_text("a = 2\n")
    assert git_commit(tmp_path) == head + "+dirty"
    full = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, text=True,
                          capture_output=True, check=True).stdout.strip()
    assert git_commit(tmp_path, short=False) == full + "+dirty" and len(full) == 40
