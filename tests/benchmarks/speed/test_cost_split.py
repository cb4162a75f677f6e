"""benchmarks/speed/cost_split.py: a run's time split into a part fixed by the prefix tree
and a part per parameter, for exact, exact(quantities="fisher") and the torch peer."""
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "speed" / "cost_split.py"


def _module():
    spec = importlib.util.spec_from_file_location("cost_split", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _run(*args, timeout=300):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout)


def test_fit_line_recovers_the_fixed_and_per_parameter_costs():
    """Points on t = 0.012 + 2.5e-5 P give a and b back to rounding, with residual 0; one
    point off the line by 10% of its time shows as a residual of about that."""
    fit_line = _module().fit_line
    P = np.array([145, 1044, 1972, 4376])
    a, b, worst = fit_line(P, 0.012 + 2.5e-5 * P)
    assert abs(a - 0.012) <= 1e-12 and abs(b - 2.5e-5) <= 1e-15 and worst <= 1e-10
    t = 0.012 + 2.5e-5 * P
    t[1] *= 1.1
    assert 0.02 < fit_line(P, t)[2] < 0.2


def test_fit_line_needs_two_distinct_sizes():
    with pytest.raises(ValueError, match="two distinct numbers of parameters"):
        _module().fit_line([1044, 1044], [0.03, 0.031])


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats: must be a positive integer"),
    (["--hidden", "8", "x"], "--hidden: must be a positive integer"),
    (["--configs", "nope"], "unknown scale config 'nope'"),
    (["--configs", "gpt2_p100k"], "gpt2_p100k is not an MLP config"),
])
def test_cost_split_refuses_bad_arguments(args, message):
    out = _run(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_cost_split_never_overwrites_its_output(tmp_path):
    kept = tmp_path / "split.txt"
    kept.write_text("a record\n")
    out = _run("--out", str(kept))
    assert out.returncode == 2 and "is not overwritten" in out.stderr, out.stderr
    assert kept.read_text() == "a record\n"
    out = _run("--out", str(tmp_path / "no" / "split.txt"))
    assert out.returncode == 2 and "the directory does not exist" in out.stderr, out.stderr


@pytest.mark.slow
@pytest.mark.torch
def test_cost_split_times_every_side_and_fits_each(tmp_path):
    """A row per width (the config's own marked), a fit per side, the commit and machine
    first, and the same text in --out. The times are not asserted: they depend on the
    machine's load."""
    torch = pytest.importorskip("torch")  # noqa: F841  the peer is torch
    dest = tmp_path / "split.txt"
    out = _run("--configs", "medium", "--hidden", "1", "--repeats", "1", "--out", str(dest))
    assert out.returncode == 0, out.stderr[-2000:]
    text = dest.read_text()
    made, first = text.splitlines()[:2]
    assert made == (f"# made by: python benchmarks/speed/cost_split.py --configs medium --hidden 1 "
                    f"--repeats 1 --out {dest}"), made
    assert first.startswith("commit ") and "cores" in first, first
    rows = re.findall(r"^\| medium \| (\d+)( \(the config's\))? \| ([\d,]+) \| [\d.]+ \| "
                      r"[\d.]+ \| [\d.]+ \| [\d.]+ \|$", text, re.M)
    assert [(h, mark != "", P) for h, mark, P in rows] == \
        [("1", False, "145"), ("32", True, "1,044")], text
    fits = re.findall(r"^\| medium \| (exact|exact fisher|peer) \| -?[\d.]+ \| -?[\d.]+ \| "
                      r"-?\d+% \| \d+% \|$", text, re.M)
    assert fits == ["exact", "exact fisher", "peer"], text
    assert "| task | side | fixed cost a (ms)" in out.stdout
