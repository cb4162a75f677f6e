"""``python -m fisher_ref bench`` (fisher_ref.cli.bench): the side-by-side table and its
--json file, and --scaling DIR, which runs the scaling sweep into DIR. Wall times are
never asserted."""
import json
import platform

import pytest

import fisher_ref.cli.bench as cli_bench
from fisher_ref import cli
from fisher_ref.cli import main
from fisher_ref.perf.scaling import plot


@pytest.mark.torch
def test_cli_bench_prints_ratio_and_writes_json(tmp_path, capsys):
    pytest.importorskip("torch", reason="bench times the torch engine (the torch extra)")
    path = tmp_path / "bench.json"
    rc = main(["bench", "--config", "default", "--repeats", "1", "--device", "cpu",
               "--no-peer", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "ratio fisher_ref/torch_cpu_float64 = " in out
    data = json.loads(path.read_text())
    assert data["task"] == "default" and data["ratio"]["torch_cpu_float64"] > 0
    assert data["threads"] == 1 and "torch_cpu_float64" in data["env"]
    assert not data["keep_memory"] and len(data["kernel"]["fisher_ref"]["page_faults"]) == 1


@pytest.mark.torch
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc variables")
def test_cli_bench_keep_memory(capsys):
    pytest.importorskip("torch", reason="bench times the torch engine (the torch extra)")
    rc = main(["bench", "--config", "default", "--repeats", "1", "--device", "cpu",
               "--no-peer", "--keep-memory"])
    assert rc == 0 and "memory: freed memory kept" in capsys.readouterr().out
    assert main(["bench", "--config", "default", "--repeats", "1", "--no-peer",
                 "--keep-memory", "--in-process"]) == 2
    assert "needs one process per measurement" in capsys.readouterr().err


@pytest.mark.torch
@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc variables")
def test_cli_bench_keep_memory_the_allocator_ignores_exits_1(monkeypatch, capsys):
    """A C library that does not keep freed memory with the settings: an error message and
    exit 1, no table (a 1 MiB threshold stands in for a refused one)."""
    pytest.importorskip("torch", reason="bench times the torch engine (the torch extra)")
    import fisher_ref.perf.processes as processes
    monkeypatch.setattr(processes, "KEEP_MEMORY", {"MALLOC_MMAP_THRESHOLD_": str(2 ** 20),
                                                   "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)})
    assert main(["bench", "--config", "default", "--repeats", "1", "--device", "cpu",
                 "--no-peer", "--keep-memory"]) == 1
    out = capsys.readouterr()
    assert "asks for kept memory, but a process started alike handed a freed 64 MiB block back" \
        in out.err
    assert "ratio" not in out.out and "Traceback" not in out.err


def test_main_writes_csv_markdown_and_plot(tmp_path, capsys):
    assert main(["bench", "--scaling", str(tmp_path), "--quick"]) == 0
    assert {p.name for p in tmp_path.iterdir()} == {"scaling.csv", "scaling.md", "scaling.png"}
    budget = {"NPV": 1e5, "seconds": 0.1, "peak_bytes": 2 ** 20, "budget_bytes": 2 ** 30}
    plot([], tmp_path / "b.png", budget)
    assert (tmp_path / "b.png").stat().st_size > 0
    assert "| V | T | P |" in capsys.readouterr().out


def test_bench_scaling_flag_delegates_to_scaling(monkeypatch):
    """``python -m fisher_ref bench --scaling DIR`` runs the scaling sweep into DIR."""
    calls = []
    monkeypatch.setattr(cli_bench, "scaling_main",
                        lambda out, quick, with_budget_run: calls.append((out, quick, with_budget_run)) or 0)
    assert cli.main(["bench", "--scaling", "somewhere"]) == 0
    assert calls == [("somewhere", False, False)]
    args = cli.build_parser("bench").parse_args(["bench", "--scaling"])
    assert args.scaling == "docs"
