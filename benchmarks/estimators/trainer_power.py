"""How many steps of a real TRL GRPOTrainer each check needs to see each pipeline bug:
the power table of docs/check/end_to_end.md. The setup of tests/torch/test_trl_end_to_end.py
(a one-layer float64 Llama, hidden 4, vocabulary 4, one prompt, T = 3, G = 3, grpo), each
bug of tests/torch/trl_bugs.py injected, and TRL's default bf16; per seed, the
first step count of a grid at which each test (Bennett's bound, alpha 5e-7 each: the
tests' setting) fails on the run's first n steps, and what steps_needed predicts for a
scale error of the size measured. Writes docs/bench/estimators/trainer_power.json.

    PYTHONPATH=. python benchmarks/estimators/trainer_power.py [--seeds 3]
"""
import argparse
import datetime
import json
import time
import warnings
from pathlib import Path

import numpy as np
import torch

from fisher_ref.estimators import trl_expected
from fisher_ref.perf.scaling import git_commit, machine
from fisher_ref.testing import check_applied_covariance, check_applied_gradient, steps_needed
from fisher_ref.torch import GradientRecorder
from fisher_ref.torch.tiny import checkable_grpo_trainer, tiny_llama, tiny_tokenizer
from tests.torch.trl_bugs import TRL_BUGS, inject_trl_bug  # the bugs the tests inject

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "docs" / "bench" / "estimators" / "trainer_power.json"
MODEL = {"hidden": 4, "intermediate": 8, "init_std": 0.6, "seed": 0}
V, T, G, ALPHA, LOSS = 4, 3, 3, 1e-6, "grpo"
GRID = (30, 50, 100, 150, 200, 300, 500, 700, 1000, 1500, 2000, 3000)
#: case: (bug or None, bf16, steps run)
CASES = {"clean": (None, False, 3000),
         "logprobs_one_position_early": ("logprobs_one_position_early", False, 300),
         "token_after_eos_in_mask": ("token_after_eos_in_mask", False, 300),
         "advantages_not_divided_by_std": ("advantages_not_divided_by_std", False, 3000),
         "bf16_default": (None, True, 2000)}


def reward_func(prompts, completions, completion_ids, **kwargs):
    return [float(sum(t == 1 for t in c)) + 0.25 * float(sum(t == 2 for t in c))
            for c in completion_ids]


def trainer(steps, seed, bf16, callbacks=()):
    return checkable_grpo_trainer(tiny_llama(V, **MODEL), tiny_tokenizer(V), reward_func, "t1",
                                  num_generations=G, max_completion_length=T, steps=steps,
                                  seed=seed, bf16=bf16, callbacks=callbacks, loss_type=LOSS)


def first_flagged(samples, target):
    """The first n of GRID (up to the steps run) at which each test fails, or None."""
    out = {"per_parameter": None, "covariance": None}
    for n in (n for n in GRID if n <= len(samples)):
        if out["per_parameter"] is None and not check_applied_gradient(
                samples[:n], target.exact, alpha=ALPHA / 2):
            out["per_parameter"] = n
        if out["covariance"] is None and not check_applied_covariance(
                samples[:n], target.exact, alpha=ALPHA / 2, distribution=target.distribution):
            out["covariance"] = n
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    target = trl_expected(trainer(1, 0, False), distribution=True)
    cases = {}
    for name, (bug, bf16, steps) in CASES.items():
        runs = []
        for seed in range(a.seeds):
            rec = GradientRecorder()
            tr = trainer(steps, seed, bf16, [rec])
            if bug is None:
                tr.train()
            else:
                with inject_trl_bug(bug):
                    tr.train()
            s = rec.samples()
            mm = float(target.exact.mean @ target.exact.mean)
            runs.append({"seed": seed, "steps": steps, **first_flagged(s, target),
                         "scale": float(s.mean(0) @ target.exact.mean / mm)})
        scale = float(np.mean([r["scale"] for r in runs]))
        cases[name] = {"what": TRL_BUGS[bug][0] if bug else (
            "GRPOConfig's default bf16=True (autocast in the log-prob recompute)" if bf16
            else "no bug"), "runs": runs, "mean_scale": scale,
            "steps_needed_for_that_scale": (
                steps_needed(target.exact, scale - 1, alpha=ALPHA / 2, power=0.9)
                if abs(scale - 1) > 0.01 else None)}
        print(name, [(r["per_parameter"], r["covariance"]) for r in runs], round(scale, 3),
              flush=True)
    record = {"command": "python benchmarks/estimators/trainer_power.py",
              "commit": git_commit(ROOT), "machine": machine(),
              "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
              "setup": {"model": MODEL, "vocab": V, "T": T, "G": G, "loss_type": LOSS,
                        "parameters": int(target.exact.mean.size), "alpha_each": ALPHA / 2},
              "grid": list(GRID), "cases": cases,
              "steps_needed": {str(r): steps_needed(target.exact, r, alpha=ALPHA / 2)
                               for r in (0.5, 0.2, -0.2, -0.1)},
              "seconds": round(time.perf_counter() - t0, 1)}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(record, indent=1) + "\n")
    print(table(record))


def table(r):
    """The Markdown table docs/check/end_to_end.md shows (a test holds the page to it)."""
    fmt = lambda x: "not within the run" if x is None else f"{x:,}"  # noqa: E731
    lines = ["| run | scale along the exact gradient | per-parameter test flags at | "
             "covariance test flags at |", "|---|---|---|---|"]
    for name, c in r["cases"].items():
        per = ", ".join(fmt(x["per_parameter"]) for x in c["runs"])
        cov = ", ".join(fmt(x["covariance"]) for x in c["runs"])
        lines.append(f"| {name.replace('_', ' ')} ({c['runs'][0]['steps']:,} steps) | "
                     f"{c['mean_scale']:.3f} | {per} | {cov} |")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
