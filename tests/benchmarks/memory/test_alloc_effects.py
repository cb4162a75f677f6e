"""benchmarks/memory/alloc_effects.py: exact's page faults and time in glibc's default memory, with
freed memory kept from the start, and after fisher_ref.engine.keep_memory.keep_freed_memory()."""
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "memory" / "alloc_effects.py"


@pytest.mark.parametrize("flag", ["--repeats", "--rounds"])
def test_alloc_effects_refuses_no_repeats_or_rounds(flag):
    out = subprocess.run([sys.executable, str(SCRIPT), flag, "0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and f"{flag} must be a positive integer" in out.stderr


@pytest.mark.slow
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_alloc_effects_measures_every_condition():
    """Every condition and mode gets its line, the commit and machine come first. Whether
    the faults differ is not asserted here: in glibc's default memory a run's faults depend
    on what the heap went through before (they range from a handful to thousands from run
    to run on medium); tests/parallel/test_keep_memory.py holds the call's effect."""
    pytest.importorskip("torch")  # the peer; CI installs the torch extra
    out = subprocess.run([sys.executable, str(SCRIPT), "--config", "medium", "--repeats", "1",
                          "--rounds", "2"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    rows = re.findall(r"^\| (glibc default|kept memory) \| (yes|no) \| (alone|after the peer) "
                      r"\| [\d.]+ \| [\d.]+ \| [\d,]+ \| [\d.]+ \|$", out.stdout, re.M)
    assert sorted(rows) == sorted((start, call, m) for start, call in (
        ("glibc default", "no"), ("kept memory", "no"), ("glibc default", "yes"))
        for m in ("alone", "after the peer")), out.stdout
    made, first = out.stdout.splitlines()[:2]
    assert made == ("# made by: python benchmarks/memory/alloc_effects.py --config medium "
                    "--repeats 1 --rounds 2"), made
    assert first.startswith("commit ") and "glibc" in first, first
