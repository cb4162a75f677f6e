"""Time the exact engine on the shipped GPT-2 configs, one thread, every per-state array formed.

    python benchmarks/speed/gpt2_exact_time.py        # median and minimum of 5 runs per config

Threads are pinned to 1 before numpy is imported; the load average is printed with
the result because the development machine is shared.
"""
import os

for var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[var] = "1"

import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

from fisher_ref import exact, load_config  # noqa: E402

REPEATS = 5


def main():
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, 1 thread; load average "
          f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'config':16s} {'P':>6s} {'states':>7s} {'responses':>9s} {'median s':>9s} {'min s':>7s}")
    for name in ("gpt2_small", "gpt2_offpolicy"):
        task = load_config(name)
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            r = exact(task, progress=False).gathered()  # every per-state array formed
            times.append(time.perf_counter() - t0)
        m = task.model
        print(f"{name:16s} {m.num_params:6d} {r.n_states:7d} {r.n_responses:9d} "
              f"{statistics.median(times):9.3f} {min(times):7.3f}")


if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args()
    main()
