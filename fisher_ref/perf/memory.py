"""Peak resident memory of this process, as the benchmarks and memory tests report it."""
from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_bytes", "freed_memory_reused"]


def peak_rss_bytes():
    """This process's peak resident set size in bytes.

    On Linux it is ``VmHWM`` from ``/proc/self/status``: the high-water mark of this
    address space. ``getrusage``'s ``ru_maxrss`` is not used there because Linux keeps
    it across ``fork`` and ``exec``: a child started from a large process (a test
    worker) reports at least its parent's peak. Elsewhere ``ru_maxrss`` (bytes on
    macOS, KiB on other systems).

    Example:
        >>> peak_rss_bytes() > 0
        True
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def freed_memory_reused(nbytes=64 << 20):
    """Whether this process's allocator hands a freed block of ``nbytes`` to the next
    allocation of that size without the kernel faulting its pages in again: ``True`` or
    ``False``, measured (two allocations of ``nbytes``, filled with ones, and their minor page
    faults); ``None`` when the first allocation faulted too few pages to tell (it reused
    memory freed earlier, or the system does not count faults).

    glibc hands a block above its mmap threshold back to the system when it is freed, so
    the answer is ``False`` with its default settings and ``True`` with
    :data:`fisher_ref.perf.bench.KEEP_MEMORY` set when the process started; a glibc that
    refuses so high a threshold answers ``False`` even then. The default size lies above
    the highest threshold glibc accepts by ``mallopt`` (32 MiB on 64-bit systems). Run it
    before a process's own work, which may leave freed blocks of that size behind.
    """
    import numpy as np

    def faults():
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = np.ones(nbytes // 8)
        f1 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        del block
        return f1 - f0

    first, second = faults(), faults()
    if first < 8:  # a huge page holds 2 MiB: 64 MiB fault at least 32 times when fresh
        return None
    return 4 * second < first
