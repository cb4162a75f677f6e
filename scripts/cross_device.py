"""The torch engine's arrays from another device held against the numpy engine here.

    python scripts/cross_device.py --arrays docs/gpu/gpt2_p100k_arrays.npz --config gpt2_p100k
                                   [--workers N] [--out FILE]

``--arrays`` is a file written by ``scripts/torch_big_task.py --config NAME --arrays FILE``
(on a GPU, say). This script runs ``fisher_ref.exact`` on the same scale config here
(``--workers``, default ``"auto"``: every core once the single-core estimate passes 10 s)
and records, for each saved array of the policy stream, the largest absolute difference
over the numpy array's largest magnitude (for ``E[h]``, ``G`` and the autodiff gradient,
which are formed by cancellation, over the larger of that and the natural scale
``sqrt(max F) * (|E[R]| + sd(R))``; for ``E[R]``, over the larger of ``|E[R]|`` and
``sd(R)``), and the overlap of the top 1% of parameters by ``|G|`` and by ``F`` on each
side. Writes the record as JSON to ``--out``. Exit status 1 if any relative error is above
1e-12; 2 if the arrays are not of ``--config`` (their saved config name, or their length
where the file names none).
"""
import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ.setdefault(_k, "1")  # before numpy: one BLAS thread per process

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RTOL = 1e-12
FIELDS = {"sequence_fisher": "sequence_fisher", "token_fisher_sum": "token_fisher_sum",
          "gradient": "gradient", "score_mean": "score_mean",
          "gradient_autodiff": "gradient"}  # saved name -> the numpy result's field


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrays", required=True)
    ap.add_argument("--config", required=True, help="a config of fisher_ref/configs/scale/")
    ap.add_argument("--workers", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import numpy as np

    from fisher_ref.engine.fast import exact
    from fisher_ref.fileio import atomic_output
    from fisher_ref.perf.scaling import git_commit, load_scale_config
    from fisher_ref.results import topk_overlap

    other = np.load(args.arrays)
    task = load_scale_config(args.config)
    saved = str(other["config"]) if "config" in other else ""
    P = task.model.num_params
    if (saved and saved != args.config) or len(other["sequence_fisher"]) != P:
        print(f"cross_device.py: --arrays {args.arrays} holds config {saved or '(unnamed)'} "
              f"with {len(other['sequence_fisher'])} parameters, not --config {args.config} "
              f"(P={P})", file=sys.stderr)
        return 2
    workers = args.workers if args.workers == "auto" else int(args.workers)
    t0 = time.perf_counter()
    r = exact(task, workers=workers, progress=False, keep_states=False, keep_sequences=False,
              max_seconds=float("inf"))
    seconds = time.perf_counter() - t0
    pol = r.streams["policy"]
    natural = np.sqrt(np.max(pol.sequence_fisher)) * (abs(pol.expected_reward) + pol.reward_std)
    errors = {}
    for saved, field in FIELDS.items():
        mine, theirs = getattr(pol, field), other[saved]
        scale = np.max(np.abs(mine))
        if field in ("gradient", "score_mean"):
            scale = max(scale, natural)
        errors[saved] = float(np.max(np.abs(theirs - mine)) / scale)
    errors["expected_reward"] = float(abs(float(other["expected_reward"]) - pol.expected_reward)
                                      / max(abs(pol.expected_reward), pol.reward_std))
    overlap_here = topk_overlap(pol.gradient, pol.sequence_fisher, (0.01,))[0]
    overlap_there = topk_overlap(other["gradient"], other["sequence_fisher"], (0.01,))[0]
    rec = {"config": args.config, "P": task.model.num_params, "numpy_workers": r.cost.workers,
           "numpy_seconds": round(seconds, 2), "relative_errors": errors, "rule": RTOL,
           "top1pct_overlap_numpy": overlap_here[2], "top1pct_overlap_other": overlap_there[2],
           "commit": git_commit(), "date": time.strftime("%Y-%m-%d", time.gmtime()),
           "machine": f"{platform.machine()}, {os.cpu_count()} cores, Python "
                      f"{platform.python_version()}, numpy {np.__version__}"}
    print(json.dumps(rec, indent=1))
    if args.out:
        with atomic_output(args.out, "--out file") as tmp:
            Path(tmp).write_text(json.dumps(rec, indent=1) + "\n")
    return 0 if max(errors.values()) <= RTOL else 1


if __name__ == "__main__":
    sys.exit(main())
