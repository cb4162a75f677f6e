"""A dependency-free progress bar on stderr, shown only once work takes a while."""
from __future__ import annotations

import sys
import time

__all__ = ["Progress"]


class Progress:
    """Print ``label [#####.....] done/total`` to stderr, after ``delay`` seconds.

    Args:
        total: units of work expected.
        label: what is being done.
        enabled: ``False`` silences it; ``None`` shows it only when ``stream``
            is a terminal.
        delay: seconds before the first line appears (quick jobs print nothing).
        stream: where to write (``sys.stderr`` by default).
        clock: a function returning seconds (``time.perf_counter`` by default; tests
            pass their own, so that nothing depends on the wall time).
    """

    def __init__(self, total, label="working", enabled=True, delay=2.0, stream=None,
                 clock=time.perf_counter):
        self.clock = clock
        self.total = max(1, int(total))
        self.label = label
        self.delay = delay
        self.stream = stream or sys.stderr
        if enabled is None:
            isatty = getattr(self.stream, "isatty", None)
            enabled = bool(isatty and isatty())
        self.enabled = bool(enabled)
        self.done = 0
        self.start = clock()
        self._last = 0.0
        self._shown = False

    def update(self, n=1):
        self.done += n
        if not self.enabled:
            return
        now = self.clock()
        if now - self.start < self.delay or now - self._last < 0.5:
            return
        self._last = now
        self._draw(now)

    def _draw(self, now):
        frac = min(1.0, self.done / self.total)
        bar = "#" * int(30 * frac) + "." * (30 - int(30 * frac))
        el = now - self.start
        eta = el / frac - el if frac > 0 else float("nan")
        self.stream.write(f"\r{self.label} [{bar}] {100 * frac:5.1f}%  {el:6.1f}s elapsed, "
                          f"~{eta:6.1f}s left")
        self.stream.flush()
        self._shown = True

    def close(self):
        if self._shown:
            self._draw(self.clock())
            self.stream.write("\n")
            self.stream.flush()
