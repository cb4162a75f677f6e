"""Print the largest error of every exact `verify` row over the shipped configs.

    python scripts/identity_errors.py

Each value is the row's own measure (relative error, or size over the natural
scale); the tolerance is 1e-10. Bound rows print their largest excess (<= 0 holds).
"""
import platform
from collections import defaultdict

from fisher_ref import exact, list_configs, load_config
from fisher_ref.checks.identities import exact_checks


def main():
    worst = defaultdict(lambda: float("-inf"))
    for name in list_configs():
        for row in exact_checks(exact(load_config(name), progress=False)):
            if row.kind in ("equal", "zero", "bound") and "corr" not in row.check:
                key = (row.identity, row.check)
                worst[key] = max(worst[key], row.value)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}; "
          f"configs: {', '.join(list_configs())}\n")
    print("| identity | check | largest |\n|---|---|---|")
    for (identity, check), value in worst.items():
        print(f"| {identity} | {check} | {value:.1e} |")


if __name__ == "__main__":
    main()
