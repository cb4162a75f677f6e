"""Print the Monte Carlo tables of the README: exact Rao–Blackwell variance ratios
per shipped config, and the largest |z| per quantity over all configs.

    python scripts/mc_tables.py [--n 20000] [--seed 0]
"""
import argparse
import platform
from collections import defaultdict

import numpy as np

from fisher_ref import exact, list_configs, load_config
from fisher_ref.monte_carlo.estimators import exact_variance_reduction
from fisher_ref.monte_carlo.sampling import check_monte_carlo


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"n={args.n}, seed={args.seed}\n")
    print("| config | stream | min | median | max |\n|---|---|---|---|---|")
    worst = defaultdict(float)
    for name in list_configs():
        task = load_config(name)
        r = exact(task, progress=False)
        for stream in ("policy", "centered", "raw"):
            if stream not in r.streams:
                continue
            ratio = exact_variance_reduction(r, stream)
            ratio = ratio[np.isfinite(ratio)]
            print(f"| {name} | {stream} | {ratio.min():.2f} | {np.median(ratio):.1f} | "
                  f"{ratio.max():.0f} |")
        for row in check_monte_carlo(task, r, args.n, args.seed):
            worst[row.quantity] = max(worst[row.quantity], row.max_abs_z)
    print("\n| quantity | largest abs(z) over configs and streams |\n|---|---|")
    for q, z in worst.items():
        print(f"| `{q}` | {z:.2f} |")


if __name__ == "__main__":
    main()
