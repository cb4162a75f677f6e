"""Tests of fisher_ref.checks.identities and the `verify` command line."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


import fisher_ref.engine.fast as exact_mod
from fisher_ref import exact, list_configs, load_config, task_from_json
from fisher_ref.cli import main
from fisher_ref.checks.identities import exact_checks

CONFIGS = list_configs()


@pytest.mark.parametrize("name", CONFIGS)
def test_every_exact_check_passes_on_shipped_configs(name):
    rows = exact_checks(exact(load_config(name), progress=False))
    failed = [(r.check, r.value) for r in rows if not r.passed]
    assert not failed, f"{name}: {failed}"
    assert len(rows) >= 20


@pytest.mark.parametrize("name", CONFIGS)
def test_verify_command_exits_zero(name, capsys):
    assert main(["verify", "--config", name, "--mc", "0", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "checks passed" in out and "FAIL" not in out


def test_verify_command_with_monte_carlo(capsys):
    assert main(["verify", "--config", "default", "--mc", "4000", "--seed", "3", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "mc" in out.lower() and "FAIL" not in out


def test_verify_exits_one_when_an_identity_fails(monkeypatch, capsys):
    real = exact_mod.exact

    def broken(task, **kw):
        r = real(task, **kw)
        r.streams["policy"].token_fisher_sum = r.streams["policy"].token_fisher_sum * (1 + 1e-6)
        return r

    monkeypatch.setattr(exact_mod, "exact", broken)
    assert main(["verify", "--config", "default", "--mc", "0", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAIL" in out and "F = sum_s pi(s) f(s)" in out


def test_verify_reads_a_task_file(tmp_path, capsys):
    task = {"model": {"vocab_size": 3, "context": 1, "embed_dim": 2, "hidden": 3, "eos": True,
                      "init_seed": 11, "init_scale": 2.0},
            "prompts": [[], [2, 1]], "prompt_weights": [0.25, 0.75], "max_len": 4,
            "reward": {"name": "match", "target": [1, 1]}, "baseline": "mean",
            "sampler": {"kind": "rounded", "decimals": 0}}
    path = tmp_path / "unseen.json"
    path.write_text(json.dumps(task))
    assert main(["verify", "--task", str(path), "--mc", "0", "--quiet"]) == 0
    assert "unseen" in capsys.readouterr().out


def test_verify_reports_bad_task_file_clearly(tmp_path, capsys):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"model": {"vocab_size": 3}, "prompts": [[7]], "max_len": 2}))
    assert main(["verify", "--task", str(path), "--mc", "0"]) == 2
    err = capsys.readouterr().err
    assert "token id 7" in err and "out of range" in err


def test_unknown_config_is_named(capsys):
    assert main(["verify", "--config", "nope", "--mc", "0"]) == 2
    assert "unknown config 'nope'" in capsys.readouterr().err


_SAMPLERS = {None: None, "temperature": {"kind": "temperature", "temperature": 0.7},
             "perturbed": {"kind": "perturbed", "scale": 0.5, "seed": 1},
             "rounded": {"kind": "rounded", "decimals": 1}}


def _assert_every_identity_holds(data):
    """Load a task-file dict through JSON and require every exact verify row to pass."""
    task = task_from_json(json.loads(json.dumps(data)))
    rows = exact_checks(exact(task, progress=False))
    failed = [(r.identity, r.check, r.value) for r in rows if not r.passed]
    if failed and data["sampler"] is not None:
        # the raw score's mean under mu can be ~0 only when mu equals p (rounding at a
        # precision the logits already have); nothing else may fail
        failed = [f for f in failed if "must be > 0" not in f[1]]
    assert not failed, f"task {data}: {failed}"


_task_dicts = st.fixed_dictionaries({
    "vocab_size": st.integers(2, 4), "context": st.integers(1, 3), "embed_dim": st.integers(1, 3),
    "hidden": st.integers(1, 4), "eos": st.booleans(), "init_seed": st.integers(0, 10 ** 6),
    "init_scale": st.floats(0.1, 3.0), "max_len": st.integers(1, 3),
    "n_prompts": st.integers(1, 3), "baseline": st.one_of(st.just("mean"), st.floats(-2, 2)),
    "reward": st.sampled_from(["count", "length", "match"]),
    "sampler": st.sampled_from([None, "temperature", "perturbed", "rounded"]),
})


@settings(derandomize=True, database=None, deadline=None, max_examples=25,
          suppress_health_check=[HealthCheck.too_slow])
@given(_task_dicts, st.randoms(use_true_random=False))
def test_verify_passes_on_unseen_task_files(d, rnd):
    V = d["vocab_size"]
    prompts = [[rnd.randrange(V) for _ in range(rnd.randrange(3))] for _ in range(d["n_prompts"])]
    w = np.array([rnd.random() + 0.1 for _ in prompts])
    reward = {"count": {"name": "count", "token": V - 1}, "length": {"name": "length"},
              # without EOS a target must have max_len tokens (a shorter one never matches)
              "match": {"name": "match",
                        "target": [V - 1] * (1 if d["eos"] else d["max_len"])}}[d["reward"]]
    sampler = _SAMPLERS[d["sampler"]]
    data = {"model": {k: d[k] for k in ("vocab_size", "context", "embed_dim", "hidden", "eos",
                                        "init_seed", "init_scale")},
            "prompts": prompts, "prompt_weights": (w / w.sum()).tolist(),
            "max_len": d["max_len"], "reward": reward, "baseline": d["baseline"],
            "sampler": sampler}
    _assert_every_identity_holds(data)


def test_topk_without_sampler_is_refused():
    with pytest.raises(ValueError, match="topk centering needs a sampler"):
        exact(load_config("default"), topk=(2,), progress=False)


def test_reward_token_outside_vocabulary_is_refused():
    data = {"model": {"vocab_size": 3}, "prompts": [[1]], "max_len": 2,
            "reward": {"name": "count", "token": 3}}
    with pytest.raises(ValueError, match="token id 3, out of range 0..2"):
        task_from_json(data)
    data["reward"] = {"name": "match", "target": [1, 5]}
    with pytest.raises(ValueError, match="token id 5"):
        task_from_json(data)


def test_match_target_holding_eos_is_refused():
    data = {"model": {"vocab_size": 3, "eos": True}, "prompts": [[1]], "max_len": 2,
            "reward": {"name": "match", "target": [1, 0]}}
    with pytest.raises(ValueError, match="holds the EOS id 0"):
        task_from_json(data)
    data["model"]["eos"] = False  # without EOS, 0 is an ordinary token
    assert task_from_json(data).reward.target == (1, 0)


def test_torch_commands_without_torch_exit_2_with_install_hint(monkeypatch, capsys):
    import builtins
    real_import = builtins.__import__

    def no_torch(name, *args, **kw):
        if name == "torch" or name.startswith("torch."):
            raise ModuleNotFoundError("No module named 'torch'", name="torch")
        return real_import(name, *args, **kw)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert main(["bench", "--config", "default", "--repeats", "1"]) == 2
    assert 'pip install -e ".[torch]"' in capsys.readouterr().err


_gpt2_dicts = st.fixed_dictionaries({
    "vocab_size": st.integers(2, 4), "eos": st.booleans(), "n_layer": st.integers(1, 2),
    "n_head": st.sampled_from([1, 2]), "head_dim": st.integers(1, 3),
    "init_seed": st.integers(0, 10 ** 6), "init_scale": st.floats(0.1, 2.0),
    "max_len": st.integers(1, 3), "n_prompts": st.integers(1, 2),
    "baseline": st.one_of(st.just("mean"), st.floats(-2, 2)),
    "reward": st.sampled_from(["count", "length", "match"]),
    "sampler": st.sampled_from([None, "temperature", "perturbed", "rounded"]),
})


@settings(derandomize=True, database=None, deadline=None, max_examples=15,
          suppress_health_check=[HealthCheck.too_slow])
@given(_gpt2_dicts, st.randoms(use_true_random=False))
def test_verify_passes_on_unseen_gpt2_task_files(d, rnd):
    """Every exact identity of verify holds at 1e-10 on random GPT-2 task files (the
    transformer reads its whole history: no window)."""
    V, T = d["vocab_size"], d["max_len"]
    prompts = [[rnd.randrange(V) for _ in range(rnd.randrange(3))] for _ in range(d["n_prompts"])]
    w = np.array([rnd.random() + 0.1 for _ in prompts])
    target = [rnd.randrange(1 if d["eos"] else 0, V) for _ in range(T if not d["eos"] else 1)]
    reward = {"count": {"name": "count", "token": V - 1}, "length": {"name": "length"},
              "match": {"name": "match", "target": target}}[d["reward"]]
    sampler = _SAMPLERS[d["sampler"]]
    data = {"model": {"arch": "gpt2", "vocab_size": V, "eos": d["eos"],
                      "n_positions": max(len(p) for p in prompts) + T + rnd.randrange(2),
                      "embed_dim": d["n_head"] * d["head_dim"], "n_layer": d["n_layer"],
                      "n_head": d["n_head"], "init_seed": d["init_seed"],
                      "init_scale": d["init_scale"]},
            "prompts": prompts, "prompt_weights": (w / w.sum()).tolist(), "max_len": T,
            "reward": reward, "baseline": d["baseline"], "sampler": sampler}
    _assert_every_identity_holds(data)


def test_gpt2_task_longer_than_n_positions_is_refused(tmp_path, capsys):
    """len(prompt) + max_len > n_positions: refused at load, exit 2 naming the field."""
    data = json.loads((Path(__file__).parents[2] / "fisher_ref" / "configs"
                       / "gpt2_small.json").read_text())
    data["max_len"] = data["model"]["n_positions"] - 1  # the prompt [1, 2] no longer fits
    path = tmp_path / "too_long.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match="n_positions"):
        task_from_json(data)
    assert main(["verify", "--task", str(path), "--mc", "0", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "model.n_positions=8" in err and "max_len" in err


def test_every_exact_check_passes_on_every_case(case):
    """Every hand-made case of tests/cases.py too: extreme and masked logits, a masked
    EOS, a custom architecture, zero-weight prompts."""
    from cases import get_result
    failed = [(r.stream, r.check, r.value) for r in exact_checks(get_result(case))
              if not r.passed]
    assert not failed, f"{case}: {failed}"


PEAKED = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # tanh'


@PEAKED
@pytest.mark.parametrize("name", ["default", "offpolicy_stale", "gpt2_small", "no_eos"])
@pytest.mark.parametrize("scale", [-1.0, 30.0, 1e3])
def test_peaked_models_up_to_the_init_scale_limit_pass(name, scale):
    """init_scale up to MAX_INIT_SCALE (1e3) is accepted, so verify must pass there: the
    softmax is nearly one-hot, sqrt(max F) falls to ~1e-12 while the rounding of a score
    at a rarely reached state stays of the size of j. Zero-mean rows are measured on the
    state-level score scale, and the raw-bias row is info where mu equals p."""
    d = json.loads(json.dumps(load_config(name).spec))
    d["model"]["init_scale"] = scale  # autograd's tanh' = 1/cosh^2 overflows to 0: fine
    rows = exact_checks(exact(task_from_json(d), progress=False))
    failed = [(r.stream, r.check, r.value) for r in rows if not r.passed]
    assert not failed, f"{name} init_scale={scale}: {failed}"


# -- identities 5 and 8: what the rows say ---------------------------------------------

def test_concentration_is_one_for_uniform_and_zero_for_a_point_mass():
    from fisher_ref.checks.identities import concentration
    assert concentration(np.full(5, 0.2)) == pytest.approx(1.0, rel=1e-15)
    assert concentration(np.eye(5)[2]) == 0.0
    p = np.array([[0.5, 0.5, 0.0], [0.7, 0.2, 0.1]])
    assert np.allclose(concentration(p), (1 - (p ** 2).sum(axis=1)) / (1 - 1 / 3), rtol=1e-15)


def test_identity_5_rows_split_the_ratio_into_concentration_and_alignment():
    """The row that enumerates every arrangement of p holds at 1e-10, and fails for a
    closed form without kappa (the ratio to the uniform reference is not alignment alone)."""
    from fisher_ref.checks.identities import _arrangement_mean, concentration
    from fisher_ref.checks.tolerances import rel_err
    from fisher_ref.numerics import uniform_token_fisher
    rows = {r.check: r for r in exact_checks(exact(load_config("default"), progress=False))}
    (mean_row,) = [r for k, r in rows.items() if k.startswith("mean of f over all 120")]
    assert mean_row.identity == "5 concentration x alignment" and mean_row.passed
    share = rows["share of (state, param) with f/f_unif < 1"]
    alpha = rows["share with alignment f/(kappa f_unif) < 1"]
    assert share.kind == alpha.kind == "info" and alpha.value < share.value
    rng = np.random.default_rng(0)
    p, J = rng.dirichlet(np.ones(4) * 0.3), rng.standard_normal((3, 4))
    perms = np.array(list(__import__("itertools").permutations(range(4))))
    mean = _arrangement_mean(p, J, perms)
    assert rel_err(mean, concentration(p) * uniform_token_fisher(J)) <= 1e-12
    assert rel_err(mean, uniform_token_fisher(J)) > 0.1  # without kappa it does not hold


def test_identity_8_rows_report_the_overlap_and_its_two_spreads():
    r = exact(load_config("default"), progress=False)
    rows = [row for row in exact_checks(r) if row.identity.startswith("8 ")]
    assert all(row.kind == "info" and row.identity == "8 overlap (diagnostic)" for row in rows)
    by = {row.check: row.value for row in rows}
    live = (r.bound > 0) & (r.correlation > 0)
    assert by["sd over parameters of log10 cap"] == pytest.approx(
        np.log10(r.bound[live]).std(), rel=1e-12)
    assert by["sd over parameters of log10 |corr|"] == pytest.approx(
        np.log10(r.correlation[live]).std(), rel=1e-12)
    top = int(np.argmax(np.abs(r.gradient)))
    rank = by[f"rank by F of the largest |G| (of P = {r.gradient.size})"]
    assert rank == 1 + np.sum(r.sequence_fisher > r.sequence_fisher[top]) and rank > 119 // 2
