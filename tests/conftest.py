"""Shared fixtures: the cases of ``tests/cases.py`` with readable ids.

Set ``FISHER_REF_ERROR_TABLE=1`` to print, after the run, the largest relative
error seen on each identity across all cases.
"""
import os
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).parent))  # after site-packages: tests/torch must not shadow torch

import cases  # noqa: E402


@pytest.fixture(params=list(cases.CASES), ids=list(cases.CASES))
def case(request):
    """A case id; use ``cases.get_task/get_result/get_brute`` (cached) on it."""
    return request.param


@pytest.fixture(params=cases.offpolicy_cases(), ids=cases.offpolicy_cases())
def offcase(request):
    """A case id whose task has a sampler."""
    return request.param


def pytest_terminal_summary(terminalreporter):
    if os.environ.get("FISHER_REF_ERROR_TABLE") != "1" or not cases.ERRORS:
        return
    worst = {}
    for (identity, case), err in cases.ERRORS.items():
        if err >= worst.get(identity, (-1.0, ""))[0]:
            worst[identity] = (err, case)
    tr = terminalreporter
    tr.write_line("")
    tr.write_line(f"{'identity':58s} {'max rel. error':>14s}  worst case")
    for identity in sorted(worst):
        err, case = worst[identity]
        tr.write_line(f"{identity:58s} {err:14.2e}  {case}")
