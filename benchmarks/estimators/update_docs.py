"""Write the numbers of docs/bench/estimators/*.json into the pages that quote them,
between their ``<!-- NAME -->`` and ``<!-- end NAME -->`` markers:
docs/check/rl_losses.md (batch_bias), docs/performance/speed.md (batch_cost),
docs/check/applied_gradient.md (applied_covariance) and docs/check/end_to_end.md
(trainer_power).
tests/docs/test_estimator_records.py holds the pages to these renderings.

    PYTHONPATH=. python benchmarks/estimators/update_docs.py
"""
import json
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))

import applied_covariance  # noqa: E402
import batch_bias  # noqa: E402
import batch_cost  # noqa: E402
import trainer_power  # noqa: E402

RECORDS = ROOT / "docs" / "bench" / "estimators"


def _where(r):
    return f"measured at commit `{r['commit']}` on {r['machine']}"


def render_bias(r):
    return (batch_bias.table(r) + "\n\nThe record is `docs/bench/estimators/batch_bias.json`, "
            f"{_where(r)}, written by `PYTHONPATH=. python benchmarks/estimators/batch_bias.py`.")


def render_cost(r):
    fb = r["fallback"]
    return (batch_cost.table(r) + "\n\nA loss that `vmap` refuses (a TRL-style loss with "
            "`.item()` in its metrics and a boolean-mask assignment, "
            "`benchmarks/estimators/trainer_losses.py`) is evaluated one batch at a time: on "
            f"`tabular` at `G = 4` ({fb['loop']['n_batches']:,} multisets) it took "
            f"{fb['loop']['seconds']:.3g} s, against {fb['vmap']['seconds']:.3g} s for the same "
            "loss written to vectorise. The record is `docs/bench/estimators/batch_cost.json`, "
            f"{_where(r)} (cores shared with other jobs: single timings, not medians), written "
            "by `PYTHONPATH=. python benchmarks/estimators/batch_cost.py`.")


def render_applied(r):
    d, p = r["correct"]["diagonal_chi2"], next(iter(r["power"].values()))
    return (f"On `{r['task']}` with `{r['loss']}`, G = {r['group_size']} (symmetric), "
            f"P = {r['parameters']} parameters, the exact covariance has rank {r['rank']} and "
            f"{r['zero_gradient_share']:.0%} of the groups have a zero gradient. Over "
            f"{r['runs']:,} runs per row ({r['bennett_runs']:,} for Bennett's bound; seed "
            f"{r['seed']}), steps drawn i.i.d. from the enumerated groups:\n\n" + applied_covariance.table(r) +
            f"\n\nThe diagonal chi-square at {d['steps']} steps has mean/df "
            f"{d['mean_over_df']:.3f} (as it must) but sd/df {d['sd_over_df']:.3f}, against "
            f"{d['chi2_sd_over_df']:.3f} for a chi-square on {d['df']} degrees of freedom. "
            f"The bias is {p['bias']}, direction k of the covariance's rank, by eigenvalue, "
            f"largest first; at alpha = {p['alpha']:g}, {p['seeds']} seeds, checked at "
            f"{', '.join(map(str, p['grid']))} steps. The record is `docs/bench/estimators/applied_covariance.json`, {_where(r)}, "
            f"written by `PYTHONPATH=. python benchmarks/estimators/applied_covariance.py` "
            f"({r['seconds']:.0f} s).")


def render_power(r):
    sn = r["steps_needed"]
    return (trainer_power.table(r) + "\n\nThe grid is "
            f"{', '.join(f'{n:,}' for n in r['grid'])} steps; \"scale\" is the least-squares "
            "fit of the mean applied gradient along the exact one over the whole run (1: "
            "right), averaged over the seeds. For a pure scale error `steps_needed` predicts "
            f"{sn['0.5']:,} steps for 1.5x the gradient, {sn['0.2']:,} for 1.2x, "
            f"{sn['-0.2']:,} for 0.8x and {sn['-0.1']:,} for 0.9x (90% power, from the "
            "best-placed parameter alone). bf16's bias is not a scale error (its scale is "
            f"{r['cases']['bf16_default']['mean_scale']:.3f}): it lies along low-variance "
            "directions, where only the covariance test sees it. The "
            f"record is `docs/bench/estimators/trainer_power.json`, {_where(r)}, written by "
            f"`PYTHONPATH=. python benchmarks/estimators/trainer_power.py` ({r['seconds']:.0f} "
            "s).")


PAGES = {"trainer_power": (ROOT / "docs" / "check" / "end_to_end.md", render_power),
         "applied_covariance": (ROOT / "docs" / "check" / "applied_gradient.md",
                                render_applied),
         "batch_bias": (ROOT / "docs" / "check" / "rl_losses.md", render_bias),
         "batch_cost": (ROOT / "docs" / "performance" / "speed.md", render_cost)}


def region(text, name):
    """The text between the markers of ``name`` in ``text`` (stripped)."""
    m = re.search(rf"<!-- {name} -->\n(.*?)\n<!-- end {name} -->", text, flags=re.S)
    return None if m is None else m.group(1).strip()


def rendered(name):
    page, render = PAGES[name]
    return render(json.loads((RECORDS / f"{name}.json").read_text()))


def main():
    for name, (page, _) in PAGES.items():
        text = page.read_text()
        assert region(text, name) is not None, f"{page} has no {name} markers"
        new = re.sub(rf"(<!-- {name} -->\n).*?(\n<!-- end {name} -->)",
                     lambda m: m.group(1) + rendered(name) + m.group(2), text, flags=re.S)
        page.write_text(new)



if __name__ == "__main__":
    import argparse
    argparse.ArgumentParser(description="write the estimator records into the pages that quote them").parse_args()
    main()
