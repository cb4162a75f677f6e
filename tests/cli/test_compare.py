"""``python -m fisher_ref compare`` (fisher_ref.cli.compare): the table and its --json
file, a failing row's exit code, the --dtype list, and bad options or paths refused
before any work; tests/checks/test_compare.py tests the harness itself."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="compare runs the torch engine (the torch extra)")

import fisher_ref.torch.exact as tex  # noqa: E402
from fisher_ref import load_config  # noqa: E402
from fisher_ref.checks.compare import compare  # noqa: E402
from fisher_ref.checks.tolerances import TOLERANCES  # noqa: E402
from fisher_ref.cli import main  # noqa: E402
from fisher_ref.cli.compare import _dtype_list  # noqa: E402

pytestmark = pytest.mark.torch


def test_cli_compare_passes_and_writes_json(tmp_path, capsys):
    path = tmp_path / "cmp.json"
    rc = main(["compare", "--config", "default", "--device", "cpu", "--mc", "2000",
               "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    data = json.loads(path.read_text())
    assert data["task"] == "default" and data["device"] == "cpu"
    assert data["dtypes"] == ["float64", "float32"]
    assert data["relative_error"].startswith("max_i |torch - exact|_i / scale_i")
    rows = data["rows"]
    names = {r["quantity"] for r in rows}
    assert {"sensitivities", "sequence_fisher", "token_fisher_sum", "cross_terms", "gradient",
            "gradient_autodiff", "bound", "correlation", "states.token_fisher"} <= names
    mc = [r for r in rows if r["quantity"].startswith("mc.")]
    assert len(mc) == 2 and all(r["test"] == "bern" and r["tolerance"] == 1.0 for r in mc)
    assert all(r["max_abs_z"] >= 0 for r in mc)
    assert all(r["passed"] for r in rows)
    for r in rows:
        if r["test"] == "rel":
            assert r["tolerance"] == TOLERANCES[r["dtype"]]
            assert r["max_rel_error"] <= r["tolerance"]
    assert "max rel err" in out and "rows pass" in out


def test_perturbed_torch_value_makes_run_fail(tmp_path, monkeypatch, capsys):
    real = tex.torch_exact

    def broken(task, device="cpu", dtype="float64", **kwargs):
        out = real(task, device, dtype, **kwargs)
        F = out["streams"]["policy"]["sequence_fisher"]
        F[np.argmax(F)] *= 1 + 1e-8  # far inside float32's tolerance, far outside float64's
        return out

    monkeypatch.setattr(tex, "torch_exact", broken)
    path = tmp_path / "cmp.json"
    rc = main(["compare", "--config", "no_eos", "--device", "cpu", "--mc", "0",
               "--json", str(path)])
    assert rc == 1
    failed = [r for r in json.loads(path.read_text())["rows"] if not r["passed"]]
    assert [(r["quantity"], r["dtype"]) for r in failed] == [("sequence_fisher", "float64")]
    assert "FAILED: sequence_fisher float64" in capsys.readouterr().out


def test_dtype_option_is_repeatable_and_comma_separated():
    assert _dtype_list(None) == ["float64", "float32"]
    assert _dtype_list(["float64,bfloat16", "float32", "float64"]) == \
        ["float64", "bfloat16", "float32"]
    with pytest.raises(ValueError, match="unknown dtype 'float16'"):
        _dtype_list(["float16"])


@pytest.mark.parametrize("value", ["", ",", " , "])
def test_empty_dtype_list_exits_2_and_names_the_option(value, tmp_path, capsys):
    path = tmp_path / "cmp.json"
    assert main(["compare", "--config", "default", "--dtype", value, "--mc", "0",
                 "--json", str(path)]) == 2
    assert "no dtype to compare" in capsys.readouterr().err
    assert not path.exists()
    with pytest.raises(ValueError, match="no dtype to compare"):
        compare(load_config("default"), dtypes=[], mc=0)


def test_failed_run_leaves_no_json_file(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("simulated failure inside the torch engine")

    monkeypatch.setattr(tex, "torch_exact", crash)
    path = tmp_path / "cmp.json"
    with pytest.raises(RuntimeError, match="simulated failure"):
        main(["compare", "--config", "no_eos", "--mc", "0", "--json", str(path)])
    assert list(tmp_path.iterdir()) == []


def test_json_into_a_missing_directory_exits_2_before_running(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(tex, "torch_exact", None)  # must not be reached
    rc = main(["compare", "--config", "no_eos", "--mc", "0",
               "--json", str(tmp_path / "nowhere" / "cmp.json")])
    assert rc == 2 and "does not exist" in capsys.readouterr().err


def test_unknown_dtype_on_command_line_exits_2(capsys):
    assert main(["compare", "--config", "default", "--dtype", "half", "--mc", "0"]) == 2
    assert "unknown dtype 'half'" in capsys.readouterr().err
