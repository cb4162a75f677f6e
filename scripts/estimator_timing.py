"""Time ``expected_loss_gradient(task, preset, group_size=1)`` against ``exact(task)`` in
one run, on one machine: interleaved repeats, minima and medians, one torch and one
BLAS thread. The loss call includes its own
``exact(task)`` (for ``policy_gradient``), as a user's call does. Measures; asserts
nothing.

    python scripts/estimator_timing.py [--repeats 7] [--preset reinforce]
"""
import os

# One BLAS thread on both sides, set before numpy loads (threadpoolctl need not be there).
for _v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fisher_ref import exact, list_configs, load_config  # noqa: E402
from fisher_ref.estimators import expected_loss_gradient, presets  # noqa: E402
from fisher_ref.perf.scaling import load_scale_config, machine  # noqa: E402


def _time(fn):
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--preset", default="reinforce", choices=sorted(presets.PRESETS))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).resolve().parents[1]).stdout.strip()
    print(f"machine: {machine()}; torch {torch.__version__}; commit {commit or 'unknown'}; "
          f"load average {os.getloadavg()[0]:.2f}; preset {args.preset}, group_size=1\n")
    tasks = [load_config(n) for n in list_configs()] + [load_scale_config("medium")]
    tasks[-1].name = "medium"
    print(f"{'task':24s} {'exact min':>10s} {'loss min':>10s} {'ratio min':>9s} "
          f"{'ratio med':>9s}")
    for task in tasks:
        loss = presets.preset(args.preset)
        ex = lambda: exact(task, progress=False)  # noqa: E731
        lo = lambda: expected_loss_gradient(task, loss)  # noqa: E731
        ex(), lo()  # warm: imports, vmap, caches
        te, tl = [], []
        for _ in range(args.repeats):
            te.append(_time(ex))
            tl.append(_time(lo))
        ratios = [b / a for a, b in zip(te, tl)]
        print(f"{task.name:24s} {min(te):10.4f} {min(tl):10.4f} {min(tl) / min(te):9.2f} "
              f"{statistics.median(ratios):9.2f}")


if __name__ == "__main__":
    main()
