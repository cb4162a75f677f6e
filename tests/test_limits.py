"""fisher_ref.limits: readable numbers, the limit checks, and the README's table of limits."""
import itertools
import json
import math
import re
from pathlib import Path

import pytest

from fisher_ref import limits
from fisher_ref.limits import (Cost, EnumerationTooLarge, check_cost, check_limit, check_size,
                               count_states, is_real, readable, readable_log10)

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


def _table(text, head):
    """``{first cell: [other cells]}`` of the Markdown table under the header row ``head``."""
    lines = text[text.index(head):].splitlines()[2:]
    rows = {}
    for line in lines:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows.setdefault(cells[0], []).append(cells[1:])
    return rows


def test_docs_table_of_limits_is_the_module():
    """Each row of the limits table in docs/guide/tasks.md is a constant of
    fisher_ref.limits with its value, and every constant of LIMITS_TABLE has a row."""
    rows = _table((ROOT / "docs/guide/tasks.md").read_text(), "| limit | value |")
    names = {n.strip("`"): v[0][0] for n, v in rows.items()}
    assert set(names) == {name for name, _, _ in limits.LIMITS_TABLE}
    for name, value, _ in limits.LIMITS_TABLE:
        assert float(re.sub(r"[,\s]", "", names[name])) == float(value), (name, names[name])
        assert getattr(limits, name) == value


def test_docs_table_of_model_defaults_is_the_code():
    """The model-key defaults in docs/guide/tasks.md are those the model classes use."""
    import dataclasses
    import inspect
    from fisher_ref.models.base import ModelSpec
    from fisher_ref.models.tabular import TabularModel
    from fisher_ref.models.gpt2 import GPT2Spec
    rows = _table((ROOT / "docs/guide/tasks.md").read_text(), "| arch | key | default |")
    doc = {(arch.strip("`"), cells[0].strip("`")): cells[1].strip("`")
           for arch, many in rows.items() for cells in many}
    fields = lambda cls: {f.name: f.default for f in dataclasses.fields(cls)  # noqa: E731
                          if f.default is not dataclasses.MISSING}
    code = {"mlp_window": fields(ModelSpec), "gpt2": fields(GPT2Spec),
            "tabular": {k: p.default for k, p in
                        inspect.signature(TabularModel).parameters.items()
                        if p.default is not inspect.Parameter.empty}}
    for (arch, key), text in doc.items():
        if text == "required" or key == "arch":
            continue
        archs = list(code) if arch == "all" else [arch]
        for a in archs:
            assert json.loads(text) == code[a][key], (arch, key, text, code[a][key])
    for a, defaults in code.items():  # every default of the code is in the table
        for key in set(defaults) - {"arch"}:
            assert (a, key) in doc or ("all", key) in doc, (a, key)


# ---------------------------------------------------------------- counts and refusals

def _brute_counts(V, T, eos):
    states = responses = 0
    for t in range(T + 1):
        for seq in itertools.product(range(V), repeat=t):
            ended = eos and 0 in seq[:-1]
            if ended:
                continue
            done = t == T or (eos and t > 0 and seq[-1] == 0)
            if done and t > 0:
                responses += 1
            elif t < T:
                states += 1
    return states, responses


@pytest.mark.parametrize("V, T, eos", [(V, T, e) for V in (2, 3, 4) for T in (1, 2, 3)
                                       for e in (True, False)])
def test_count_states_matches_brute_force(V, T, eos):
    assert count_states(V, T, eos) == _brute_counts(V, T, eos)
    n, m = count_states(V, T, eos, n_prompts=3)
    assert (n, m) == tuple(3 * x for x in _brute_counts(V, T, eos))


def test_check_cost_names_each_limit_it_passes():
    cost = Cost(42, 170, 119, 5, 3, 1, 42, seconds=2.0, bytes=3 * 2 ** 30)
    check_cost(cost, max_seconds=2.0, max_bytes=3 * 2 ** 30)  # at the limits: allowed
    with pytest.raises(EnumerationTooLarge, match="estimated time 2.* exceeds the limit 1 s; "
                                                  "estimated memory 3.00 GiB exceeds"):
        check_cost(cost, max_seconds=1.0, max_bytes=2 ** 30)
    with pytest.raises(ValueError, match="max_seconds must be a positive number"):
        check_cost(cost, max_seconds=0)
