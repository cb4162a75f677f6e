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


_CHILD = r'''
import atexit, json, os, runpy, sys, time
import fisher_ref.cli.compare as c
out, marker, stage = sys.argv[1:4]
row = {"quantity": "q", "dtype": "float64", "device": "cpu", "max_abs_error": 0.0,
       "max_rel_error": 0.0, "test": "rel", "statistic": 0.0, "tolerance": 1e-10,
       "passed": True}
c.compare = lambda task, **kw: [row]  # the torch run is not what is tested here

def hold():  # say where we are, then wait for the signal
    open(marker, "w").close()
    time.sleep(20)

if stage == "writing":  # the temporary file holds half the rows
    def dump(obj, fh, **kw):
        fh.write("{\"rows\": [")
        fh.flush()
        hold()
    c.json = type("J", (), {"dump": staticmethod(dump)})
elif stage == "printing":  # the rows written, the table being printed
    real = c.format_table
    c.format_table = lambda *a, **k: (hold(), real(*a, **k))[1]
else:  # "exiting": the run is over, the interpreter shuts down
    atexit.register(lambda: (open(marker, "w").close(), time.sleep(2)))
sys.argv = ["fisher_ref", "compare", "--config", "tabular", "--device", "cpu", "--json", out]
runpy.run_module("fisher_ref", run_name="__main__")
'''


@pytest.mark.parametrize("stage", ["writing", "printing", "exiting"])
def test_sigterm_during_compare_json_leaves_no_file_and_exits_143(tmp_path, stage):
    """issue 46 item 7: SIGTERM during ``compare --json`` left the JSON output behind and
    exited -15. Inside the run (the temporary file half written, or the table being
    printed) nothing is left and the exit is 143; once the run is over (the output in
    place) the shutdown ends with the run's own code 0, not -15."""
    import os
    import signal
    import subprocess
    import sys
    import time
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    outdir, marker = tmp_path / "out", tmp_path / "marker"
    outdir.mkdir()
    out = outdir / "rows.json"
    child = subprocess.Popen([sys.executable, "-c", _CHILD, str(out), str(marker), stage],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        while not marker.exists() and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert marker.exists(), child.communicate()
        child.send_signal(signal.SIGTERM)
        _, err = child.communicate(timeout=30)
    finally:
        child.kill()
    err = err.decode()
    if stage == "exiting":
        assert child.returncode == 0, err
        assert json.loads(out.read_text())["rows"][0]["passed"]
    else:
        assert child.returncode == 143, err
        assert "terminated (SIGTERM)" in err and "Traceback" not in err
        assert list(outdir.iterdir()) == []  # neither the output nor a temporary file
