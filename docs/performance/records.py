"""Read the measurement records kept in ``docs/`` and turn them into the tables and plots of
the performance pages (the pages' code cells call these functions when the site is built).

A record says where it was measured when it can: a ``commit`` and ``machine`` field, or the
``commit.txt`` / ``gpu_name.txt`` / ``log.txt`` files beside a GPU run. Where a record does
not say, :func:`provenance` falls back on the commit that last wrote the file (``git log``)
and says so. A record also names the command that made it (a ``command`` field, or a first
line ``# made by: COMMAND`` in a text record; ``python benchmarks/regenerate.py --list``
lists them all).
"""
from __future__ import annotations

import json
import subprocess
from pathlib import Path

import fisher_ref

ROOT = Path(fisher_ref.__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def load(path):
    """The JSON record at ``path`` (relative to ``docs/`` or absolute)."""
    return json.loads((DOCS / path).read_text())


def git(*args):
    """``git args...`` in the repository; '' where git or the history is not there."""
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout.strip() if out.returncode == 0 else ""


def head():
    """The commit this checkout is at, with ``+ uncommitted changes`` when its code differs
    from it (:func:`fisher_ref.perf.scaling.git_commit`)."""
    from fisher_ref.perf.scaling import git_commit
    commit = git_commit(ROOT)
    return commit.removesuffix("+dirty") + (" + uncommitted changes"
                                            if commit.endswith("+dirty") else "")


def committed_in(path):
    """``(short hash, date)`` of the commit that last wrote ``path``, or ``None``."""
    line = git("log", "-1", "--format=%h %ad", "--date=short", "--", str(DOCS / path))
    return tuple(line.split(" ", 1)) if line else None


def provenance(path, record=None):
    """One sentence: the commit and machine a record was measured on, and the command that
    made it where the record names one."""
    record = load(path) if record is None and str(path).endswith(".json") else (record or {})
    commit = record.get("commit")
    machine = record.get("machine")
    parts = []
    if commit:
        short = commit.removesuffix("+dirty")[:9] + (
            " + uncommitted changes" if commit.endswith("+dirty") else "")
        parts.append(f"measured at commit `{short}`")
    else:
        c = committed_in(path)
        parts.append(f"recorded in commit `{c[0]}` ({c[1]}); the record does not name the "
                     "commit it measured" if c else "the record names no commit")
    parts.append(f"on {machine}" if machine else "machine not named in the record")
    if record.get("command"):
        parts.append(f"made by `{record['command']}`")
    return f"`docs/{path}`: " + ", ".join(parts) + "."


MADE_BY = "# made by: "


def made_by(path):
    """``(command, lines)`` of the text record at ``path`` (relative to ``docs/``): the
    command its ``# made by:`` line names (``None`` without one) and its other lines, the
    comment lines (``#``) left out."""
    lines = (DOCS / path).read_text().splitlines()
    command = next((line[len(MADE_BY):] for line in lines if line.startswith(MADE_BY)), None)
    return command, [line for line in lines if not line.startswith("#")]



def command(path):
    """The command that made the record at ``path``: its ``command`` field or its
    ``# made by:`` line; ``None`` where it names none."""
    if str(path).endswith(".json"):
        return load(path).get("command")
    return made_by(path)[0]


def _summarize_compare():
    """``benchmarks/accuracy/summarize_compare.py`` as a module (its table is the one the
    pages show)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(
        "summarize_compare", ROOT / "benchmarks" / "accuracy" / "summarize_compare.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compare_summary(paths):
    """Markdown tables of ``compare --json`` records: per config and dtype the rows passing,
    the worst relative error and the tolerance (``summarize_compare.py``'s table),
    and the Monte Carlo statistics, one column per row."""
    table = _summarize_compare().summarize([str(DOCS / p) for p in paths])
    table = table.split("\n\nMonte Carlo rows")[0]
    mc_rows, mc_names = {}, []
    for path in paths:
        d = load(path)
        if "rows" not in d:  # a bench or big-task record
            continue
        for r in d["rows"]:
            if r["test"] != "rel":  # "mc.sequence_fisher (n=4000, seed=0)"
                mc_names += [] if r["quantity"] in mc_names else [r["quantity"]]
                mc_rows.setdefault(d["task"], {})[r["quantity"]] = r["statistic"]
    mc = ["| config | " + " | ".join(f"`{q}`" for q in mc_names) + " |",
          "|---|" + "---|" * len(mc_names)]
    mc += [f"| {task} | " + " | ".join(f"{row[q]:.2f}" if q in row else "-" for q in mc_names)
           + " |" for task, row in mc_rows.items()]
    note = ("Monte Carlo rows: the Bernstein statistic of the torch sampler against the exact "
            "values, which passes at ≤ 1.\n\n")
    return table, (note + "\n".join(mc)) if mc_names else ""


def gpu_provenance(folder="gpu"):
    """The GPU run's commit, device, software and date, from the files beside its records."""
    base = DOCS / folder
    read = lambda name: (base / name).read_text().strip() if (base / name).exists() else "?"
    log = read("log.txt").splitlines()
    software = next((line for line in log if line.startswith("torch ")), "torch ?")
    words = software.split()  # "torch 2.11.0+cu130 cuda 13.0 available True"
    if len(words) >= 4 and words[2] == "cuda":
        software = f"torch {words[1]}, CUDA {words[3]}"
    commit = read("commit.txt")
    since = git("rev-list", "--count", f"{commit}..HEAD", "--", "fisher_ref/torch") if commit != "?" else ""
    return {"commit": commit[:9], "device": read("gpu_name.txt"), "software": software,
            "date": read("date.txt"), "torch_commits_since": since}


def bench_records(folder="bench"):
    """The ``bench --json`` records of ``docs/<folder>/``, sorted by problem size."""
    paths = sorted((DOCS / folder).glob("*.json"))
    recs = [(p.relative_to(DOCS).as_posix(), json.loads(p.read_text())) for p in paths]
    return sorted(recs, key=lambda pr: pr[1]["n_states"] * pr[1]["num_params"])


SIDE_NAMES = {"fisher_ref": "exact", "torch_cpu_float64": "torch CPU",
              "torch_cuda_float64": "torch CUDA", "torch_peer": "peer",
              "fisher_ref_fisher": "fisher only"}


def bench_table(records):
    """Markdown table of bench records: the median seconds of each side, and the ratios
    (fisher_ref over the other side; below 1, fisher_ref is faster)."""
    sides = [s for s in SIDE_NAMES if any(s in r["median"] for _, r in records)]
    ratios = [("torch_cpu_float64", "ratio", "exact / torch CPU"),
              ("torch_cuda_float64", "ratio", "exact / torch CUDA"),
              ("torch_peer", "ratio", "exact / peer"),
              ("torch_peer", "ratio_like", "fisher only / peer")]
    ratios = [x for x in ratios if any(x[0] in r.get(x[1], {}) for _, r in records)]
    head = (["task", "P"] + [f"{SIDE_NAMES[s]} (s)" for s in sides]
            + [name for _, _, name in ratios] + ["load"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in records:
        cells = [r["task"], f"{r['num_params']:,}"]
        cells += [f"{r['median'][s]:.4f}" if s in r["median"] else "-" for s in sides]
        cells += [f"{r[key][side]:.2f}" if side in r.get(key, {}) else "-"
                  for side, key, _ in ratios]
        loads = [row[0] for row in r.get("loadavg", [])]
        cells.append(f"{min(loads):.1f}–{max(loads):.1f}" if loads else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def kernel_table(records):
    """Markdown table of what each side of bench records cost the kernel per run: median
    minor page faults and system seconds (records that hold them)."""
    import statistics
    records = [(p, r) for p, r in records if "kernel" in r]
    sides = [s for s in SIDE_NAMES if any(s in r["kernel"] for _, r in records)]
    head = ["task"] + [f"{SIDE_NAMES[s]}, per run" for s in sides]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in records:
        cells = [r["task"]]
        for s in sides:
            k = r["kernel"].get(s, {})
            f = [x for x in k.get("page_faults", []) if x is not None]
            t = [x for x in k.get("seconds", []) if x is not None]
            cells.append(f"{statistics.median(f):,.0f} page faults, "
                         f"{statistics.median(t):.3f} s in the kernel" if f and t else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def fresh_table(path="bench/fresh/fresh_run.json"):
    """Markdown table of ``benchmarks/speed/fresh_run.py --json``: the first run in a fresh process,
    exact against the peer, per task and memory condition (medians), with what each run
    cost the kernel and its peak memory; ``None`` when the record is not there."""
    if not (DOCS / path).exists():
        return None
    fr = load(path)
    rows = {(r["task"], r["side"], r["memory"]): r for r in fr["rows"]}
    lines = ["| task | memory | exact (s) | peer (s) | exact / peer | exact, per run | "
             "peer, per run |", "|---|---|---|---|---|---|---|"]

    def cost(r):
        return (f"{r['faults']:,.0f} page faults, {r['kernel']:.3f} s in the kernel, peak "
                f"RSS {r['max_rss_mib']:.0f} MiB")
    for task in dict.fromkeys(r["task"] for r in fr["rows"]):
        for mem in ("default", "kept"):
            e, q = rows.get((task, "exact", mem)), rows.get((task, "peer", mem))
            if e and q:
                lines.append(f"| {task} | {mem} | {e['wall']:.3f} | {q['wall']:.3f} | "
                             f"{e['wall'] / q['wall']:.2f} | {cost(e)} | {cost(q)} |")
    return (f"{provenance(path, fr)[:-1]}; {fr['date'][:10]}; medians of {fr['rows'][0]['repeats']} "
            f"processes per side and condition; made by `{fr.get('command')}`.\n\n"
            + "\n".join(lines))


def alloc_outputs(folder="bench/alloc"):
    """The saved outputs in ``folder`` of ``benchmarks/memory/alloc_effects.py``
    (``bench/alloc``, one ``<config>.txt`` per task), ``benchmarks/memory/sub_block_effects.py``
    (``bench/subblock``) or ``benchmarks/speed/cost_split.py`` (``bench/split``): the commit
    and machine, the setup, then a markdown table, each under its file's name with the command
    that made it; ``None`` when there are none."""
    paths = sorted((DOCS / folder).glob("*.txt"))
    if not paths:
        return None
    def shown(p):  # the lines before the table in one sentence, then the table
        cmd, lines = made_by(p.relative_to(DOCS))
        head, _, table = "\n".join(lines).strip().partition("\n\n")
        made = f" Made by `{cmd}`." if cmd else ""
        return (f"**{p.stem}** (`{p.relative_to(DOCS)}`): {'; '.join(head.splitlines())}."
                f"{made}" + (f"\n\n{table}" if table else ""))
    return "\n\n".join(shown(p) for p in paths)


def peer_table(folder="bench/peer"):
    """Markdown table of ``benchmarks/speed/peer_timing.py --json`` records (one process, by turns):
    exact / peer for every quantity and like for like (fisher only), and the medians of
    exact and the peer, per task, memory condition and sub-block budget, with each record's
    provenance; ``None`` when there are none."""
    paths = sorted((DOCS / folder).glob("*.json"))
    if not paths:
        return None
    recs = [(p.relative_to(DOCS).as_posix(), json.loads(p.read_text())) for p in paths]
    recs.sort(key=lambda pr: (pr[1]["memory_kept"], pr[1]["sub_elements"]))
    tasks = list(dict.fromkeys(t for _, r in recs for t in r["tasks"]))
    head = ["memory", "sub-block budget"] + [f"{t}: {what}" for t in tasks for what in (
        "exact / peer", "fisher only / peer", "medians")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    notes = []
    for path, r in recs:
        sub = r["sub_elements"]
        cells = ["kept" if r["memory_kept"] else "C library default",
                 (f"2**{sub.bit_length() - 1}" if sub & (sub - 1) == 0 else f"{sub:,}")
                 + (" (the engine's own)" if r.get("sub_elements_given", 0) is None else "")]
        for t in tasks:
            rec = r["tasks"].get(t)
            cells += [f"{rec['ratio']['exact / peer']:.2f}",
                      f"{rec['ratio']['exact fisher / peer']:.2f}",
                      f"exact {rec['median']['exact']:.3f} s, peer {rec['median']['peer']:.3f} s"] \
                if rec else ["-", "-", "-"]
        lines.append("| " + " | ".join(cells) + " |")
        loads = [row[0] for row in r["loadavg"]]
        notes.append(f"{provenance(path, r)[:-1]}; {r['date'][:10]}, {r['repeats']} repeats, "
                     f"1-minute load {min(loads):.1f}–{max(loads):.1f}.")
    return "\n".join(lines) + "\n\n" + "\n".join(f"- {n}" for n in notes)


def scaling_rows():
    """The rows of ``docs/scaling.csv`` as dicts of numbers."""
    import csv
    with open(DOCS / "scaling.csv") as f:
        return [{k: float(v) for k, v in row.items()} for row in csv.DictReader(f)]
