"""Exact cases at a scale that means something, on every core: time, peak memory per
worker, and how far the top 1% of parameters by |G| and by F overlap.

Usage: python benchmarks/scaling/large_case.py [--cases gpt2_p100k v16_t5] [--workers N]
                                    [--out docs/guide/large_case.json]

Each case (a config of fisher_ref/configs/scale/) runs in a fresh child process of this
script, ``exact(task, workers=N)`` (default: every available core), so that the peak
resident memory of its workers (``RUSAGE_CHILDREN`` of the child: the largest worker)
and of the merging process are its own. Writes the records, with the machine and the
commit, to ``--out`` (read by docs/guide/distributed.md).
"""
import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout's package
from fisher_ref.engine.plan import EngineOptions  # noqa: E402

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ.setdefault(_k, "1")  # before numpy: one BLAS thread per process

DEFAULT_CASES = ("v16_t5", "gpt2_p100k")


def run_case(name, workers):
    """One case in this process: its record (a dict)."""
    import numpy as np

    from fisher_ref.parallel.run import exact
    from fisher_ref.parallel.workers import shutdown
    from fisher_ref.perf.scaling import load_scale_config

    task = load_scale_config(name)
    t0 = time.perf_counter()
    r = exact(task, workers=workers, progress=False,
              options=EngineOptions(keep_states=False, keep_sequences=False,
                                    max_seconds=float("inf")))
    wall = time.perf_counter() - t0
    shutdown()  # the workers end: their peak memory is in RUSAGE_CHILDREN
    kib = 1024
    frac, n, overlap, rand = r.topk_overlap((0.01,))[0]
    return {"case": name, "P": task.model.num_params, "V": task.model.vocab_size,
            "T": task.max_len, "states": r.n_states, "responses": r.n_responses,
            "workers": r.cost.workers, "seconds": round(wall, 2),
            "peak_MiB_per_worker": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
                                         / kib, 1),
            "peak_MiB_merging_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
                                              / kib, 1),
            "top1pct_n": n, "top1pct_overlap": round(float(overlap), 4),
            "top1pct_random": round(float(rand), 4),
            "F_over_token_sum": float(np.max(np.abs(r.sequence_fisher - r.token_fisher_sum))
                                      / np.max(r.sequence_fisher))}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(DEFAULT_CASES))
    ap.add_argument("--workers", default="cores",
                    help="processes per case (default: every available core)")
    ap.add_argument("--out", default="docs/guide/large_case.json")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child: one case
    args = ap.parse_args(argv)
    if args.workers == "cores":
        from fisher_ref.parallel.workers import available_cores
        workers = available_cores()
    else:
        workers = int(args.workers)
    if args.one:
        print(json.dumps(run_case(args.one, workers)))
        return 0
    records = []
    for name in args.cases:
        out = subprocess.run([sys.executable, __file__, "--one", name, "--workers", str(workers)],
                             capture_output=True, text=True, check=True)
        rec = json.loads(out.stdout.strip().splitlines()[-1])
        print(rec, flush=True)
        records.append(rec)
    from fisher_ref.perf.scaling import git_commit
    from benchmarks.common import made_by
    doc = {"command": made_by(argv, __file__),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                      f"python {platform.python_version()}",
           "commit": git_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "records": records}
    with open(args.out, "w") as fh:
        json.dump(doc, fh, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
