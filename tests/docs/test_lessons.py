"""The lesson notebooks: generated from lessons/build.py, valid, stored without
outputs, laid out as a path (objectives, prerequisites, takeaways, links that
resolve), and executed top to bottom in a real kernel.

The kernel is the interpreter running the tests (``sys.executable``), through a
kernelspec written to a temporary directory, so a stale user-level ``python3``
kernelspec cannot point the run at another environment; ``PYTHONPATH`` puts this
checkout first, so the kernel imports the fisher_ref under test.
"""
import importlib.util
import json
import os
import re
import sys
import time
from pathlib import Path

import nbformat
import pytest
from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import KernelManager
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[2]
LESSONS = ROOT / "lessons"
# Each notebook should run in under a minute; the time is measured and printed (run with -s),
# not asserted: these machines are shared and a wall time is noise. A cell that hangs fails
# through nbclient's explicit per-cell timeout.
CELL_TIMEOUT = 60
STARTUP_TIMEOUT = 120


def _load_build():
    spec = importlib.util.spec_from_file_location("lessons_build", LESSONS / "build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


BUILD = _load_build()
STEMS = list(BUILD.LESSONS)
EXPECTED = ["00_start_here", "01_sequence_to_tokens", "02_pairwise_differences", "03_where_mass_lands",
            "04_gradient_is_covariance", "05_offpolicy_centering", "06_monte_carlo",
            "07_transformer", "08_rl_estimators"]


def test_wide_output_finds_a_printed_line_over_the_limit():
    nb = nbformat.v4.new_notebook()
    cell = nbformat.v4.new_code_cell("print(...)")
    cell.id = "x-01"
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout",
                                           text="short\n" + "w" * 89 + "\n")]
    nb.cells.append(cell)
    assert BUILD.MAX_PRINTED == 88 and BUILD.wide_output(nb) == [("x-01", "w" * 89)]
    cell.outputs[0]["text"] = "w" * 88
    assert BUILD.wide_output(nb) == []


def test_all_lessons_are_built_in_reading_order():
    assert STEMS == EXPECTED
    stored = sorted(p.stem for p in LESSONS.glob("*.ipynb"))
    assert stored == EXPECTED, "a stored notebook has no source in lessons/lesson_cells (or vice versa)"


@pytest.mark.parametrize("stem", EXPECTED)
def test_regenerating_changes_nothing(stem):
    path = LESSONS / f"{stem}.ipynb"
    assert path.read_text() == BUILD.render(stem), (
        f"{path.name} differs from lessons/build.py's output; run `python lessons/build.py`")


@pytest.mark.parametrize("stem", EXPECTED)
def test_notebook_is_valid_without_outputs(stem):
    nb = nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4)
    nbformat.validate(nb)
    ids = [c.id for c in nb.cells]
    assert all(ids) and len(set(ids)) == len(ids), "cell ids must be present and unique"
    for c in nb.cells:
        if c.cell_type == "code":
            assert c.outputs == [] and c.execution_count is None, f"cell {c.id} stores output"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")


@pytest.mark.parametrize("stem", EXPECTED)
def test_lessons_define_no_library_code(stem):
    """Notebooks import from fisher_ref; no function or class definitions beyond a tiny helper."""
    nb = nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4)
    src = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    assert "from fisher_ref" in src
    assert "class " not in src
    assert src.count("def ") <= 1, "lessons may hold at most one small helper function"


def _markdown(stem):
    nb = nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4)
    return [c.source for c in nb.cells if c.cell_type == "markdown"]


@pytest.mark.parametrize("stem", EXPECTED)
def test_lesson_opens_with_objectives_and_ends_with_takeaways(stem):
    md = _markdown(stem)
    assert "**Learning objectives.**" in md[0] and "**Prerequisites.**" in md[0]
    assert md[-1].startswith("## Takeaways")


@pytest.mark.parametrize("stem", EXPECTED)
def test_previous_and_next_links_resolve(stem):
    """First and last cells link to the neighbours in reading order; every .ipynb link in the
    notebook points at a file that exists."""
    md = _markdown(stem)
    k = EXPECTED.index(stem)
    for cell in (md[0], md[-1]):
        if k > 0:
            assert f"]({EXPECTED[k - 1]}.ipynb)" in cell
        if k + 1 < len(EXPECTED):
            assert f"]({EXPECTED[k + 1]}.ipynb)" in cell
        else:
            assert "Next:" in cell  # the last lesson says what comes next
    for target in re.findall(r"\]\(([^)\s]+\.ipynb)\)", "\n".join(md)):
        assert (LESSONS / target).is_file(), f"{stem} links to missing {target}"


def test_start_here_links_every_lesson():
    text = "\n".join(_markdown("00_start_here"))
    for stem in EXPECTED[1:]:
        assert f"]({stem}.ipynb)" in text


