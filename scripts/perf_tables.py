"""Print the performance tables of the README in one run, on one machine:

1. ``bench``: fisher_ref's exact engine against the torch engine doing the same exact
   work on the CPU in float64 — one process per side, one thread each, interleaved
   repeats, medians and minima, the load average — on every shipped config and on the
   medium and V=16 scale configs, with the independent minimal torch peer
   (``scripts/torch_peer.py``, F, E[h] and the token Fisher only) where it exists, and
   then ``exact(task, quantities="fisher")``, the numpy engine doing the peer's work;
2. the fast engine against the plain reference engine (``engine_speedup``).

Both call ``exact(task)`` with its defaults (per-state and per-response arrays
kept when they fit, as ``bench`` does), except the like-for-like column.

    python scripts/perf_tables.py [--repeats 7]
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fisher_ref import list_configs, load_config
from fisher_ref.perf.bench import bench
from fisher_ref.perf.scaling import engine_speedup, load_scale_config, machine, scale_task


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    import subprocess
    import torch
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    print(f"machine: {machine()}; torch {torch.__version__}; commit {commit or 'unknown'}\n")
    tasks = [load_config(n) for n in list_configs()]
    scale = []
    for name in ("medium", "v16"):
        t = load_scale_config(name)
        t.name = name
        scale.append(t)
    print("| config | states | responses | P | fisher_ref median (min) s | torch CPU float64 "
          "median (min) s | fisher_ref / torch | torch peer median s | fisher_ref / peer "
          "| quantities='fisher' median s | quantities='fisher' / peer | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for task in tasks + scale:
        res = bench(task, repeats=3 if any(task is t for t in scale) else args.repeats,
                    threads=1)
        med, mn, r = res["median"], res["min"], res["ratio"]
        peer = ("%.4f | %.2f | %.4f | %.2f" % (
            med["torch_peer"], r["torch_peer"], med["fisher_ref_fisher"],
            res["ratio_like"]["torch_peer"])) if "torch_peer" in med else "- | - | - | -"
        loads = [x[0] for x in res["loadavg"]]
        print(f"| {task.name} | {res['n_states']:,} | {res['n_responses']:,} | "
              f"{res['num_params']:,} | {med['fisher_ref']:.4f} ({mn['fisher_ref']:.4f}) | "
              f"{med['torch_cpu_float64']:.4f} ({mn['torch_cpu_float64']:.4f}) | "
              f"{r['torch_cpu_float64']:.2f} | {peer} | {min(loads):.1f}-{max(loads):.1f} |",
              flush=True)
    print("\n| task | reference engine (s) | fast engine (s) | speed-up |\n|---|---|---|---|")
    big = scale_task(16, 4, 32)
    big.name = "V=16, T=4, P=1,208"
    for task in [load_config(n) for n in list_configs()] + [scale[0], big]:
        s = engine_speedup(task, repeats=3)
        print(f"| {task.name} | {s['reference_s']:.4f} | {s['fast_s']:.4f} | "
              f"{s['speedup']:.1f}x |")


if __name__ == "__main__":
    main()
