"""The code on every page runs: the README's and every documentation page's.

- every ` ```python ` block of ``README.md`` and of ``docs/**/*.md``, and every executed
  ` ```{code-cell} ` of a MyST notebook page, runs; the blocks of one page run in order in
  one namespace, as a reader runs them top to bottom (a ` ```py ` block is shown, not run);
- the examples that moved from the README to the site are still among them;
- the README's test command is the one ``.ci/run`` runs;
- a task-file example is a valid task, and the files the pages name exist.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```[ \t]*$", flags=re.S | re.M)


def _pages():
    """README.md, CONTRIBUTING.md (a page of the site) and the Markdown pages of docs/ (not
    the build output)."""
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md"] + sorted(
        p for p in DOCS.rglob("*.md") if "_build" not in p.relative_to(DOCS).parts)


def _blocks(path, lang):
    """The bodies of the fenced blocks of ``path`` whose info string is ``lang``."""
    return [body for info, body in FENCE.findall(path.read_text(encoding="utf-8"))
            if info.strip() == lang]


def _code_cells(path):
    """The executed cells of a MyST notebook page, their option lines removed."""
    cells = []
    for info, body in FENCE.findall(path.read_text(encoding="utf-8")):
        if info.strip().startswith("{code-cell}"):
            lines = body.splitlines(keepends=True)
            while lines and lines[0].startswith(":"):
                lines.pop(0)
            cells.append("".join(lines))
    return cells


def _runnable(path):
    return _blocks(path, "python") + _code_cells(path)


def _name(path):
    return path.relative_to(ROOT).as_posix()


PAGES_WITH_CODE = [p for p in _pages() if _runnable(p)]


@pytest.mark.parametrize("page", PAGES_WITH_CODE, ids=_name)
def test_page_code_runs(page, tmp_path, monkeypatch):
    """Each page's blocks, in order, in one namespace, in an empty working directory."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from IPython.display import display

    monkeypatch.chdir(tmp_path)
    namespace = {"__name__": "__page__", "display": display}
    try:
        for k, code in enumerate(_runnable(page)):
            exec(compile(code, f"{_name(page)} (block {k + 1})", "exec"), namespace)
    finally:
        plt.close("all")


# distinctive lines of the README's examples before they moved to the site (issue 20): each
# must still be in a block that runs
MOVED_EXAMPLES = [
    "r.cross_terms",                                     # the Python API
    "FunctionModel(logits, num_params=16",               # any autograd logits function
    "hf = to_hf(task.model, task.theta)",                # GPT-2 against transformers
    "mc = estimate(task, 20000, np.random.default_rng(0))",  # Monte Carlo
    "result = compare_to_golden({\"sequence_fisher\": w @ h ** 2",  # golden in three lines
    "@pytest.mark.parametrize(\"golden\", golden_cases())",        # golden in a test suite
    "jac = torch.func.jacrev(",                          # the GGN by torch.func
    "report = check_token_fisher(my_token_fisher",       # conformance
    "out = exact_causal_lm(TinyGRU()",                   # any torch causal LM
]


def test_moved_examples_still_run():
    code = "\n".join(c for p in PAGES_WITH_CODE for c in _runnable(p))
    missing = [line for line in MOVED_EXAMPLES if line not in code]
    assert not missing, f"examples no longer in any block that runs: {missing}"


def test_readme_test_command_is_what_ci_runs():
    """The README's set-up is two one-line commands; the second installs what CI installs
    and ends in the pytest command .ci/run runs."""
    bash = _blocks(ROOT / "README.md", "bash")
    lines = [line.strip() for b in bash for line in b.splitlines() if line.strip()]
    commands = [line[line.index("python -m pytest"):] for line in lines
                if "python -m pytest" in line]
    assert commands, "README gives no test command"
    ci = (ROOT / ".ci" / "run").read_text()
    for cmd in commands:
        assert cmd in ci, f"README test command {cmd!r} is not what .ci/run runs"
    (test_line,) = [line for line in lines if "python -m pytest" in line]
    for install in re.findall(r"pip install (\S+)", test_line):
        assert install in ci, f"README installs {install} but .ci/run does not"
    (extras,) = re.findall(r'pip install -e "(\.\[[^\]]*\])"', test_line)
    assert f'pip install -q -e "{extras}"' in ci, f"README installs {extras}; .ci/run does not"
    setup = bash[:2]  # the "Two commands" section
    assert [len(b.strip().splitlines()) for b in setup] == [1, 1], setup
    assert "python -m fisher_ref verify" in setup[0] and "python -m pytest" in setup[1]


