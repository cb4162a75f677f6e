"""The extras tables of README.md, CONTRIBUTING.md and docs/getting_started.md list every extra
of pyproject.toml with exactly its packages; the documentation commands install the CPU build
of torch before the ``docs`` extra, whose quizzes are clickable (``jupyterquiz``)."""
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = ["README.md", "CONTRIBUTING.md", "docs/getting_started.md"]


def extras():
    """``{extra: [package, ...]}`` from pyproject.toml (names without version bounds)."""
    spec = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {name: [re.split(r"[<>=!~\[; ]", req)[0] for req in reqs]
            for name, reqs in spec["optional-dependencies"].items()}


def table(text):
    """``{extra: [package, ...]}`` from the ``| extra | adds | for |`` table of ``text``."""
    start = text.index("| extra | adds | for |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0].strip("`")] = re.findall(r"`([^`]+)`", cells[1])
    return rows


def test_table_reads_a_row():
    text = "| extra | adds | for |\n|---|---|---|\n| `a` | `x`, `y-z` | it |\n\nafter"
    assert table(text) == {"a": ["x", "y-z"]}


@pytest.mark.parametrize("page", PAGES)
def test_extras_table_is_complete(page):
    listed = table((ROOT / page).read_text())
    wanted = extras()
    assert set(listed) == set(wanted), (page, set(wanted) ^ set(listed))
    for name, packages in wanted.items():
        assert sorted(listed[name]) == sorted(packages), (page, name)


def test_docs_extra_has_clickable_quizzes_and_its_commands_install_cpu_torch_first():
    assert "jupyterquiz" in extras()["docs"] and "torch" in extras()["docs"]
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if 'pip install -e ".[docs]"' in line]
    assert commands and all(line.startswith("pip install torch==2.13.0 && ") for line in commands)
    ci = (ROOT / ".ci" / "run").read_text()
    docs_step = ci[ci.index("# The documentation site"):]
    assert docs_step.index('"torch==2.13.0"') < docs_step.index('-e ".[docs]"')
    assert "docs/check_site.py" in docs_step and "apt-get install" in docs_step
