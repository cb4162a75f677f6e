"""What each side of bench runs (fisher_ref.perf.sides): the measurements as functions of
the task, which apply to a task, and the optional peer."""
import pytest

torch = pytest.importorskip("torch", reason="bench times the torch engine (the torch extra)")

import fisher_ref.perf.sides as sides  # noqa: E402
from fisher_ref import load_config  # noqa: E402
from fisher_ref.perf.bench import bench, format_table  # noqa: E402
from fisher_ref.perf.sides import MEASUREMENTS, measurements  # noqa: E402

pytestmark = pytest.mark.torch


def test_peer_row_is_optional(tmp_path, monkeypatch):
    monkeypatch.setattr(sides, "PEER_SCRIPT", tmp_path / "absent.py")
    assert "torch_peer" not in measurements("cpu", load_config("default"))
    script = tmp_path / "torch_peer.py"
    script.write_text("def peer_exact(spec):\n    return {'fisher': len(spec['theta'])}\n")
    monkeypatch.setattr(sides, "PEER_SCRIPT", script)
    assert measurements("cpu", load_config("default"))[-2:] == ["torch_peer",
                                                                "fisher_ref_fisher"]
    assert "torch_peer" not in measurements("cpu", load_config("gpt2_small"))  # MLP only
    assert "torch_peer" not in measurements("cpu", load_config("default"), peer=False)
    res = bench(load_config("default"), repeats=2,
                names=["fisher_ref", "torch_peer", "fisher_ref_fisher"], isolate=False)
    assert res["ratio"]["torch_peer"] > 0 and "token Fisher" in res["work"]["torch_peer"]
    # the like-for-like ratio: the numpy engine doing only the peer's work
    assert res["ratio_like"]["torch_peer"] == pytest.approx(
        res["median"]["fisher_ref_fisher"] / res["median"]["torch_peer"])
    assert res["ratio_like_min"]["torch_peer"] == pytest.approx(
        res["min"]["fisher_ref_fisher"] / res["min"]["torch_peer"])
    assert "quantities='fisher'" in res["work"]["fisher_ref_fisher"]
    assert "ratio fisher_ref_fisher/torch_peer = " in format_table(res)
    assert "fisher_ref_fisher" not in res["ratio"]  # compared with the peer only
    without = bench(load_config("default"), repeats=1, names=["fisher_ref", "torch_peer"],
                    isolate=False)
    assert without["ratio_like"] == {}  # no like-for-like side, no like-for-like ratio


def test_measurements_are_functions_of_the_task():
    assert {"fisher_ref", "torch_cpu_float64", "torch_cuda_float64", "torch_peer"} <= \
        set(MEASUREMENTS)
    assert callable(MEASUREMENTS["fisher_ref"](load_config("no_eos")))


def test_cuda_without_device_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert measurements(None, peer=False) == ["fisher_ref", "torch_cpu_float64"]
    with pytest.raises(ValueError, match="no CUDA device"):
        measurements("cuda")