def test_readme_docs_command_is_what_ci_runs():
    """The site's build command, as the README states it, is the one .ci/run runs."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    (cmd,) = set(re.findall(r"python -m sphinx [^`\n]*", readme))
    assert cmd.strip() in (ROOT / ".ci" / "run").read_text(), cmd


def test_readme_lists_every_lesson():
    """The README's one line per lesson names every notebook of lessons/."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stems = [p.stem for p in sorted((ROOT / "lessons").glob("[0-9]*.ipynb"))]
    assert stems, "no lessons found"
    missing = [s for s in stems if f"`{s}`" not in readme]
    assert not missing, f"README does not list the lessons {missing}"


def test_task_examples_are_valid_tasks():
    """Every task-file example (a ```json block with a max_len) loads as a task."""
    from fisher_ref import task_from_json
    examples = [(p, b) for p in _pages() for b in _blocks(p, "json") if '"max_len"' in b]
    assert any(p.name == "README.md" for p, _ in examples), "README has no task example"
    for page, block in examples:
        task = task_from_json(json.loads(block))
        assert task.max_len >= 1, _name(page)


CODE_SPAN = re.compile(r"`([^`\n]+)`")
LINK = re.compile(r"\]\(([^)\s]+)\)")
REPO_PATH = re.compile(r"^(?:fisher_ref|benchmarks|lessons|docs|tests)/[\w./-]*$")
# a module named inside the package, as the developer notes do: `engine/fast.py`
PACKAGE_PATH = re.compile(r"^(?:engine|torch|models|checks|monte_carlo|golden|cli|perf|teaching|"
                          r"estimators|distributed)/[\w/]+\.py$")


def _named_files(page):
    """(path, where it must exist) for every file a page names: a code span that is a
    repository path (`docs/cpu/`, `fisher_ref/engine/fast.py`, `engine/fast.py`) and every
    relative Markdown link (resolved from the page); placeholders like `docs/DEVICE/NAME.json`
    and globs are not paths."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))  # not inside code blocks
    for span in CODE_SPAN.findall(text):
        span = span.strip()
        if any(ch in span for ch in "*<>$ ") or any(p.isupper() for p in re.split(r"[/.]", span)):
            continue
        if REPO_PATH.match(span) and not span.startswith("docs/_build"):
            yield span, ROOT / span
        elif PACKAGE_PATH.match(span):
            yield span, ROOT / "fisher_ref" / span
    for target in LINK.findall(CODE_SPAN.sub("", text)):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        yield target, page.parent / target.split("#", 1)[0]


def _in_checkout(path):
    """Whether ``path`` exists; a lesson under ``docs/lessons/`` is the notebook of
    ``lessons/`` that docs/conf.py copies there at build time (the copies are not kept)."""
    path = path.resolve()
    lessons = (ROOT / "docs" / "lessons").resolve()
    if path.suffix == ".ipynb" and path.parent == lessons:
        return (ROOT / "lessons" / path.name).exists()
    return path.exists()


def test_files_named_on_the_pages_exist():
    """Every file a page names or links to is in the checkout (CONTRIBUTING.md names the
    homes of files yet to be written, `tests/engine/test_tree.py` for a new module, and is
    not held to this)."""
    missing = [f"{_name(page)}: {name}" for page in _pages() if page.name != "CONTRIBUTING.md"
               for name, path in _named_files(page) if not _in_checkout(path)]
    assert not missing, "pages name files that do not exist:\n" + "\n".join(missing)


def test_the_malloc_settings_the_guide_gives_are_the_ones_bench_uses():
    """docs/guide/exact.md spells out KEEP_MEMORY's variables for users to set by hand."""
    from fisher_ref.perf.bench import KEEP_MEMORY
    text = (ROOT / "docs" / "guide" / "exact.md").read_text()
    assert all(f"{k}={v}" in text for k, v in KEEP_MEMORY.items()), KEEP_MEMORY
