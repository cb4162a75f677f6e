"""fisher_ref.version: the one place the version is written; the package root, the build
and the golden files' generator field all read it."""
import json
import re
import tomllib
from pathlib import Path

import fisher_ref
import fisher_ref.version as version
from fisher_ref.golden.export import export_golden, golden_task
from fisher_ref.golden.format import read_members

ROOT = Path(__file__).resolve().parents[1]


def test_the_root_version_is_this_modules():
    assert fisher_ref.__version__ is version.__version__
    # a public PEP 440 release: N(.N)*, optionally aN / bN / rcN, .postN, .devN
    assert re.fullmatch(r"\d+(\.\d+)*((a|b|rc)\d+)?(\.post\d+)?(\.dev\d+)?",
                        version.__version__), version.__version__


def test_the_build_reads_the_version_from_this_module():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "fisher_ref.version.__version__"}


def test_a_golden_file_names_this_version_as_its_generator(tmp_path):
    path = export_golden(golden_task("tabular"), tmp_path / "tabular.npz")
    meta = json.loads(str(read_members(path)["meta"]))
    assert meta["generator"] == f"fisher_ref {version.__version__}"
