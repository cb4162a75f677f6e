"""docs/cheatsheet.md read back against the code: its verify labels are the labels verify
prints (all of them), its lessons exist, its result fields are attributes of a result."""
import re
from pathlib import Path

import pytest

from fisher_ref import exact, load_config
from fisher_ref.checks.identities import exact_checks

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "cheatsheet.md"


def rows(text):
    """``[(identity, lessons, labels, fields)]`` from the cheat sheet's table."""
    out = []
    for line in text.splitlines():
        if line.startswith("| ") and not line.startswith(("| no.", "|---")):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            assert len(cells) == 5, line
            out.append((cells[0], re.findall(r"\]\(([^)]+)\)", cells[2]),
                        re.findall(r"`([^`]+)`", cells[3]), re.findall(r"`([^`]+)`", cells[4])))
    return out


@pytest.fixture(scope="module")
def table():
    return rows(PAGE.read_text())


@pytest.fixture(scope="module")
def result():
    return exact(load_config("offpolicy_temperature"), progress=False)


def test_rows_reads_the_cells():
    line = "| 1 x | $a$ | [1](l.ipynb) | `1 zero-mean score` | `r.score_mean`, `r.bound` |"
    assert rows(line) == [("1 x", ["l.ipynb"], ["1 zero-mean score"], ["r.score_mean", "r.bound"])]


def test_every_verify_label_is_on_the_cheat_sheet_and_no_other(table, result):
    printed = {row.identity for row in exact_checks(result)} - {"-"}
    listed = {label for _, _, labels, _ in table for label in labels}
    assert listed == printed, (listed ^ printed)


def test_every_lesson_link_and_result_field_exists(table, result):
    assert len(table) == 9
    for identity, lessons, _, fields in table:
        assert lessons, identity
        for link in lessons:
            assert (ROOT / "docs" / link).parent.name == "lessons"
            assert (ROOT / "lessons" / Path(link).name).is_file(), link
        for field in fields:
            value = eval(field, {}, {"r": result})  # noqa: S307 - the page's own expressions
            assert value is not None, (identity, field)
