"""A large task run by the torch engine on the CPU in bounded memory, by the same code
path that runs on a GPU.

    python benchmarks/memory/torch_big_task.py [--vocab 16 --max-len 5 --hidden 768] [--out FILE]
                                     [--device cpu] [--chunk N]
                                     [--config NAME] [--arrays FILE.npz]

The default task (V=16, T=5, context 2, embed 8, hidden 768: P=25,496 parameters,
54,241 states, 813,616 responses) was refused by ``fisher_ref.exact`` when it was
recorded; the recalibrated estimate of today's faster numpy engine accepts it. The
script reports the numpy engine's verdict at its default limits (``check_cost``, without
running it), runs ``torch_exact(task, keep_states=False, keep_sequences=False,
variances=False)`` — every stream quantity, cross terms and the autograd gradient, but
not the fourth moments used only by Monte Carlo tests — and records the wall time, the
peak resident memory of the process (``VmHWM``, see fisher_ref.perf.memory: interpreter, torch and the run), the
1-minute load average before and after, and two exact identities as a check of the
result: ``F = sum_s pi(s) f(s)`` and ``E[A h] = d E[R] / d theta`` (autograd), as
relative errors. The record goes to ``--out`` as JSON (written atomically). Exit status
1 if either identity is off by more than 1e-10 relative.

``--config NAME`` runs a config of ``fisher_ref/configs/scale/`` (``gpt2_p100k``, say)
instead of the ``scale_task`` of ``--vocab``, ``--max-len`` and ``--hidden``.
``--arrays FILE.npz`` also saves the policy stream's ``(P,)`` arrays (``F``, the token
sum, ``G``, ``E[h]``, the autodiff gradient) and ``E[R]``, for
``benchmarks/gpu/cross_device.py`` to hold against the numpy engine on another machine. On a
CUDA device the record also gives the peak GPU memory torch allocated.
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from fisher_ref.perf.memory import peak_rss_bytes  # noqa: E402


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, default=16)
    ap.add_argument("--max-len", type=int, default=5)
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--chunk", type=int, default=None, help="states per block (default: sized)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--config", default=None, help="a config of fisher_ref/configs/scale/")
    ap.add_argument("--arrays", default=None, help="save the policy stream's (P,) arrays here")
    ap.add_argument("--out", default=None, help="write the record as JSON here")
    args = ap.parse_args(argv)

    import numpy as np
    import torch
    from fisher_ref.engine.plan import EnumerationTooLarge, check_cost, estimate_cost
    from fisher_ref.fileio import atomic_output
    from fisher_ref.perf.scaling import git_commit, load_scale_config, scale_task
    from fisher_ref.torch.exact import torch_exact

    torch.set_num_threads(args.threads)
    task = (scale_task(args.vocab, args.max_len, args.hidden) if args.config is None
            else load_scale_config(args.config))
    cost = estimate_cost(task)
    try:
        check_cost(cost)
        refused = None
    except EnumerationTooLarge as exc:
        refused = str(exc)
    print(f"task: {args.config or f'V={args.vocab}, T={args.max_len}, hidden {args.hidden}'}: "
          f"{cost.describe()}")
    print(f"numpy engine at its default limits: {refused or 'ACCEPTED (not too big)'}")
    rss0 = peak_rss_bytes()
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    out = torch_exact(task, device=args.device, chunk=args.chunk, keep_states=False,
                      keep_sequences=False, variances=False,
                      max_seconds=float("inf"))  # the time limit is the numpy engine's
    seconds = time.perf_counter() - t0
    peak = peak_rss_bytes()
    pol = out["streams"]["policy"]
    F, tsum, G = pol["sequence_fisher"], pol["token_fisher_sum"], pol["gradient"]
    from benchmarks.common import made_by
    rec = {"command": made_by(argv, __file__), "task": {"config": args.config, "vocab_size": task.model.vocab_size,
                    "max_len": task.max_len, "hidden": None if args.config else args.hidden,
                    "num_params": cost.num_params, "n_states": cost.n_states,
                    "n_responses": cost.n_responses},
           "numpy_refusal": refused, "commit": git_commit(), "device": args.device, "torch_threads": args.threads,
           "seconds": seconds, "peak_rss_bytes": int(peak), "rss_before_run_bytes": int(rss0),
           "load_average_before": load0, "load_average_after": os.getloadavg()[0],
           "identity_F_equals_token_sum_rel": float(np.max(np.abs(F - tsum)) / np.max(F)),
           "identity_gradient_autodiff_rel": float(np.max(np.abs(G - out["gradient_autodiff"]))
                                                   / np.max(np.abs(G))),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                      f"{platform.python_version()}, torch {torch.__version__}"}
    if str(args.device).startswith("cuda"):
        dev = torch.device(args.device)
        rec["peak_gpu_bytes"] = int(torch.cuda.max_memory_allocated(dev))
        rec["gpu"] = torch.cuda.get_device_name(dev)
    print(json.dumps(rec, indent=1))
    if args.out:
        with atomic_output(args.out, "--out file") as tmp:
            Path(tmp).write_text(json.dumps(rec, indent=1) + "\n")
    if args.arrays:
        with atomic_output(args.arrays, "--arrays file") as tmp:
            with open(tmp, "wb") as f:
                np.savez_compressed(f, config=np.str_(args.config or ""),
                                    num_params=np.int64(cost.num_params),
                                    sequence_fisher=F, token_fisher_sum=tsum, gradient=G,
                                    score_mean=pol["score_mean"],
                                    gradient_autodiff=out["gradient_autodiff"],
                                    expected_reward=np.float64(pol["expected_reward"]))
    bad = {k: v for k, v in rec.items() if k.startswith("identity_") and not v <= 1e-10}
    if bad:
        print(f"exact identities off by more than 1e-10 relative: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
