"""docs/check_site.py: what it calls a problem, from a page's measurements (the browser pass
itself runs in .ci/run after the docs build, where Debian's chromium is installed)."""
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("check_site", ROOT / "docs" / "check_site.py")
check_site = importlib.util.module_from_spec(spec)
spec.loader.exec_module(check_site)


def page(**kw):
    wide = {"scrollWidth": 1280, "innerWidth": 1280, "dollars": [], "scrolling": [],
            "equations": [], "shows": 0, "quizzes": 0, "answered": 0, "downloads": []}
    wide.update(kw)
    return wide


def test_a_clean_page_has_no_problem():
    assert check_site.problems("a.html", page(), page(innerWidth=400, scrollWidth=400)) == []


def test_raw_latex_a_wide_page_and_a_hidden_equation_are_problems():
    found = check_site.problems("theory.html", page(dollars=["+ \\sum_g X$, with"],
                                                    scrollWidth=1502))
    assert any("literal $" in f for f in found) and any("1502 px wide" in f for f in found)
    narrow = page(equations=[{"hidden": True, "width": 500, "box": 368}])
    assert any("does not fit" in f for f in check_site.problems("index.html", page(), narrow))


def test_a_quiz_that_does_not_click_is_a_problem():
    ok = page(shows=3, quizzes=3, answered=3)
    assert check_site.problems("lessons/00.html", ok) == []
    static = page(shows=3, quizzes=0, answered=0)  # built without jupyterquiz
    assert "jupyterquiz" in check_site.problems("lessons/00.html", static)[0]


def test_pages_skips_the_generated_index_pages(tmp_path):
    for name in ("index.html", "genindex.html", "search.html", "_static/x.html", "a/b.html"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("<html></html>")
    assert [str(p) for p in check_site.pages(tmp_path)] == ["a/b.html", "index.html"]


def test_a_lesson_page_must_offer_its_notebook(tmp_path):
    (tmp_path / "_downloads" / "ab").mkdir(parents=True)
    (tmp_path / "_downloads" / "ab" / "00_start_here.ipynb").write_text("{}")
    good = page(downloads=["../_downloads/ab/00_start_here.ipynb"])
    assert check_site.problems("lessons/00_start_here.html", good, site=tmp_path) == []
    for bad in (page(), page(downloads=["../_downloads/zz/00_start_here.ipynb"])):
        assert check_site.problems("lessons/00_start_here.html", bad, site=tmp_path) == [
            "lessons/00_start_here.html: no download link to its notebook"]
    assert check_site.problems("lessons/index.html", page(), site=tmp_path) == []
