"""Print the performance tables of the README in one run, on one machine:

1. ``bench``: fisher_ref's exact engine against torch doing the same exact work
   on the CPU in float64 (interleaved, medians) on every shipped MLP config and
   on the medium scale config;
2. the fast engine against the plain reference engine (``engine_speedup``).

Both call ``exact(task)`` with its defaults (per-state and per-response arrays
kept when they fit, as ``bench`` does).

    python scripts/perf_tables.py [--repeats 7]
"""
import argparse

from fisher_ref import list_configs, load_config
from fisher_ref.bench import bench
from fisher_ref.scaling import engine_speedup, load_scale_config, machine, scale_task


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    args = ap.parse_args()
    print(f"machine: {machine()}\n")
    tasks = [load_config(n) for n in list_configs() if n != "tabular"]
    medium = load_scale_config("medium")
    medium.name = "medium"
    print("| config | states | responses | P | fisher_ref (s) | torch CPU float64 (s) | ratio |")
    print("|---|---|---|---|---|---|---|")
    for task in tasks + [medium]:
        res = bench(task, repeats=args.repeats if task is not medium else 3,
                    names=["fisher_ref", "torch_cpu_float64"])
        med = res["median"]
        print(f"| {task.name} | {res['n_states']:,} | {res['n_responses']:,} | "
              f"{res['num_params']:,} | {med['fisher_ref']:.4f} | "
              f"{med['torch_cpu_float64']:.4f} | {res['ratio']['torch_cpu_float64']:.2f} |")
    print("\n| task | reference engine (s) | fast engine (s) | speed-up |\n|---|---|---|---|")
    big = scale_task(16, 4, 32)
    big.name = "V=16, T=4, P=1,208"
    for task in [load_config(n) for n in list_configs()] + [medium, big]:
        s = engine_speedup(task, repeats=3)
        print(f"| {task.name} | {s['reference_s']:.4f} | {s['fast_s']:.4f} | "
              f"{s['speedup']:.1f}x |")


if __name__ == "__main__":
    main()
