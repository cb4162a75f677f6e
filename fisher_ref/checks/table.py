"""The verify table: one row (:class:`Check`) and its fixed-width text rendering
(:func:`format_table`). The rows are made in :mod:`fisher_ref.checks.identities`.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Check", "format_table"]


@dataclass
class Check:
    """One row of the verify table."""

    identity: str
    stream: str
    check: str
    value: float
    tol: float
    kind: str = "equal"
    note: str = ""

    @property
    def passed(self):
        if self.kind == "info":
            return True
        if self.kind == "nonzero":
            return bool(self.value > self.tol)
        return bool(np.isfinite(self.value) and self.value <= self.tol)


def format_table(rows):
    """Render :class:`Check` rows as a fixed-width text table.

    Raises:
        TypeError: ``rows`` is not a sequence of :class:`Check` (for example the
            ``(result, rows)`` pair :func:`~fisher_ref.checks.identities.verify_task`
            returns: pass its second item).
    """
    if isinstance(rows, tuple) and len(rows) == 2 and isinstance(rows[1], list):
        raise TypeError("format_table takes the rows, not verify_task's (result, rows) pair: "
                        "result, rows = verify_task(task); format_table(rows)")
    bad = [r for r in rows if not isinstance(r, Check)]
    if bad:
        raise TypeError(f"format_table takes Check rows; got a {type(bad[0]).__name__}")
    head = ("identity", "stream", "check", "value", "tolerance", "result")
    body = []
    for r in rows:
        res = {True: "PASS", False: "FAIL"}[r.passed] if r.kind != "info" else "info"
        tol = {"info": "-", "nonzero": f"> {r.tol:.0e}", "z": f"|z| <= {r.tol:.2f}"}.get(
            r.kind, f"<= {r.tol:.0e}")
        check = r.check + (f"  [{r.note}]" if r.note else "")
        body.append((r.identity, r.stream, check, f"{r.value:.3g}", tol, res))
    widths = [max(len(x[i]) for x in body + [head]) for i in range(len(head))]
    line = lambda x: "  ".join(s.ljust(w) for s, w in zip(x, widths)).rstrip()
    return "\n".join([line(head), line(["-" * w for w in widths])] + [line(x) for x in body])


