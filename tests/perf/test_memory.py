"""Peak resident memory (fisher_ref.perf.memory): a process's own high-water mark, which
grows by what it allocates and touches, and which a child does not inherit from a larger
parent."""
import os
import platform
import subprocess
import sys

import pytest

from fisher_ref.perf.memory import freed_memory_reused, peak_rss_bytes

MiB = 2 ** 20
CHILD = ("import numpy as np\n"
         "from fisher_ref.perf.memory import peak_rss_bytes\n"
         "before = peak_rss_bytes()\n"
         "x = np.ones(2 ** 25)  # 256 MiB, every page written\n"
         "print(before, peak_rss_bytes(), x.nbytes)\n")


def child_peaks():
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return [int(v) for v in out.stdout.split()]


def test_the_peak_grows_by_what_the_process_touches():
    before, after, allocated = child_peaks()
    assert isinstance(peak_rss_bytes(), int) and peak_rss_bytes() > 0
    assert 0 < before < 200 * MiB  # an interpreter with numpy, far below the array
    assert after - before >= 0.95 * allocated


def test_a_child_reports_its_own_peak_not_its_parents():
    """A parent that touched 512 MiB starts a child: the child still reports its own small
    high-water mark (getrusage's ru_maxrss, kept across fork and exec, would give the
    parent's). Both run as subprocesses, so this test process stays small."""
    parent = ("import subprocess, sys\n"
              "import numpy as np\n"
              "from fisher_ref.perf.memory import peak_rss_bytes\n"
              "big = np.ones(2 ** 26)\n"
              f"child = subprocess.run([sys.executable, '-c', {CHILD!r}], capture_output=True,\n"
              "                       text=True, check=True).stdout.split()\n"
              "print(peak_rss_bytes(), big.nbytes, child[0])\n")
    out = subprocess.run([sys.executable, "-c", parent], capture_output=True, text=True,
                         timeout=240)
    assert out.returncode == 0, out.stderr
    parent_peak, big, child_before = (int(v) for v in out.stdout.split())
    assert parent_peak >= big and child_before < 200 * MiB


PROBE = "from fisher_ref.perf.memory import freed_memory_reused; print(freed_memory_reused())"


def probe_in_child(malloc):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                         timeout=120, env={**env, **malloc})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc variables")
def test_the_probe_tells_kept_memory_from_memory_handed_back():
    """glibc's defaults hand a freed 64 MiB block back; KEEP_MEMORY keeps it; a threshold
    below the block (as a glibc that caps it at 32 MiB leaves it), or no trim threshold,
    hands it back again."""
    from fisher_ref.perf.bench import KEEP_MEMORY
    assert probe_in_child({}) == "False"
    assert probe_in_child(KEEP_MEMORY) == "True"
    assert probe_in_child({**KEEP_MEMORY, "MALLOC_MMAP_THRESHOLD_": str(32 * MiB)}) == "False"
    assert probe_in_child({"MALLOC_MMAP_THRESHOLD_": KEEP_MEMORY["MALLOC_MMAP_THRESHOLD_"]}) \
        == "False"


def test_the_probe_answers_none_when_it_cannot_tell():
    """A 16 KiB block spans at most five pages: fewer than the probe needs to tell."""
    assert freed_memory_reused(16 * 1024) is None
