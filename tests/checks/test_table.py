"""The verify table (fisher_ref.checks.table): a Check row's verdict by its kind, the
rendered table, and the refusal of verify_task's (result, rows) pair."""
import pytest

from fisher_ref import load_config
from fisher_ref.checks.identities import verify_task
from fisher_ref.checks.table import TABLE_WIDTH, Check, format_table
from fisher_ref.checks.tolerances import rel_err


def test_rel_err_and_table():
    assert rel_err([1.0, 2.0], [1.0, 2.0]) == 0.0
    assert rel_err([0.0], [0.0]) == 0.0
    assert rel_err([1.0, 2.0], [1.0, 2.2]) == pytest.approx(0.2 / 2.2)
    rows = [Check("3 x", "policy", "a = b", 1e-16, 1e-10), Check("3 x", "policy", "a = b", 1.0, 1e-10),
            Check("8", "policy", "overlap", 0.5, 0.0, "info"),
            Check("off", "raw", "nonzero", 0.0, 1e-8, "nonzero")]
    assert [r.passed for r in rows] == [True, False, True, False]
    table = format_table(rows)
    assert table.count("PASS") == 1 and table.count("FAIL") == 2 and "info" in table


def test_format_table_refuses_the_pair_verify_task_returns():
    out = verify_task(load_config("tabular"), mc=0, progress=False)
    with pytest.raises(TypeError, match=r"not verify_task's \(result, rows\) pair"):
        format_table(out)
    assert format_table(out[1]).splitlines()[0].startswith("identity")


def test_format_table_puts_notes_in_a_legend_and_wraps_within_the_width():
    long_check = "a check whose wording is far longer than the column it is given " * 2
    rows = [Check("1 zero-mean score", "policy", "max |E[h]|", 1e-17, 1e-10, "zero", "a note"),
            Check("1 zero-mean score", "policy", long_check.strip(), 1e-17, 1e-10, "zero",
                  "a note"),
            Check("8 overlap (diagnostic)", "centered", "overlap", 0.5, 0.0, "info",
                  "another note " * 12)]
    table = format_table(rows)
    lines = table.splitlines()
    assert max(len(line) for line in lines) <= TABLE_WIDTH == 100
    assert lines.count("1 zero-mean score") == 1            # the label once, its rows under it
    assert "max |E[h]| [1]" in table and table.count("[1]") == 3   # one note, listed once
    assert "\nnotes:\n[1] a note\n[2] another note" in table
    assert "far longer" in table and "PASS" in table and "info" in table
    narrow = format_table(rows, width=80)
    assert max(len(line) for line in narrow.splitlines()) <= 80
