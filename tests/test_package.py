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


@pytest.mark.parametrize("name", ["exact", "token_fisher"])
def test_submodule_import_does_not_shadow_the_function(name):
    # Import the submodule first (as fisher_ref.training does for exact), then the name.
    out = run_python(f"import importlib, fisher_ref; m = importlib.import_module('fisher_ref.{name}')\n"
                     f"from fisher_ref import {name} as f\n"
                     f"import fisher_ref.{name} as g\n"
                     f"print(callable(f), type(f).__name__, f is getattr(m, '{name}'), f is g)")
    assert out == "True function True True"


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
