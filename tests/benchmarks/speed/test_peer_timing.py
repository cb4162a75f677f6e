"""The timing table of fisher_ref's exact against the torch peer
(``benchmarks/speed/peer_timing.py``): the record it writes, what it refuses. Wall times are
never asserted."""
import importlib.util
import json
from pathlib import Path

import pytest

from fisher_ref.engine.plan import Budgets
from fisher_ref.engine.keep_memory import memory_kept

pytest.importorskip("torch", reason="the torch peer needs torch (CI installs it)")

ROOT = Path(__file__).resolve().parents[3]
_spec = importlib.util.spec_from_file_location(
    "peer_timing", ROOT / "benchmarks" / "speed" / "peer_timing.py")
peer_timing = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(peer_timing)


def test_timing_script_writes_a_record_and_refuses_to_overwrite_it(tmp_path, capsys):
    """``peer_timing.py --json`` writes what the speed page quotes: timings per side, ratios,
    the commit and the memory condition. Wall times are not asserted."""
    path = tmp_path / "peer.json"
    assert peer_timing.main(["--tasks", "medium", "--repeats", "1", "--json", str(path)]) is None
    rec = json.loads(path.read_text())
    t = rec["tasks"]["medium"]
    assert rec["command"] == ("python benchmarks/speed/peer_timing.py --tasks medium --repeats 1 "
                              f"--json {path}")
    assert rec["repeats"] == 1 and rec["memory_kept"] is False and rec["commit"]
    # the last level's budget, the engine's own for this process's memory
    assert rec["sub_elements_given"] is None and rec["sub_elements"] == \
        Budgets().sub_block_elements(factored=True, kept=memory_kept())
    assert t["num_params"] == 1044 and set(t["median"]) == {"exact", "exact fisher", "peer",
                                                            "peer per h"}
    assert t["ratio"]["exact / peer"] == t["median"]["exact"] / t["median"]["peer"]
    assert all(len(v) == 1 for v in t["wall"].values())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        peer_timing.main(["--tasks", "medium", "--json", str(path)])
    assert exc.value.code == 2 and "not overwritten" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        peer_timing.main(["--repeats", "0"])
    with pytest.raises(SystemExit) as exc:
        peer_timing.main(["--json", str(tmp_path / "no such dir" / "peer.json")])
    assert exc.value.code == 2 and "the directory does not exist" in capsys.readouterr().err


def test_timing_script_records_a_budget_of_ones_own(tmp_path, capsys):
    path = tmp_path / "peer.json"
    assert peer_timing.main(["--tasks", "medium", "--repeats", "1", "--sub-elements", "4096",
                            "--json", str(path)]) is None
    rec = json.loads(path.read_text())
    assert rec["sub_elements"] == 4096 and rec["sub_elements_given"] == 4096
    assert "sub-block budget at the last level: 4,096 elements" in capsys.readouterr().out
