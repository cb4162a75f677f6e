"""The torch engine's arrays from another device held against the numpy engine here.

    python benchmarks/gpu/cross_device.py --arrays docs/gpu/gpt2_p100k_arrays.npz
                                   --config gpt2_p100k
                                   [--workers N] [--out FILE]

``--arrays`` is a file written by
``benchmarks/memory/torch_big_task.py --config NAME --arrays FILE``
(on a GPU, say). This script runs ``fisher_ref.exact`` on the same scale config here
(``--workers``, default ``"auto"``: every core once the single-core estimate passes 10 s)
and records, for each saved array of the policy stream, its relative error on the scale
the compare harness judges that quantity by (``fisher_ref.checks.tolerances.scale``: the
numpy array's largest magnitude; for ``G`` and the autodiff gradient the larger of that and
the gradient's natural scale, for ``E[h]`` the larger of that and ``sqrt(max F)``; for
``E[R]``, the larger of ``|E[R]|`` and ``sd(R)``), and the overlap of the top 1% of
parameters by ``|G|`` and by ``F`` on each side. Writes the record as JSON to ``--out``. Exit status 1 if any relative error is above
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
from fisher_ref.engine.plan import EngineOptions

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "BLIS_NUM_THREADS"):
    os.environ.setdefault(_k, "1")  # before numpy: one BLAS thread per process

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

RTOL = 1e-12
FIELDS = {"sequence_fisher": "sequence_fisher", "token_fisher_sum": "token_fisher_sum",
          "gradient": "gradient", "score_mean": "score_mean",
          "gradient_autodiff": "gradient"}  # saved name -> the numpy result's field


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arrays", required=True)
    ap.add_argument("--config", required=True, help="a config of fisher_ref/configs/scale/")
    ap.add_argument("--workers", default="auto", type=lambda s: s if s == "auto" else int(s),
                    help='processes: a positive integer or "auto" (the default)')
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)

    import numpy as np

    from fisher_ref.checks import tolerances as tol
    from fisher_ref.checks.tolerances import rel_error
    from fisher_ref.parallel.run import exact
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
    t0 = time.perf_counter()
    r = exact(task, workers=args.workers, progress=False,
              options=EngineOptions(keep_states=False, keep_sequences=False,
                                    max_seconds=float("inf")))
    seconds = time.perf_counter() - t0
    pol = r.streams["policy"]
    # each field on the scale the compare harness judges it by (fisher_ref.checks.tolerances):
    # its largest entry, or for E[h] and the gradients the larger of that and their natural
    # scale; E[R] on the larger of |E[R]| and sd(R)
    errors = {name: rel_error(other[name], getattr(pol, field), tol.scale(field, pol))[1]
              for name, field in FIELDS.items()}
    errors["expected_reward"] = rel_error(other["expected_reward"], pol.expected_reward,
                                          max(abs(pol.expected_reward), pol.reward_std))[1]
    overlap_here = topk_overlap(pol.gradient, pol.sequence_fisher, (0.01,))[0]
    overlap_there = topk_overlap(other["gradient"], other["sequence_fisher"], (0.01,))[0]
    from benchmarks.common import made_by
    rec = {"command": made_by(argv, __file__), "config": args.config, "P": task.model.num_params, "numpy_workers": r.cost.workers,
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
