"""scripts/alloc_effects.py: exact's page faults and time in glibc's default memory, with
freed memory kept from the start, and after fisher_ref.keep_freed_memory()."""
import platform
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "alloc_effects.py"


def test_alloc_effects_refuses_no_repeats():
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "0"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "--repeats must be a positive integer" in out.stderr


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc settings")
def test_alloc_effects_measures_every_condition_and_the_call_stops_the_faults():
    pytest.importorskip("torch")  # the peer; CI installs the torch extra
    out = subprocess.run([sys.executable, str(SCRIPT), "--config", "medium", "--repeats", "3"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-2000:]
    faults = {(m.group(1).strip(), m.group(2).strip()): int(m.group(3).replace(",", ""))
              for m in re.finditer(r"^(glibc default|glibc keep|keep_freed_memory\(\)) +exact "
                                   r"(alone|after the peer) *: median [\d.]+ s \(best [\d.]+\); "
                                   r"minor faults ([\d,]+);", out.stdout, re.M)}
    assert len(faults) == 6, out.stdout
    assert out.stdout.startswith("commit ") and "glibc" in out.stdout.splitlines()[0]
    # medium frees its temporaries at the end of every run: glibc's defaults fault them in
    # again (thousands of pages a run); kept from the start or after the call, the next run
    # reuses them
    for kept in ("glibc keep", "keep_freed_memory()"):
        assert faults[kept, "alone"] * 4 < faults["glibc default", "alone"], (kept, faults)
