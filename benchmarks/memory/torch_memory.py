"""Peak resident memory and wall time of the exact engines, each run in a fresh process.

    python benchmarks/memory/torch_memory.py [--tasks v16 medium] [--threads 1]

For every scale config named (``fisher_ref/configs/scale/NAME.json``) it starts one
Python process per run — ``torch_exact`` with its defaults (per-state and per-response
arrays kept when they fit in 1 GiB), ``torch_exact`` lean (``keep_states=False,
keep_sequences=False, variances=False``) and the numpy ``exact`` with its defaults — and
prints a markdown table of the wall time of the run and the process's peak RSS
(``VmHWM``, see fisher_ref.perf.memory: interpreter, libraries and the run together), with the 1-minute load
average. The V=16, T=4, hidden 128 task (``v16``) must stay below 2 GiB on the torch
engine; ``tests/torch/test_exact.py`` checks that in CI.
"""
import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUN = """
import json, sys, time, torch
from fisher_ref.perf.memory import peak_rss_bytes
torch.set_num_threads({threads})
from fisher_ref.perf.scaling import load_scale_config
task = load_scale_config({name!r})
t0 = time.perf_counter()
if {engine!r} == "numpy":
    from fisher_ref.engine.fast import exact
    exact(task, progress=False).gathered()  # every per-state array formed, as torch keeps them
else:
    from fisher_ref.torch.exact import torch_exact
    torch_exact(task, **{kwargs!r})
print(json.dumps({{"seconds": time.perf_counter() - t0,
                  "peak": peak_rss_bytes()}}))
"""
RUNS = [("torch_exact (defaults)", "torch", {}),
        ("torch_exact (lean)", "torch", {"keep_states": False, "keep_sequences": False,
                                         "variances": False}),
        ("numpy exact (defaults)", "numpy", {})]


def measure(name, engine, kwargs, threads):
    env = dict(os.environ, **{v: str(threads) for v in ("OMP_NUM_THREADS",
                                                        "OPENBLAS_NUM_THREADS",
                                                        "MKL_NUM_THREADS")})
    code = RUN.format(threads=threads, name=name, engine=engine, kwargs=kwargs)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, env=env, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tasks", nargs="+", default=["v16"])
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    import torch
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
          f"torch {torch.__version__}; {args.threads} thread(s) per run; "
          f"load average before {os.getloadavg()[0]:.2f}\n")
    print("| task | run | wall s | peak RSS GiB |\n|---|---|---|---|")
    for name in args.tasks:
        for label, engine, kwargs in RUNS:
            r = measure(name, engine, kwargs, args.threads)
            print(f"| {name} | {label} | {r['seconds']:.1f} | {r['peak'] / 2**30:.2f} |",
                  flush=True)
    print(f"\nload average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
