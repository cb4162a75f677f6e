"""The verify table (fisher_ref.checks.table): a Check row's verdict by its kind, the
rendered table, and the refusal of verify_task's (result, rows) pair."""
import pytest

from fisher_ref import load_config
from fisher_ref.checks.identities import verify_task
from fisher_ref.checks.table import Check, format_table
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
