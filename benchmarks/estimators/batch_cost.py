"""What mini-batches cost: expected_loss_gradient with groups_per_batch K = 1, 2, 3 on the
shipped small tasks (batches enumerated and seconds, or the refusal past max_groups), and
a TRL-style loss that vmap refuses (.item() in its metrics, a boolean-mask assignment)
against the same loss written to vectorise, at G = 4. Not a timed test: a record,
docs/bench/estimators/batch_cost.json, quoted in docs/performance/speed.md.

    PYTHONPATH=. python benchmarks/estimators/batch_cost.py
"""
import datetime
import json
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from trainer_losses import trl_vectorised, trl_verbatim_style, verl_token_mean  # noqa: E402

from fisher_ref import load_config  # noqa: E402
from fisher_ref.engine.plan import EnumerationTooLarge  # noqa: E402
from fisher_ref.estimators import expected_loss_gradient, presets  # noqa: E402
from fisher_ref.perf.scaling import git_commit, machine  # noqa: E402

OUT = ROOT / "docs" / "bench" / "estimators"
TASKS = ("tabular", "no_eos", "offpolicy_stale", "default", "weighted_prompts")
SETTINGS = ((1, False), (2, True))  # (G, symmetric)


def timed(task, loss, G, symmetric, K, **kw):
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lg = expected_loss_gradient(task, loss, G, symmetric, groups_per_batch=K, **kw)
    except EnumerationTooLarge as exc:
        return {"K": K, "refused": str(exc).split(":")[1].split("(")[0].strip()}
    return {"K": K, "n_batches": lg.n_batches, "seconds": round(time.perf_counter() - t0, 3),
            "evaluation": lg.evaluation}


def table(record):
    """The Markdown table docs/performance/speed.md shows (a test holds the page to it)."""
    lines = ["| task | G | K = 1 | K = 2 | K = 3 |", "|---|---|---|---|---|"]

    def cell(r):
        if "refused" in r:
            return f"refused ({r['refused']})"
        return f"{r['n_batches']:,} batches, {r['seconds']:.3g} s"
    for row in record["rows"]:
        sym = " (multisets)" if row["symmetric"] else ""
        lines.append(f"| {row['task']} | {row['group_size']}{sym} | "
                     + " | ".join(cell(r) for r in row["runs"]) + " |")
    return "\n".join(lines)


def main():
    timed(load_config("tabular"), presets.reinforce(), 1, False, 1)  # torch's warm-up
    rows = []
    for name in TASKS:
        task = load_config(name)
        for G, symmetric in SETTINGS:
            loss = verl_token_mean("grpo" if G > 1 else "rloo", "batch") if G > 1 else \
                (lambda b: -(b.rewards * (b.logp * b.mask).sum(1)).sum() / b.mask.sum())
            runs = [timed(task, loss, G, symmetric, K) for K in (1, 2, 3)]
            rows.append({"task": name, "group_size": G, "symmetric": symmetric, "runs": runs})
            print(rows[-1], flush=True)
    task, G = load_config("tabular"), 4
    fallback = {"task": "tabular", "group_size": G, "symmetric": True,
                "vmap": timed(task, trl_vectorised(G), G, True, 1),
                "loop": timed(task, trl_verbatim_style(G), G, True, 1)}
    print(fallback, flush=True)
    record = {"command": "python benchmarks/estimators/batch_cost.py",
              "commit": git_commit(ROOT), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "max_groups": 2_000_000, "rows": rows, "fallback": fallback}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "batch_cost.json").write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))



if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="the cost of enumerating K = 1, 2, 3 groups per batch on the shipped tasks (docs/bench/estimators/batch_cost.json)").parse_args()
    main()
