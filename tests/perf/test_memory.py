"""Peak resident memory (fisher_ref.perf.memory): a process's own high-water mark, which
grows by what it allocates and touches, and which a child does not inherit from a larger
parent."""
import os
import platform
import subprocess
import sys

import pytest

from fisher_ref.perf.memory import (MemoryConditionError, check_memory_condition,
                                    freed_memory_reused, peak_rss_bytes, probe_process)

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


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc variables")
def test_the_probe_tells_kept_memory_from_memory_handed_back():
    """glibc's defaults hand a freed 64 MiB block back; KEEP_MEMORY keeps it; a threshold
    below the block (as a glibc that refuses a higher one leaves it), or no trim
    threshold, hands it back again; a large top pad keeps it."""
    from fisher_ref.perf.bench import KEEP_MEMORY
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert probe_process(env) is False
    assert probe_process({**env, **KEEP_MEMORY}) is True
    assert probe_process({**env, **KEEP_MEMORY, "MALLOC_MMAP_THRESHOLD_": str(32 * MiB)}) \
        is False
    assert probe_process({**env, "MALLOC_MMAP_THRESHOLD_": KEEP_MEMORY[
        "MALLOC_MMAP_THRESHOLD_"]}) is False
    assert probe_process({**env, "MALLOC_TOP_PAD_": str(2 ** 30)}) is True


def test_the_condition_check_names_what_was_asked_and_what_happened():
    check_memory_condition(True, True)
    check_memory_condition(False, False)
    check_memory_condition(False, None)  # cannot tell (no /proc): the default stands
    with pytest.raises(MemoryConditionError, match="^x asks for kept memory, but a process "
                                                   "started alike gave the probe no clear"):
        check_memory_condition(True, None, "x")
    with pytest.raises(MemoryConditionError, match="^y asks for the C library's default.*"
                                                   "settings in its environment: "
                                                   "MALLOC_TOP_PAD_=1"):
        check_memory_condition(False, True, "y", {"MALLOC_TOP_PAD_": "1", "HOME": "/"})


def test_the_probe_answers_none_where_it_cannot_read_the_resident_size(monkeypatch):
    import fisher_ref.perf.memory as memory
    monkeypatch.setattr(memory, "_rss_bytes", lambda: None)  # no /proc/self/status
    assert freed_memory_reused() is None
    with pytest.raises(MemoryConditionError, match="no clear answer"):
        check_memory_condition(True, freed_memory_reused())


def test_the_probe_runs_this_code_whatever_the_working_directory_holds(tmp_path, monkeypatch):
    """A fisher_ref package in the working directory (another checkout) is not what the
    probe imports: it runs this file by its path."""
    fake = tmp_path / "fisher_ref" / "perf"
    fake.mkdir(parents=True)
    for d in (tmp_path / "fisher_ref", fake):
        (d / "__init__.py").write_text("")
    (fake / "memory.py").write_text("def freed_memory_reused(n):\n    return 'fake'\n")
    monkeypatch.chdir(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    assert probe_process(env) in (False, None)  # this file's answer, never the fake's


def test_a_probe_that_cannot_answer_says_why():
    with pytest.raises(MemoryConditionError, match="did not run to an answer.*its errors"):
        probe_process({"PATH": os.environ.get("PATH", ""), "PYTHONHOME": "/nonexistent"})
