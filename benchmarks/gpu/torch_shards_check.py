"""Shards of the torch engine on one device, merged, against one run on that device.

    python benchmarks/gpu/torch_shards_check.py [--device cuda] [--configs default gpt2_small ...]
                                         [--scale v16] [--shards 2 3 5] [--out FILE]

For each task (shipped configs, and the scale configs named by ``--scale``) it runs
``torch_exact(task, device=...)`` once, then for each ``n`` of ``--shards`` the ``n``
shards ``torch_exact(task, device=..., shard=(i, n))``, each sent through pickle (as it
would cross to another machine), and their merge ``torch_exact(task, merge=parts)``. It
records the largest relative error of the merge against the one run over every field
(``fisher_ref.torch.shards.merge_errors``: every stream quantity, the variances, the
autodiff gradient, the per-state and per-response arrays), whether it is within 1e-12,
and the wall time of the one run (after an untimed warm-up run) and of the shards one
after another. The scale tasks run without
per-state and per-response arrays. Writes a table to stdout and the records as JSON to
``--out``. Exit status 1 if any merge is off by more than 1e-12 in any field, a field is
NaN, or an integer record differs (that merge is recorded as failed, with the reason).
"""
import argparse
import json
import pickle
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RTOL = 1e-12
CONFIGS = ("default", "offpolicy_temperature", "no_eos", "gpt2_small", "weighted_prompts")


def check(task, name, device, shards, keep):
    """One task's records: a list of dicts, one per shard count."""
    import numpy as np

    from fisher_ref.parallel.shards import ShardError
    from fisher_ref.torch.exact import torch_exact
    from fisher_ref.torch.shards import merge_errors

    opts = dict(device=device, keep_states=keep, keep_sequences=keep)
    torch_exact(task, **opts)  # warm-up: the first run on a device pays its set-up
    t0 = time.perf_counter()
    one = torch_exact(task, **opts)
    one_s = time.perf_counter() - t0
    out = []
    for n in shards:
        t0 = time.perf_counter()
        parts = [pickle.loads(pickle.dumps(torch_exact(task, shard=(i, n), **opts)))
                 for i in range(n)]
        shards_s = time.perf_counter() - t0
        try:
            errs = merge_errors(torch_exact(task, merge=parts, **opts), one)
        except ShardError as e:  # an integer record differs, or records kept by one only
            errs = {f"records ({e})": float("nan")}
        # the worst field, a NaN first (max() passes over a NaN that is not first)
        worst = max(errs, key=lambda k: (np.isnan(errs[k]), errs[k]))
        out.append({"task": name, "shards": n, "max_rel_error": errs[worst], "worst_field": worst,
                    "fields": len(errs), "ok": all(e <= RTOL for e in errs.values()),
                    "one_run_s": round(one_s, 3),
                    "shards_s": round(shards_s, 3), "pickled_bytes": sum(
                        len(pickle.dumps(p)) for p in parts)})
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--configs", nargs="*", default=list(CONFIGS))
    ap.add_argument("--scale", nargs="*", default=["v16"], help="configs of configs/scale/")
    ap.add_argument("--shards", nargs="*", type=int, default=[2, 3, 5])
    ap.add_argument("--out", default=None, help="write the records as JSON here")
    args = ap.parse_args(argv)

    import torch

    from fisher_ref import load_config
    from fisher_ref.fileio import atomic_output
    from fisher_ref.perf.scaling import load_scale_config

    torch.set_num_threads(1)
    records = []
    for name in args.configs:
        records += check(load_config(name), name, args.device, args.shards, "auto")
    for name in args.scale:
        records += check(load_scale_config(name), f"scale/{name}", args.device, args.shards, False)
    print(f"torch shards merged against one torch run on {args.device} "
          f"(torch {torch.__version__}); relative errors, rule {RTOL:g}")
    print(f"{'task':24s} {'n':>2s} {'max rel error':>14s} {'one run s':>10s} {'shards s':>9s}"
          "  worst field")
    for r in records:
        print(f"{r['task']:24s} {r['shards']:2d} {r['max_rel_error']:14.2e} {r['one_run_s']:10.3f} "
              f"{r['shards_s']:9.3f}  {r['worst_field']}{'' if r['ok'] else '  FAIL'}")
    bad = [r for r in records if not r["ok"]]
    print(f"{len(records) - len(bad)}/{len(records)} merges within {RTOL:g}")
    if args.out:
        from benchmarks.common import made_by
        rec = {"command": made_by(argv, __file__), "device": args.device, "torch": torch.__version__, "rule": RTOL,
               "records": records}
        with atomic_output(args.out, "--out file") as tmp:
            Path(tmp).write_text(json.dumps(rec, indent=1) + "\n")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
