"""benchmarks/memory/sub_block_effects.py: exact's time, page faults and instructions for each
sub-block budget in glibc's default memory and with freed memory kept."""
import importlib.util
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "memory" / "sub_block_effects.py"


def _run(*args, env=None, timeout=120):
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.parametrize("args, message", [
    (["--repeats", "0"], "--repeats: must be a positive integer"),
    (["--rounds", "-1"], "--rounds: must be a positive integer"),
    (["--budgets", "1024", "x"], "--budgets: must be a positive integer"),
    (["--configs", "nope"], "unknown scale config 'nope'"),
])
def test_sub_block_effects_refuses_bad_arguments(args, message):
    out = _run(*args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_sub_block_effects_needs_valgrind_for_instructions(tmp_path):
    out = _run("--instructions", env={"PATH": str(tmp_path)})
    assert out.returncode == 2 and "needs valgrind" in out.stderr, out.stderr


def test_instruction_count_is_read_from_cachegrind_summary():
    spec = importlib.util.spec_from_file_location("sub_block_effects", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    text = "==1== \n==1== I   refs:      262,046,117\n"
    assert mod.instructions_of(text) == 262_046_117
    with pytest.raises(ValueError, match="no 'I refs' line"):
        mod.instructions_of("==1== nothing here")


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_sub_block_effects_measures_every_budget_and_condition():
    """A row per budget and condition, the commit and machine first. The times and faults
    are not asserted (they depend on the machine's load and the heap's history);
    tests/parallel/test_keep_memory.py holds which budget each condition takes."""
    out = _run("--configs", "medium", "--budgets", "1048576", "4194304", "--repeats", "1",
               timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^\| medium \| (glibc default|kept) \| (2\*\*20|2\*\*22) \| [\d.]+ \| "
                      r"[\d.]+ \| [\d,]+ \| [\d.]+ \| - \|$", out.stdout, re.M)
    assert sorted(rows) == sorted((m, b) for m in ("glibc default", "kept")
                                  for b in ("2**20", "2**22")), out.stdout
    made, first = out.stdout.splitlines()[:2]
    assert made.startswith("# made by: python benchmarks/memory/sub_block_effects.py "
                           "--configs medium --budgets 1048576 4194304"), made
    assert first.startswith("commit ") and "glibc" in first, first
