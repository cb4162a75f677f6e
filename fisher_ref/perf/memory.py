"""Peak resident memory of this process, as the benchmarks and memory tests report it."""
from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_bytes"]


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
