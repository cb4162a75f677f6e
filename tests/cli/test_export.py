"""``python -m fisher_ref export`` and ``regenerate`` (fisher_ref.cli.export): what is
written and said, in process and in a subprocess, and outputs that cannot be written
refused before any work."""
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fisher_ref import cli
from fisher_ref.golden.check import GOLDEN_DIR, compare_golden, golden_path
from fisher_ref.golden.export import size_table_row
from fisher_ref.golden.format import load_golden
from tests.cli.test_bad_input import run_cli
from tests.golden.test_export import REGENERATION_RTOL

ROOT = Path(__file__).resolve().parents[2]


def test_export_command_through_cli_main(tmp_path, capsys):
    out = tmp_path / "X.npz"
    assert cli.main(["export", "--config", "default", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    digest = hashlib.sha256(out.read_bytes()).hexdigest()
    assert str(out) in text and digest in text and f"{out.stat().st_size:,} bytes" in text
    assert compare_golden(golden_path("default"), out, rtol=REGENERATION_RTOL).passed


def test_export_without_matrices(tmp_path, capsys):
    out = tmp_path / "X.npz"
    assert cli.main(["export", "--config", "tabular", "--out", str(out), "--matrices", "no"]) == 0
    g = load_golden(out)
    assert not g.meta["matrices"] and "sequence_fisher_matrix" not in g
    assert "matrices no" in capsys.readouterr().out


def test_export_command_in_a_subprocess(tmp_path):
    out = tmp_path / "X.npz"
    task = GOLDEN_DIR / "tasks" / "t5_rounded.json"
    proc = subprocess.run([sys.executable, "-m", "fisher_ref", "export", "--task", str(task),
                           "--out", str(out)], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "arrays" in proc.stdout and hashlib.sha256(out.read_bytes()).hexdigest() in proc.stdout
    assert compare_golden(golden_path("t5_rounded"), out, rtol=REGENERATION_RTOL).passed


def test_regenerate_command_writes_the_table(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "fisher_ref", "regenerate",
                           str(tmp_path), "--names", "tabular"], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[0] == size_table_row(tmp_path / "tabular.npz")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tabular.npz"]


def test_export_command_requires_out(capsys):
    assert cli.main(["export", "--config", "default"]) == 2  # argparse's usage error
    assert "--out" in capsys.readouterr().err


@pytest.mark.parametrize("out", ["", "DIR", "missing/x.npz"])
def test_export_to_a_bad_path_exits_2_and_leaves_nothing(tmp_path, capsys, out):
    target = {"": "", "DIR": str(tmp_path), "missing/x.npz": str(tmp_path / "missing" / "x.npz")}
    before = sorted(os.listdir(tmp_path))
    assert cli.main(["export", "--config", "tabular", "--out", target[out]]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and (target[out] in err or "path is required" in err)
    assert sorted(os.listdir(tmp_path)) == before


def test_regenerate_refuses_a_missing_directory(tmp_path, capsys):
    rc, err = run_cli(["regenerate", str(tmp_path / "no" / "such"), "--names", "tabular"],
                      capsys)
    assert rc == 2 and "does not exist" in err and not (tmp_path / "no").exists()
    os.mkfifo(tmp_path / "tabular.npz")
    rc, err = run_cli(["regenerate", str(tmp_path), "--names", "tabular"], capsys)
    assert rc == 2 and "FIFO" in err


def test_export_out_dash_is_refused_naming_out(tmp_path, capsys, monkeypatch):
    """issue 46 item 18: ``export --out -`` wrote a zip file literally named ``-``; it is
    refused (exit 2) naming --out, and nothing is written. ``./-`` is a file name."""
    monkeypatch.chdir(tmp_path)
    assert cli.main(["export", "--config", "tabular", "--out", "-"]) == 2
    err = capsys.readouterr().err
    assert "--out '-'" in err and "standard output" in err and "./-" in err
    assert os.listdir(tmp_path) == []
