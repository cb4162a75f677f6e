"""float32 on peaked models: the correlation judged flatly against its largest entry and
by error propagation from its parts (fisher_ref.checks.tolerances), per shipped config with
``init_scale`` 3.

    python benchmarks/accuracy/peaked_compare.py [--configs default no_eos offpolicy_stale]

Prints a markdown table: for each config and stream, the worst relative error of the
float32 correlation under both rules, the worst of its parts (covariance, bound) and
whether every float32 ``compare`` row passes.
"""
import argparse
import json
import sys
from pathlib import Path
from fisher_ref.engine.plan import EngineOptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--configs", nargs="+",
                    default=["default", "no_eos", "offpolicy_stale", "weighted_prompts"])
    args = ap.parse_args(argv)
    from fisher_ref.checks.compare import compare, highest_matmul_precision
    from fisher_ref.checks.tolerances import TOL_FLOAT32, correlation_scale, rel_error
    from fisher_ref.engine.fast import exact
    from fisher_ref.tasks import task_from_json
    from fisher_ref.torch.exact import torch_exact
    print("| config (init_scale 3) | stream | correlation, flat | correlation, propagated "
          "| worst part (cov, bound) | all float32 rows pass |\n|---|---|---|---|---|---|")
    for name in args.configs:
        spec = json.loads((ROOT / "fisher_ref" / "configs" / f"{name}.json").read_text())
        spec["model"]["init_scale"] = 3.0
        task = task_from_json(spec, name=name)
        ref = exact(task, progress=False,
                    options=EngineOptions(keep_states=True, keep_sequences=True))
        with highest_matmul_precision():
            out = torch_exact(task, dtype="float32")
        ok = all(r["passed"] for r in compare(task, dtypes=["float32"], mc=0, ref=ref))
        for s, d in out["streams"].items():
            st = ref.streams[s]
            flat = rel_error(d["correlation"], st.correlation)[1]
            prop = rel_error(d["correlation"], st.correlation, correlation_scale(st))[1]
            part = max(rel_error(d[q], getattr(st, q))[1] for q in ("covariance", "bound"))
            print(f"| {name} | {s} | {flat:.1e}{' (fails)' if flat > TOL_FLOAT32 else ''} | "
                  f"{prop:.1e} | {part:.1e} | {'yes' if ok else 'NO'} |", flush=True)


if __name__ == "__main__":
    main()
