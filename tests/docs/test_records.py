"""The performance pages' record readers (docs/performance/records.py): the tables the
speed page shows from peer_timing.py and fresh_run.py records, the provenance line of a
record measured on uncommitted code, and the command each shipped record names."""
import importlib.util
import json
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "records", Path(__file__).resolve().parents[2] / "docs" / "performance" / "records.py")
records = importlib.util.module_from_spec(_spec)  # by path: no folder put on sys.path
_spec.loader.exec_module(records)


def _peer_record(kept, sub, commit, ratios):
    return {"commit": commit, "machine": "test machine", "memory_kept": kept,
            "sub_elements": sub, "repeats": 3, "date": "2026-12-03T00:00:00+00:00",
            "loadavg": [[0.5, 0, 0], [0.7, 0, 0]],
            "tasks": {"medium": {"median": {"exact": 0.04, "exact fisher": 0.01, "peer": 0.03,
                                            "peer per h": 0.05},
                                 "ratio": {"exact / peer": ratios[0],
                                           "exact fisher / peer": ratios[1]}}}}


@pytest.fixture
def docs(tmp_path, monkeypatch):
    monkeypatch.setattr(records, "DOCS", tmp_path)
    (tmp_path / "bench" / "peer").mkdir(parents=True)
    return tmp_path


def test_peer_table_rows_by_condition_and_budget_with_provenance(docs):
    for name, args in {"b": (True, 2 ** 20, "abc1234", (1.56, 0.5)),
                       "a": (False, 2 ** 23, "abc1234+dirty", (0.9, 0.3))}.items():
        (docs / "bench" / "peer" / f"{name}.json").write_text(
            json.dumps(_peer_record(*args)))
    table = records.peer_table()
    rows = [line for line in table.splitlines() if line.startswith("| ")]
    assert rows[1].startswith("| C library default | 2**23 | 0.90 | 0.30 |")
    assert rows[2].startswith("| kept | 2**20 | 1.56 | 0.50 |")
    assert "exact 0.040 s, peer 0.030 s" in rows[2]
    assert "measured at commit `abc1234` + uncommitted changes" not in table
    assert "measured at commit `abc1234 + uncommitted changes`" in table
    assert "1-minute load 0.5–0.7." in table


def test_tables_are_none_without_records(docs):
    assert records.peer_table() is None and records.fresh_table() is None


def test_fresh_table_pairs_exact_with_the_peer(docs):
    row = dict(repeats=7, user=0.1, kernel=0.01, faults=1000, max_rss_mib=80)
    (docs / "bench" / "fresh").mkdir()
    (docs / "bench" / "fresh" / "fresh_run.json").write_text(json.dumps(
        {"commit": "abc1234", "machine": "m", "date": "2026-12-03T00:00:00+00:00", "rows": [
            {"task": "medium", "side": "exact", "memory": "default", "wall": 0.1, **row},
            {"task": "medium", "side": "peer", "memory": "default", "wall": 0.2, **row}]}))
    table = records.fresh_table()
    assert "| medium | default | 0.100 | 0.200 | 0.50 |" in table
    assert "medians of 7 processes" in table


def test_alloc_outputs_show_each_saved_output(docs):
    assert records.alloc_outputs() is None
    (docs / "bench" / "alloc").mkdir()
    (docs / "bench" / "alloc" / "medium.txt").write_text(
        "commit abc1234; m\nmedium; 5 runs\n\n| a | b |\n|---|---|\n| 1 | 2 |\n")
    out = records.alloc_outputs()
    assert out == ("**medium** (`bench/alloc/medium.txt`): commit abc1234; m; medium; 5 runs."
                   "\n\n| a | b |\n|---|---|\n| 1 | 2 |")
    (docs / "bench" / "alloc" / "medium.txt").write_text(
        "# made by: python benchmarks/memory/alloc_effects.py --config medium\n# a note\n"
        "commit abc1234; m\nmedium; 5 runs\n\n| a | b |\n")
    assert records.alloc_outputs() == (
        "**medium** (`bench/alloc/medium.txt`): commit abc1234; m; medium; 5 runs. Made by "
        "`python benchmarks/memory/alloc_effects.py --config medium`.\n\n| a | b |")


