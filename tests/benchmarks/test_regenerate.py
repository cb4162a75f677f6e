"""benchmarks/regenerate.py: the list of every record the documentation cites with the
command that makes it, one entry run end to end, and the refusals."""
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))
from benchmarks import regenerate  # noqa: E402
from benchmarks.regenerate import Record, main, records, run, stamp  # noqa: E402

#: the GPU run's own notes, beside its records
NOTES = {"commit.txt", "date.txt", "gpu_name.txt", "log.txt", "stages.txt"}


def test_every_record_in_docs_is_made_by_a_listed_entry():
    """Each JSON and text record of docs/bench, docs/cpu, docs/gpu and docs/torch, the budget
    run and the large cases belongs to exactly one entry of the list."""
    docs = ROOT / "docs"
    shipped = {p for folder in ("bench", "cpu", "gpu", "torch")
               for p in (docs / folder).rglob("*") if p.suffix in (".json", ".txt")
               and p.name not in NOTES}
    shipped |= {docs / "budget_run.json", docs / "guide" / "large_case.json"}
    owners = {}
    for entry in records():
        for path in regenerate._files(entry):
            owners.setdefault(path, []).append(entry.name)
    assert {p: o for p, o in owners.items() if len(o) > 1} == {}
    assert shipped - set(owners) == set(), sorted(shipped - set(owners))


def test_list_prints_each_record_with_its_command_and_page(capsys):
    assert main(["--list"]) == 0
    out = capsys.readouterr().out
    for entry in records():
        assert f"{entry.name}{' (GPU)' if entry.gpu else ''}: {entry.command}\n" in out
    assert "gpu (GPU): env OUT=docs/gpu bash benchmarks/gpu/gpu_compare.sh" in out
    assert "cited by docs/guide/distributed.md" in out
    assert len({e.name for e in records()}) == len(records())  # --only names are unique


def test_an_entry_runs_end_to_end_and_names_its_command(tmp_path):
    """A cheap command whose output is its standard output: the old file is replaced, the
    output written, and its first line names the command."""
    dest = tmp_path / "summary.txt"
    dest.write_text("an old record\n")
    entry = Record("summary", "python benchmarks/accuracy/summarize_compare.py "
                   "docs/gpu/default.json", (str(dest),), stdout=str(dest))
    assert run(entry) == 0
    lines = dest.read_text().splitlines()
    assert lines[0] == ("# made by: python benchmarks/accuracy/summarize_compare.py "
                        "docs/gpu/default.json")
    assert lines[1].startswith("| config | dtype | rows pass |") and "| default | float64 |" in \
        lines[3]


def test_stamp_names_the_command_once_and_leaves_other_files_alone(tmp_path):
    rec, txt, csv = tmp_path / "r.json", tmp_path / "r.txt", tmp_path / "r.csv"
    rec.write_text(json.dumps({"commit": "abc", "x": 1.25}))
    txt.write_text("commit abc\n")
    csv.write_text("a,b\n1,2\n")
    assert stamp(rec, "python benchmarks/x.py") and stamp(txt, "python benchmarks/x.py")
    assert not stamp(rec, "another") and not stamp(txt, "another") and not stamp(csv, "c")
    assert json.loads(rec.read_text()) == {"command": "python benchmarks/x.py", "commit": "abc",
                                           "x": 1.25}
    assert txt.read_text() == "# made by: python benchmarks/x.py\ncommit abc\n"
    assert csv.read_text() == "a,b\n1,2\n"


def test_unknown_and_gpu_entries_are_refused_here(monkeypatch, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--only", "no-such-record"])
    assert exc.value.code == 2 and "unknown record(s) no-such-record" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--only", "gpu"])
    assert exc.value.code == 2 and "runs only with --gpu" in capsys.readouterr().err
    monkeypatch.setattr(regenerate, "_cuda", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["--only", "gpu", "--gpu"])
    assert exc.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err


def test_dry_run_prints_every_cpu_command_and_runs_nothing(capsys):
    assert main(["--dry-run"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [f"[{e.name}] {e.command}" for e in records() if not e.gpu and not e.history]
