"""The package root imports lazily (PEP 562): every public name still works, a submodule
import never replaces the function of the same name, and ``import fisher_ref`` is light."""
import json
import subprocess
import sys
import types
from pathlib import Path

import pytest

import fisher_ref

ROOT = Path(__file__).resolve().parents[1]


def run_python(code):
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=ROOT, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().splitlines()[-1]


def test_every_public_name_resolves():
    for name in fisher_ref.__all__:
        value = getattr(fisher_ref, name)
        assert not isinstance(value, types.ModuleType), name
    assert set(fisher_ref.__all__) <= set(dir(fisher_ref))


def test_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        fisher_ref.nope  # noqa: B018


def test_no_module_shares_its_name_with_a_public_function():
    """``fisher_ref.exact`` is the function only: no direct submodule of the package is named
    like a public name of the package root, so importing a submodule can never replace one."""
    import pkgutil
    modules = {m.name.rsplit(".", 1)[-1] for m in pkgutil.iter_modules(fisher_ref.__path__, "fisher_ref.")}
    public = {n for n in fisher_ref.__all__ if callable(getattr(fisher_ref, n))}
    assert not modules & public, modules & public


def test_import_is_light():
    out = run_python("import sys, json, fisher_ref\n"
                     "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in "
                     "('autograd', 'scipy', 'matplotlib', 'nbformat', 'torch'))))")
    assert json.loads(out) == []


def test_command_line_entry_point_still_works():
    proc = subprocess.run([sys.executable, "-m", "fisher_ref", "--help"], capture_output=True,
                          text=True, cwd=ROOT, timeout=120)
    assert proc.returncode == 0 and "verify" in proc.stdout and "export" in proc.stdout


def test_package_docstring_example():
    import doctest
    assert doctest.testmod(fisher_ref).failed == 0


def test_no_test_puts_its_folder_before_site_packages():
    """tests/torch would shadow torch in any process that starts from this one (the bench
    spawns its sides): the test folder is appended to sys.path, never inserted first."""
    import re
    from pathlib import Path
    tests = Path(__file__).parent
    offenders = [str(p) for p in tests.rglob("*.py")
                 if re.search(r"sys\.path\.insert\(0", p.read_text(encoding="utf-8"))
                 and p.name != "test_package.py"]
    assert not offenders, offenders
