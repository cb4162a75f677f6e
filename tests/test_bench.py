"""The side-by-side benchmark (fisher_ref.bench); wall times are never asserted."""
import json

import pytest
torch = pytest.importorskip("torch", reason="the torch extra is needed (CI installs it)")

from fisher_ref import load_config
from fisher_ref.bench import MEASUREMENTS, bench, format_table, measurements
from fisher_ref.cli import main

pytestmark = pytest.mark.torch


def test_bench_reports_positive_ratio():
    res = bench(load_config("no_eos"), repeats=2, names=["fisher_ref", "torch_cpu_float64"])
    assert set(res["times"]) == {"fisher_ref", "torch_cpu_float64"}
    assert all(len(t) == 2 and min(t) > 0 for t in res["times"].values())
    assert res["ratio"]["torch_cpu_float64"] > 0
    assert res["ratio"]["torch_cpu_float64"] == pytest.approx(
        res["median"]["fisher_ref"] / res["median"]["torch_cpu_float64"])
    table = format_table(res)
    assert "ratio fisher_ref/torch_cpu_float64 = " in table and "median s" in table


def test_cli_bench_prints_ratio_and_json(tmp_path, capsys):
    path = tmp_path / "bench.json"
    rc = main(["bench", "--config", "default", "--repeats", "1", "--device", "cpu",
               "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ratio fisher_ref/torch_cpu_float64 = " in out
    data = json.loads(path.read_text())
    assert data["task"] == "default" and data["ratio"]["torch_cpu_float64"] > 0


def test_measurements_are_functions_of_the_task():
    assert {"fisher_ref", "torch_cpu_float64", "torch_cuda_float64"} <= set(MEASUREMENTS)
    fn = MEASUREMENTS["fisher_ref"](load_config("no_eos"))
    assert callable(fn)


def test_cuda_without_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measurements(None) == ["fisher_ref", "torch_cpu_float64"]
    with pytest.raises(ValueError, match="no CUDA device"):
        measurements("cuda")


def test_bad_repeats_and_names_are_refused():
    task = load_config("no_eos")
    with pytest.raises(ValueError, match="repeats must be a positive integer"):
        bench(task, repeats=0)
    with pytest.raises(ValueError, match="unknown measurements"):
        bench(task, repeats=1, names=["fisher_ref", "jax"])