def test_peer_table_marks_the_engines_own_budget(docs):
    """A record made without --sub-elements says the budget was the engine's own; one
    made with it, or before the field existed, shows the budget alone."""
    for name, given in (("auto", None), ("given", 4194304)):
        rec = dict(_peer_record(True, 4194304, "abc1234", (1.1, 0.4)), sub_elements_given=given)
        (docs / "bench" / "peer" / f"{name}.json").write_text(json.dumps(rec))
    (docs / "bench" / "peer" / "old.json").write_text(
        json.dumps(_peer_record(True, 1048576, "abc1234", (1.5, 0.5))))
    cells = [line.split(" | ")[1] for line in records.peer_table().splitlines()[2:5]]
    assert sorted(cells) == ["2**20", "2**22", "2**22 (the engine's own)"], cells


def test_the_shipped_sub_block_record_holds_every_budget_and_condition():
    """docs/bench/subblock/: the commit and machine first, a row per task, budget and
    memory condition, each with its instruction count."""
    command, lines = records.made_by("bench/subblock/medium_v16.txt")
    assert command.startswith("python benchmarks/memory/sub_block_effects.py ")
    assert lines[0].startswith("commit ") and "glibc" in lines[0]
    rows = {tuple(c.strip() for c in line.split("|")[1:4]) for line in lines
            if line.startswith("| medium") or line.startswith("| v16")}
    assert rows == {(t, m, b) for t in ("medium", "v16") for m in ("glibc default", "kept")
                    for b in ("2**20", "2**22")}
    assert all(line.rstrip(" |").endswith(" M") for line in lines
               if line.startswith("| medium") or line.startswith("| v16"))


def test_the_shipped_cost_split_record_fits_every_side_of_each_task():
    """docs/bench/split/: benchmarks/speed/cost_split.py's output, the commit and machine first, a
    row per task and width (each task's own width among them) and a fit per task and side;
    shown on the speed page by ``alloc_outputs``."""
    command, lines = records.made_by("bench/split/medium_v16.txt")
    assert command.startswith("python benchmarks/speed/cost_split.py ")
    assert lines[0].startswith("commit ") and "glibc" in lines[0], lines[0]
    assert "freed memory kept" in lines[1], lines[1]
    own = {line.split("|")[1].strip() for line in lines if "(the config's)" in line}
    assert own == {"medium", "v16"}, lines
    fits = {tuple(c.strip() for c in line.split("|")[1:3]) for line in lines
            if line.count("|") == 7 and "%" in line}
    assert fits == {(t, s) for t in ("medium", "v16") for s in ("exact", "exact fisher", "peer")}
    shown = records.alloc_outputs("bench/split")
    assert shown.startswith("**medium_v16** (`bench/split/medium_v16.txt`): commit ")


