"""The verify table: one row (:class:`Check`) and its fixed-width text rendering
(:func:`format_table`, at most :data:`TABLE_WIDTH` columns). The rows are made in :mod:`fisher_ref.checks.identities`.
"""
from __future__ import annotations

import textwrap
from dataclasses import dataclass

import numpy as np

__all__ = ["Check", "format_table", "TABLE_WIDTH"]


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


#: The widest line :func:`format_table` writes (a terminal a newcomer opens is 100 wide or more).
TABLE_WIDTH = 100


def format_table(rows, width=TABLE_WIDTH):
    """Render :class:`Check` rows as a fixed-width text table at most ``width`` columns wide.

    Each identity's label stands on a line of its own, its checks indented under it, one
    line each (a long check wraps within its column); a row's note becomes a numbered
    marker such as ``[2]`` and the notes are listed under the table, each once.

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
    notes, body = [], []
    for r in rows:
        res = {True: "PASS", False: "FAIL"}[r.passed] if r.kind != "info" else "info"
        tol = {"info": "-", "nonzero": f"> {r.tol:.0e}", "z": f"|z| <= {r.tol:.2f}"}.get(
            r.kind, f"<= {r.tol:.0e}")
        check = r.check
        if r.note:
            if r.note not in notes:
                notes.append(r.note)
            check += f" [{notes.index(r.note) + 1}]"
        body.append((r.identity, check, r.stream, f"{r.value:.3g}", tol, res))
    head = ("check", "stream", "value", "tolerance", "result")
    widths = [max(len(x[i + 1]) for x in body + [("",) + head]) for i in range(1, 5)]
    rest = 2 + sum(w + 2 for w in widths)  # indent, and each column after the check
    check_w = max(20, min(max(len(x[1]) for x in body + [("",) + head]), width - rest))
    cols = lambda first, x: "  ".join([first.ljust(check_w)] + [s.ljust(w) for s, w in
                                                                 zip(x, widths)]).rstrip()
    out = ["identity", "  " + cols(head[0], head[1:]), "-" * min(width, rest + check_w)]
    label = None
    for ident, check, *cells in body:
        if ident != label:
            out.append(ident)
            label = ident
        lines = textwrap.wrap(check, check_w, subsequent_indent="  ") or [""]
        out.append("  " + cols(lines[0], cells))
        out += ["  " + line for line in lines[1:]]
    if notes:
        out += ["", "notes:"]
        for k, note in enumerate(notes, start=1):
            out += textwrap.wrap(note, width, initial_indent=f"[{k}] ", subsequent_indent="    ")
    return "\n".join(out)
