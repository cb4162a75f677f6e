"""The relative bias of verl's token-mean and TRL's dapo against the number of groups
that share the token normaliser: per group (K = 1), mini-batches of K = 2, 3 groups, and
the large-batch limit (the normaliser replaced by its limit, K G E|y|). Exact, by
enumeration (fisher_ref.estimators). Writes docs/bench/estimators/batch_bias.json and the
plot docs/bench/estimators/batch_bias.png, which docs/check/rl_losses.md shows.

    PYTHONPATH=. python benchmarks/estimators/batch_bias.py
"""
import datetime
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

from trainer_losses import trl_dapo, verl_token_mean  # noqa: E402

from fisher_ref import load_config  # noqa: E402
from fisher_ref.estimators import check_loss  # noqa: E402
from fisher_ref.perf.scaling import git_commit, machine  # noqa: E402

OUT = ROOT / "docs" / "bench" / "estimators"
TASK, G, KS = "tabular", 2, (1, 2, 3)
LOSSES = {"verl GRPO token-mean": verl_token_mean, "verl RLOO token-mean":
          lambda reading: verl_token_mean("rloo", reading), "TRL dapo": trl_dapo}


def verdict(task, loss, K):
    t0 = time.perf_counter()
    v = check_loss(task, loss, G, "unbiased-up-to-scale", symmetric=True, groups_per_batch=K,
                   max_groups=3_000_000)
    return {"K": K, "passed": v.passed, "scale": v.scale, "relative_bias": v.relative_bias,
            "n_batches": v.gradient.n_batches, "seconds": round(time.perf_counter() - t0, 2)}


def main():
    task = load_config(TASK)
    rows = {}
    for name, make in LOSSES.items():
        rows[name] = {"per_batch": [verdict(task, make(reading="batch"), K) for K in KS],
                      "large_batch": verdict(task, make(reading="limit"), 1)}
        print(name, rows[name], flush=True)
    record = {"command": "python benchmarks/estimators/batch_bias.py",
              "commit": git_commit(ROOT), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "task": TASK, "group_size": G, "expect": "unbiased-up-to-scale", "losses": rows}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "batch_bias.json").write_text(json.dumps(record, indent=1) + "\n")
    plot(record, OUT / "batch_bias.png")
    print(table(record))


def table(record):
    """The Markdown table docs/check/rl_losses.md shows (a test holds the page to it)."""
    Ks = [r["K"] for r in next(iter(record["losses"].values()))["per_batch"]]
    head = "| loss | " + " | ".join(f"K = {k}" for k in Ks) + " | large batch |"
    lines = [head, "|---" * (len(Ks) + 2) + "|"]

    def cell(r):
        return (f"{'PASS' if r['passed'] else 'FAIL'} {r['relative_bias']:.3g} "
                f"(scale {r['scale']:+.4f})")
    for name, row in record["losses"].items():
        lines.append(f"| {name} | " + " | ".join(cell(r) for r in row["per_batch"])
                     + f" | {cell(row['large_batch'])} |")
    return "\n".join(lines)


def plot(record, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for c, (name, row) in enumerate(record["losses"].items()):
        ks = [r["K"] for r in row["per_batch"]]
        ax.plot(ks, [r["relative_bias"] for r in row["per_batch"]], "os^"[c % 3] + "-:-"[c % 3],
                color=f"C{c}", label=name, ms=8 - 2 * c)
        ax.axhline(row["large_batch"]["relative_bias"], color=f"C{c}", ls="--", lw=1)
    ax.set_xlabel("groups per batch K (dashed: the large-batch limit)")
    ax.set_ylabel("relative bias")
    ax.set_xticks(list(KS))
    ax.set_title(f"{record['task']}, G = {record['group_size']}, at {record['commit']}",
                 fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)



if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="the relative bias of verl's token-mean and TRL's dapo against the groups per batch (docs/bench/estimators/batch_bias.json and .png)").parse_args()
    main()
