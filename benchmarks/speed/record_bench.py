"""Record ``bench`` runs as JSON for the performance pages, with the commit they measured.

    python benchmarks/speed/record_bench.py [--tasks default medium v16] [--repeats 5]
                                            [--keep-memory]

Writes ``docs/bench/<task>.json`` (with ``--keep-memory``, ``docs/bench/kept/<task>.json``:
every side's process started with glibc told to keep freed memory,
:data:`fisher_ref.perf.bench.KEEP_MEMORY`): the dict :func:`fisher_ref.perf.bench.bench`
returns (one process per side, one thread each, interleaved repeats, medians and minima, the
load average, page faults and kernel seconds per run), plus ``commit`` (``git rev-parse
HEAD``, with ``+dirty`` when the code differs from it:
:func:`fisher_ref.perf.scaling.git_commit`), ``numpy``, ``torch``, ``date`` and ``command``
(this command line). Shipped configs and the scale configs of ``fisher_ref/configs/scale/``
(``medium``, ``v16``) are accepted by name.
"""
import argparse
import datetime
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.common import made_by  # noqa: E402
from fisher_ref import list_configs, load_config  # noqa: E402
from fisher_ref.perf.bench import bench  # noqa: E402
from fisher_ref.perf.scaling import git_commit, load_scale_config  # noqa: E402


def _commit():
    return git_commit(ROOT, short=False)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", nargs="+", default=["default", "weighted_prompts", "medium", "v16"])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--keep-memory", action="store_true",
                    help="bench(keep_memory=True); default --out docs/bench/kept")
    ap.add_argument("--out", default=None, help="default docs/bench (or docs/bench/kept)")
    args = ap.parse_args(argv)
    args.out = args.out or str(ROOT / "docs" / "bench" / ("kept" if args.keep_memory else ""))
    import numpy
    import torch
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for name in args.tasks:
        task = load_config(name) if name in list_configs() else load_scale_config(name)
        task.name = name
        res = bench(task, repeats=args.repeats, threads=1, keep_memory=args.keep_memory)
        res.update(command=made_by(argv, __file__), commit=_commit(), numpy=numpy.__version__,
                   torch=torch.__version__,
                   date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"))
        (out / f"{name}.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"{name}: fisher_ref/peer {res['ratio'].get('torch_peer', float('nan')):.2f}, "
              f"like for like {res['ratio_like'].get('torch_peer', float('nan')):.2f}", flush=True)


if __name__ == "__main__":
    main()