def test_the_speed_page_quotes_the_shipped_peer_and_split_records():
    """Each number the speed page's prose gives for the peer_timing.py records
    (docs/bench/peer/) and the cost split (docs/bench/split/) is the records' own."""
    import math
    docs = Path(records.__file__).parent.parent
    page = " ".join((docs / "performance" / "speed.md").read_text().split())
    peer = {p.stem: json.loads(p.read_text()) for p in (docs / "bench" / "peer").glob("*.json")}

    def runs(cond, task, key="exact / peer"):  # the two runs of one cell, in order
        return [peer[f"{cond}_run{i}"]["tasks"][task]["ratio"][key] for i in (1, 2)]

    def pair(cond, task):
        return " and ".join(f"{r:.2f}" for r in sorted(runs(cond, task)))

    def span(conds, task, key):
        vals = [f"{r:.2f}" for c in conds for r in runs(c, task, key)]
        lo, hi = min(vals), max(vals)
        return lo if lo == hi else f"{lo}–{hi}"

    kept, default = ("kept_auto", "kept_sub1048576"), ("default_auto", "default_sub4194304")
    cells = [(c, t) for c in kept + default for t in ("medium", "v16")]
    spread = max(max(runs(c, t)) / min(runs(c, t)) for c, t in cells if c in default)
    agree = max(abs(runs(c, t)[0] - runs(c, t)[1]) for c, t in cells if c in kept)
    assert f"differ by up to {math.ceil(spread * 10) / 10}x" in page
    worst = max((c for c in cells if c[0] in default),
                key=lambda c: max(runs(*c)) / min(runs(*c)))
    label = {"default_auto": "with the engine's own budget", "default_sub4194304": "at 2\\*\\*22"}
    names = {"medium": "medium", "v16": "V=16"}
    assert f"({names[worst[1]]} {label[worst[0]]}: {pair(*worst)})" in page  # the cell named
    # ahead of the peer on both tasks with memory kept, by less on medium (as it says)
    assert max(runs("kept_auto", "v16")) < min(runs("kept_auto", "medium")) < 1
    assert (f"put the default run at {pair('kept_auto', 'medium')} of the peer on medium and "
            f"{pair('kept_auto', 'v16')} on V=16 with memory kept") in page
    assert f"agree to {math.ceil(agree * 100) / 100:.2f}" in page
    assert (f"takes {pair('kept_auto', 'medium')} of the peer's time on medium and "
            f"{pair('kept_auto', 'v16')} on V=16") in page
    assert (f"gives {pair('kept_sub1048576', 'medium')} on medium and "
            f"{pair('kept_sub1048576', 'v16')} on V=16") in page
    assert (f"at {pair('default_auto', 'medium')} on medium "
            f"({pair('default_sub4194304', 'medium')} at 2\\*\\*22) and "
            f"{pair('default_auto', 'v16')} on V=16") in page
    assert (f"it takes {span(kept, 'medium', 'exact fisher / peer')} of the peer's time on "
            f"medium and {span(kept, 'v16', 'exact fisher / peer')} on V=16 with memory kept, "
            f"and {span(default, 'medium', 'exact fisher / peer')} and "
            f"{span(default, 'v16', 'exact fisher / peer')} in default memory") in page
    fits = {}
    for line in (docs / "bench" / "split" / "medium_v16.txt").read_text().splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 6 and cells[1] in ("exact", "exact fisher", "peer"):
            fits[cells[0], cells[1]] = cells[2:]
    b = {k: f"{float(v[1]):.1f}" for k, v in fits.items()}
    a = {k: v[0] for k, v in fits.items()}
    assert float(b['medium', 'exact']) < float(b['medium', 'peer'])  # "costs less", as it says
    assert (f"on medium ({b['medium', 'exact']} against {b['medium', 'peer']} µs), and less on "
            f"V=16 ({b['v16', 'exact']} against {b['v16', 'peer']} µs)") in page
    assert (f"{a['medium', 'exact']} against {a['medium', 'peer']} ms on medium, "
            f"{a['v16', 'exact']} against {a['v16', 'peer']} ms on V=16") in page
    assert f"its medium points least well ({fits['medium', 'peer'][3]})" in page


def test_provenance_names_the_command_of_a_record_that_has_one(docs):
    (docs / "r.json").write_text(json.dumps({"commit": "abc1234", "machine": "m",
                                             "command": "python benchmarks/x.py --y"}))
    assert records.provenance("r.json") == ("`docs/r.json`: measured at commit `abc1234`, on m, "
                                            "made by `python benchmarks/x.py --y`.")
    assert records.command("r.json") == "python benchmarks/x.py --y"


def test_every_shipped_record_names_the_command_that_made_it():
    """Every record that benchmarks/regenerate.py lists, as shipped in docs/, names its
    command (a ``command`` field, a ``# made by:`` line), and it is the command the list
    gives; the CSV and the picture of the scaling run are named by docs/scaling.md."""
    import sys
    root = Path(records.__file__).resolve().parents[2]
    sys.path.append(str(root))
    try:
        from benchmarks.regenerate import _files, records as listed
    finally:
        sys.path.remove(str(root))
    seen = 0
    for entry in listed():
        for path in _files(entry):
            rel = path.relative_to(records.DOCS).as_posix()
            if path.suffix in (".json", ".txt"):
                made = records.command(rel)
                # the GPU run's script names its own parts' commands where they write them
                assert made == entry.command or (entry.gpu and made.startswith(
                    "python benchmarks/")), (rel, made, entry.command)
                seen += 1
    assert seen >= 70, seen
    assert "by `python -m fisher_ref bench --scaling`" in (records.DOCS / "scaling.md").read_text()