@pytest.fixture(scope="module")
def kernel_specs(tmp_path_factory):
    """A kernelspec that runs ipykernel in this very interpreter."""
    kdir = tmp_path_factory.mktemp("kernels")
    spec_dir = kdir / "fisher_ref_test"
    spec_dir.mkdir()
    (spec_dir / "kernel.json").write_text(json.dumps({
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "fisher_ref test kernel", "language": "python"}))
    ksm = KernelSpecManager(kernel_dirs=[str(kdir)])
    assert ksm.get_kernel_spec("fisher_ref_test").argv[0] == sys.executable
    return ksm


@pytest.mark.slow
@pytest.mark.parametrize("stem", EXPECTED)
def test_notebook_executes_top_to_bottom(stem, kernel_specs, monkeypatch):
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    nb = nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4)
    km = KernelManager(kernel_name="fisher_ref_test", kernel_spec_manager=kernel_specs)
    client = NotebookClient(nb, km=km, timeout=CELL_TIMEOUT, startup_timeout=STARTUP_TIMEOUT,
                            resources={"metadata": {"path": str(LESSONS)}})
    t0 = time.perf_counter()
    try:
        client.execute()
    finally:
        if km.has_kernel:
            km.shutdown_kernel(now=True)
    seconds = time.perf_counter() - t0
    print(f"{stem}: {seconds:.1f} s (kernel start included)")
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
              if o.output_type == "error"]
    assert not errors
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code"
                     for o in c.outputs if o.output_type == "stream")
    wide = BUILD.wide_output(nb)
    assert not wide, f"printed lines wider than {BUILD.MAX_PRINTED} characters: {wide[:3]}"
    results = [o for c in nb.cells if c.cell_type == "code" for o in c.outputs
               if o.output_type == "execute_result"]
    assert not results, "a cell echoes a value (check() must not show a bare True/False)"
    assert "not answered yet" in text, "the quiz checks must run unattended"
    assert "not tried yet" in text, "the exercise checks must run unattended"


def test_sharp_bits_page_is_generated_from_the_quizzes():
    assert BUILD.SHARP_BITS.read_text() == BUILD.sharp_bits(), (
        "docs/sharp_bits.md differs from lessons/build.py's output; run `python lessons/build.py`")
    text = BUILD.sharp_bits()
    from fisher_ref.teaching.quizzes import QUIZZES
    for q in QUIZZES.values():  # every wrong option is a belief, linked to its refutation
        assert f"<refute-{q.id}>" in text
        for k, option in enumerate(q.options):
            assert (f"- *Belief:* {option} " in text) == (k != q.correct), (q.id, k)


@pytest.mark.parametrize("stem", EXPECTED)
@pytest.mark.parametrize("clickable", [True, False])
def test_site_copy_adds_a_download_a_launch_line_and_true_quiz_notes(stem, clickable):
    nb = BUILD.site_notebook(stem, clickable)
    stored = nbformat.read(LESSONS / f"{stem}.ipynb", as_version=4)
    home = nb.cells[1].source
    assert f"{{download}}`Download the notebook <../../lessons/{stem}.ipynb>`" in home
    assert f"jupyter lab lessons/{stem}.ipynb" in home
    assert (ROOT / "docs" / "lessons" / "../../lessons" / f"{stem}.ipynb").resolve().is_file()
    quizzes = [BUILD.quiz_id(c) for c in stored.cells if BUILD.quiz_id(c)]
    notes = [c.source for c in nb.cells if c.source.startswith("(refute-")]
    assert [n.split(")=")[0].removeprefix("(refute-") for n in notes] == quizzes
    assert all(BUILD.QUIZ_NOTES[clickable] in n for n in notes)
    assert len(nb.cells) == len(stored.cells) + 1 + len(quizzes)
    assert not any("](../docs/" in c.source for c in nb.cells)
    nbformat.validate(nb)


def test_quiz_notes_say_what_the_page_shows():
    assert "Click an option" in BUILD.QUIZ_NOTES[True]
    assert "Click" not in BUILD.QUIZ_NOTES[False] and "as text" in BUILD.QUIZ_NOTES[False]


@pytest.mark.parametrize("stem", EXPECTED)
def test_links_into_the_documentation_resolve(stem):
    """A lesson links a documentation page as ../docs/<page>.md (the repository's layout);
    the site's copy links it as ../<page>.md."""
    for target in re.findall(r"\]\((\.\./docs/[^)#\s]+)", "\n".join(_markdown(stem))):
        assert (LESSONS / target).is_file(), f"{stem} links to missing {target}"


def test_last_lesson_links_what_comes_next():
    last = _markdown(EXPECTED[-1])[-1]
    nxt = last[last.index("Next:"):]
    assert re.findall(r"\]\(\.\./docs/check/\w+\.md\)", nxt), nxt
