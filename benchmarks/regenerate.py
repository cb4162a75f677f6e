"""Regenerate the measurement records that the documentation cites, each with the command
that made it.

    python benchmarks/regenerate.py --list             # every record and its command
    python benchmarks/regenerate.py --only peer-kept-auto-1   # one record
    python benchmarks/regenerate.py                    # every record this machine can make
    python benchmarks/regenerate.py --gpu              # also the GPU run (a CUDA machine)

(``python -m benchmarks.regenerate`` from the repository root is the same.) Records that a
page quotes as history, made at an earlier commit, are listed with it and run by ``--only``
alone. Each entry of
:data:`RECORDS` names the files it writes and the command that writes them, run from the
repository root with this checkout's package first on ``PYTHONPATH``. Before a command
runs, the files it writes are removed (they are in git: ``git diff`` shows what changed,
``git checkout`` brings them back); a command whose output is its standard output has it
written to its file. Afterwards every JSON record without a ``command`` field gets the
entry's command, and every text record whose first line does not name its command gets
``# made by: COMMAND`` (the scripts under ``benchmarks/`` write both themselves; the
package's own commands, ``python -m fisher_ref ...``, do not). The GPU run also writes the
notes the accuracy page reads beside its records: its output (``log.txt``), the commit and
the date.

Most entries take minutes on two cores, some tens of minutes: the machine should be
otherwise idle, since every record keeps the load average it ran under. The GPU entry runs
only with ``--gpu``, and only where torch sees a CUDA device.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import MADE_BY  # noqa: E402


@dataclass(frozen=True)
class Record:
    """One command and the records it writes.

    Attributes:
        name: what ``--only`` takes.
        command: the command line, run from the repository root.
        outputs: the files it writes, relative to the repository root.
        stdout: the file its standard output is written to (``None``: it writes its files).
        gpu: needs a CUDA device (run only with ``--gpu``).
        cited_by: the page that shows or quotes the record.
        history: the commit of an earlier record that the page quotes as history: it is run
            only by ``--only`` (at that commit, to make it again; at another it measures
            other code).
    """

    name: str
    command: str
    outputs: tuple
    stdout: str | None = None
    gpu: bool = False
    cited_by: str = "docs/performance/speed.md"
    history: str | None = None


def _compare_records():
    """``compare --json`` on the CPU, one entry per shipped config (docs/cpu/)."""
    from fisher_ref import list_configs
    return [Record(f"compare-cpu-{name}",
                   f"python -m fisher_ref compare --config {name} --device cpu "
                   f"--dtype float64,float32,bfloat16 --json docs/cpu/{name}.json",
                   (f"docs/cpu/{name}.json", f"docs/cpu/{name}.txt"), stdout=f"docs/cpu/{name}.txt",
                   cited_by="docs/performance/accuracy.md") for name in list_configs()]


def _peer_records():
    """``peer_timing.py --json``, twice per memory condition and sub-block budget."""
    out = []
    for cond, flags in (("default_auto", ""), ("default_sub4194304", " --sub-elements 4194304"),
                        ("kept_auto", " --keep-memory"),
                        ("kept_sub1048576", " --keep-memory --sub-elements 1048576")):
        for run in (1, 2):
            path = f"docs/bench/peer/{cond}_run{run}.json"
            out.append(Record(f"peer-{cond.replace('_', '-')}-{run}",
                              f"python benchmarks/speed/peer_timing.py{flags} --repeats 9 "
                              f"--json {path}", (path,)))
    return out


def _shard_records():
    """``shard_speedup.py`` three times (the distributed guide quotes runs 7-9, and runs 1-6
    of earlier commits as history) and ``shard_balance.py`` per task."""
    runs = [Record(f"shard-speedup-{i}", f"python benchmarks/scaling/shard_speedup.py "
                   f"--repeats {repeats}", (f"docs/bench/shards/v16_run{i}.txt",),
                   stdout=f"docs/bench/shards/v16_run{i}.txt", cited_by="docs/guide/distributed.md",
                   history=commit)
            for i, repeats, commit in ((1, 11, "df8ee45"), (2, 11, "df8ee45"), (3, 11, "df8ee45"),
                                       (4, 15, "1198121"), (5, 15, "1198121"),
                                       (6, 15, "1198121"), (7, 41, None), (8, 41, None),
                                       (9, 41, None))]
    return runs + [Record(f"shard-balance-{task}",
                          f"python benchmarks/scaling/shard_balance.py --config {task}{units}",
                          (f"docs/bench/shards/balance_{task}.txt",),
                          stdout=f"docs/bench/shards/balance_{task}.txt",
                          cited_by="docs/guide/distributed.md")
                   for task, units in (("v16", " --units 98 105 108 111 114 117 120"),
                                       ("medium", " --units 19 21 23 25 27 29 31"))]


def records():
    """Every record the documentation cites, in the order the pages show them."""
    torch_big = "python benchmarks/memory/torch_big_task.py"
    return [
        *_compare_records(),
        Record("gpu", "env OUT=docs/gpu bash benchmarks/gpu/gpu_compare.sh",
               ("docs/gpu/",), stdout="docs/gpu/log.txt", gpu=True,
               cited_by="docs/performance/accuracy.md"),
        Record("cross-device", "python benchmarks/gpu/cross_device.py --arrays "
               "docs/gpu/gpt2_p100k_arrays.npz --config gpt2_p100k --out "
               "docs/gpu/gpt2_p100k_cross.json", ("docs/gpu/gpt2_p100k_cross.json",),
               cited_by="docs/performance/accuracy.md"),
        Record("bench", "python benchmarks/speed/record_bench.py",
               tuple(f"docs/bench/{t}.json" for t in ("default", "weighted_prompts", "medium",
                                                      "v16"))),
        Record("bench-kept", "python benchmarks/speed/record_bench.py --keep-memory",
               tuple(f"docs/bench/kept/{t}.json" for t in ("default", "weighted_prompts",
                                                           "medium", "v16"))),
        Record("applied-covariance", "python benchmarks/estimators/applied_covariance.py",
               ("docs/bench/estimators/applied_covariance.json",),
               cited_by="docs/check/applied_gradient.md"),
        Record("trainer-power", "python benchmarks/estimators/trainer_power.py",
               ("docs/bench/estimators/trainer_power.json",),
               cited_by="docs/check/end_to_end.md"),
        Record("fresh-run", "python benchmarks/speed/fresh_run.py --peer --json "
               "docs/bench/fresh/fresh_run.json", ("docs/bench/fresh/fresh_run.json",)),
        *[Record(f"alloc-{task}", f"python benchmarks/memory/alloc_effects.py --config {task} "
                 f"{runs}", (f"docs/bench/alloc/{task}.txt",),
                 stdout=f"docs/bench/alloc/{task}.txt")
          for task, runs in (("medium", "--rounds 4"), ("v16", "--rounds 3 --repeats 3"))],
        Record("sub-block", "python benchmarks/memory/sub_block_effects.py --rounds 3 "
               "--instructions", ("docs/bench/subblock/medium_v16.txt",),
               stdout="docs/bench/subblock/medium_v16.txt"),
        *_peer_records(),
        Record("cost-split", "python benchmarks/speed/cost_split.py --repeats 7 --keep-memory "
               "--out docs/bench/split/medium_v16.txt", ("docs/bench/split/medium_v16.txt",)),
        Record("scaling", "python -m fisher_ref bench --scaling docs --budget-run",
               ("docs/scaling.csv", "docs/scaling.md", "docs/scaling.png", "docs/budget_run.json"),
               cited_by="docs/performance/scaling.md"),
        Record("torch-big-task", f"{torch_big} --out docs/torch/big_task.json",
               ("docs/torch/big_task.json",), cited_by="docs/performance/scaling.md"),
        Record("torch-big-task-t4", f"{torch_big} --max-len 4 --out docs/torch/big_task_T4.json",
               ("docs/torch/big_task_T4.json",), cited_by="docs/performance/scaling.md"),
        Record("torch-gpt2-p100k", f"{torch_big} --config gpt2_p100k --out "
               "docs/torch/gpt2_p100k_cpu.json", ("docs/torch/gpt2_p100k_cpu.json",),
               cited_by="docs/performance/scaling.md"),
        *_shard_records(),
        Record("large-case", "python benchmarks/scaling/large_case.py --out "
               "docs/guide/large_case.json", ("docs/guide/large_case.json",),
               cited_by="docs/guide/distributed.md"),
        Record("estimators-batch-bias", "python benchmarks/estimators/batch_bias.py",
               ("docs/bench/estimators/batch_bias.json", "docs/bench/estimators/batch_bias.png"),
               cited_by="docs/check/rl_losses.md"),
        Record("estimators-batch-cost", "python benchmarks/estimators/batch_cost.py",
               ("docs/bench/estimators/batch_cost.json",)),
    ]


def _files(record):
    """The files of ``record`` now on disk (a folder output: the JSON and text files in it,
    except the GPU run's own notes of commit, date, device and log, and the files another
    entry names)."""
    out = []
    for rel in record.outputs:
        path = ROOT / rel
        if rel.endswith("/"):
            others = {ROOT / o for r in records() for o in r.outputs if not o.endswith("/")}
            out += [p for p in sorted(path.glob("*")) if p.suffix in (".json", ".txt")
                    and p not in others
                    and p.name not in ("commit.txt", "date.txt", "gpu_name.txt", "log.txt",
                                       "stages.txt")]
        elif path.exists():
            out.append(path)
    return out


def stamp(path, command):
    """Name ``command`` in the record at ``path`` unless it names one already: a
    ``command`` field in a JSON object, a first line ``# made by: COMMAND`` in a text file.
    Other files (a CSV, a picture, arrays) are left alone. Returns whether it changed."""
    path = Path(path)
    if path.suffix == ".json":
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict) or "command" in doc:
            return False
        path.write_text(json.dumps({"command": command, **doc}, indent=1) + "\n")
        return True
    if path.suffix == ".txt":
        text = path.read_text()
        if text.startswith(MADE_BY):
            return False
        path.write_text(f"{MADE_BY}{command}\n{text}")
        return True
    return False


def run(record, dry_run=False):
    """Run ``record``'s command from the repository root, its old files removed first, and
    stamp what it wrote; returns the command's exit status."""
    print(f"[{record.name}] {record.command}", flush=True)
    if dry_run:
        return 0
    for path in _files(record):
        path.unlink()
    if record.gpu:  # the run's own notes: its log (the output), stages, commit and date
        folder = ROOT / record.outputs[0]
        (folder / "stages.txt").unlink(missing_ok=True)
        commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"],
                                capture_output=True, text=True).stdout.strip()
        (folder / "commit.txt").write_text(commit + "\n")
        now = datetime.datetime.now(datetime.timezone.utc)  # as date(1) prints it
        (folder / "date.txt").write_text(now.strftime("%a %b %e %I:%M:%S %p UTC %Y") + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    argv = shlex.split(record.command)
    argv = [sys.executable] + argv[1:] if argv[0] == "python" else argv  # this Python
    if record.stdout:
        out = subprocess.run(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)
        (ROOT / record.stdout).write_text(out.stdout)
        code = out.returncode
    else:
        code = subprocess.run(argv, cwd=ROOT, env=env).returncode
    for path in _files(record):
        stamp(path, record.command)
    return code


def _cuda():
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="print every record and its command")
    ap.add_argument("--only", action="append", metavar="NAME",
                    help="run this entry only (repeatable; --list names them)")
    ap.add_argument("--gpu", action="store_true",
                    help="also run the GPU entries (needs a CUDA device)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands, run nothing")
    args = ap.parse_args(argv)
    table = records()
    if args.list:
        for r in table:
            print(f"{r.name}{' (GPU)' if r.gpu else ''}: {r.command}\n    writes "
                  f"{', '.join(r.outputs)}{'' if r.stdout is None else ' (its output)'}; "
                  f"cited by {r.cited_by}" + (f"; history, made at commit {r.history} (run by "
                                              "--only alone)" if r.history else ""))
        return 0
    names = {r.name: r for r in table}
    if args.only:
        unknown = [n for n in args.only if n not in names]
        if unknown:
            ap.error(f"--only: unknown record(s) {', '.join(unknown)}; --list names them")
        chosen = [names[n] for n in args.only]
    else:
        chosen = [r for r in table if (args.gpu or not r.gpu) and not r.history]
    gpu = [r.name for r in chosen if r.gpu]
    if gpu and not args.gpu:
        ap.error(f"--only {', '.join(gpu)}: a GPU entry runs only with --gpu")
    if gpu and not args.dry_run and not _cuda():
        ap.error(f"{', '.join(gpu)} needs a CUDA device, and torch sees none here")
    failed = [r.name for r in chosen if run(r, args.dry_run) != 0]
    if failed:
        print(f"failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
