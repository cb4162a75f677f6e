"""fisher_ref.limits: readable numbers, the limit checks, and the README's table of limits."""
import math
import re
from pathlib import Path

import pytest

from fisher_ref import limits
from fisher_ref.limits import check_limit, check_size, is_real, readable, readable_log10

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("x, text", [
    (0, "0"), (999, "999"), (10 ** 15 - 1, "999,999,999,999,999"), (10 ** 15, "1.0e+15"),
    (-(10 ** 20), "-1.0e+20"), (4 ** 1000, "1.1e+602"), (10 ** 4000, "1.0e+4000"),
    (2.5e20, "2.5e+20"), (1234.5, "1,234"), (0.25, "0.25"), (float("inf"), "inf"),
])
def test_readable(x, text):
    assert readable(x) == text


def test_readable_log10_rounds_its_mantissa():
    assert readable_log10(math.log10(9.99e100)) == "1.0e+101"  # never "10.0e+100"
    assert readable_log10(math.log10(4) * 10 ** 6) == "9.8e+602059"  # 4^(10^6)
    assert readable_log10(1e20) == "10^(1e+20)" and readable_log10(math.inf).startswith("10^")


def test_checks():
    assert check_limit(math.inf, "max_bytes") == math.inf
    for bad, exc in ((float("nan"), ValueError), (0, ValueError), (-1.0, ValueError),
                     ("1", TypeError), (None, TypeError), (True, TypeError)):
        with pytest.raises(exc, match="max_bytes must be a positive number"):
            check_limit(bad, "max_bytes")
    assert [is_real(x) for x in (1, 2.5, True, "1", None)] == [True, True, False, False, False]
    check_size(5, "n", 5)
    with pytest.raises(ValueError, match="n is 6, more than the limit 5"):
        check_size(6, "n", 5)


def test_readme_table_of_limits_is_the_module():
    """Each value in the README's table of limits is the constant in fisher_ref.limits."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| limit | value | why |"):]
    rows = {r.split("|")[1].strip(): r.split("|")[2].strip()
            for r in table.splitlines()[2:] if r.startswith("|")}
    want = {"parameters": limits.MAX_PARAMS, "`context`": limits.MAX_CONTEXT,
            "`n_layer`": limits.MAX_LAYERS, "`init_scale`": limits.MAX_INIT_SCALE,
            "`theta`": limits.MAX_ABS_THETA, "`baseline`": limits.MAX_ABS_VALUE,
            "states": limits.MAX_COUNT}
    for key, value in want.items():
        (cell,) = [v for k, v in rows.items() if key in k]
        assert float(re.sub(r"[,\s]", "", cell)) == float(value), (key, cell)
