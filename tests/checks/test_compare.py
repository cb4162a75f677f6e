"""The compare harness (fisher_ref.checks.compare); its command line is tested in
tests/cli/test_compare.py."""
import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="compare runs the torch engine (the torch extra)")

import fisher_ref.torch.exact as tex  # noqa: E402
from fisher_ref import load_config  # noqa: E402
from fisher_ref.cli import main  # noqa: E402
from fisher_ref.checks.tolerances import TOL_BFLOAT16, TOL_FLOAT32, TOL_FLOAT64, rel_error
from fisher_ref.checks.compare import (bernstein_threshold, compare, format_table,
                                       highest_matmul_precision)
from fisher_ref.engine.fast import exact  # noqa: E402
from fisher_ref.tasks import task_from_json  # noqa: E402

pytestmark = pytest.mark.torch


def test_bfloat16_rows_within_their_tolerance():
    rows = compare(load_config("default"), device="cpu", dtypes=["bfloat16"], mc=0)
    assert rows and all(r["dtype"] == "bfloat16" for r in rows)
    worst = max(r["max_rel_error"] for r in rows)
    assert worst <= TOL_BFLOAT16, format_table(rows)
    assert worst > TOL_FLOAT32  # bf16 really ran in bf16


def test_model_without_torch_twin_is_refused():
    from fisher_ref.models.function import FunctionModel
    t = load_config("default")
    fn = FunctionModel(t.model.logits, t.model.num_params, 5, 2, name="my_fn")
    with pytest.raises(NotImplementedError, match="arch 'my_fn'"):
        compare(t.with_(model=fn), dtypes=["float64"], mc=0)


def test_bernstein_threshold_reduces_to_clt_scale_without_range():
    # b = 0: t = sqrt(2 var L / n), L = ln(2m/alpha)
    t = bernstein_threshold(4.0, 0.0, 50, alpha=1e-6, m=10)
    assert t == pytest.approx(np.sqrt(2 * 4.0 * np.log(2e7) / 50), rel=1e-12)
    assert bernstein_threshold(4.0, 10.0, 50, alpha=1e-6, m=10) > t


# A tiny off-policy task whose BOS-embedding parameter only moves the root state: its
# per-response token sum is constant, so its exact variance (-3.5e-18 or 0) and range
# (~1e-16) are rounding noise. compare once divided the rounding-sized error by a
# noise-sized Bernstein half-width and failed (statistic ~6e2).
T4 = {"model": {"vocab_size": 5, "context": 2, "embed_dim": 3, "hidden": 8, "eos": True,
                "init_seed": 0, "init_scale": 1.0},
      "prompts": [[1]], "max_len": 3, "reward": {"name": "count", "token": 2}, "baseline": 0.0,
      "sampler": {"kind": "rounded", "decimals": 1}}


def test_constant_token_sum_is_judged_to_rounding_not_failed(tmp_path, capsys):
    from fisher_ref import exact
    from fisher_ref.tasks import task_from_json
    task = task_from_json(T4)
    pol = exact(task, progress=False).streams["policy"]
    ranges = tex.torch_exact(task)["ranges"]["token_fisher_sum"]  # (P,)
    exact_v = pol.token_fisher_sum
    scale = np.max(np.abs(exact_v) + ranges)
    const = (ranges <= 1e-12 * scale) & (exact_v != 0)  # constant, non-zero token sums
    assert const.any() and np.all(np.abs(pol.variances["token_sum"][const]) <= 1e-12 * scale ** 2)
    (tmp_path / "t4.json").write_text(json.dumps(T4))
    path = tmp_path / "cmp.json"
    seed = 0
    rc = main(["compare", "--task", str(tmp_path / "t4.json"), "--device", "cpu",
               "--dtype", "float64", "--mc", "4000", "--seed", str(seed), "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, f"seed={seed}\n{out}"
    mc = {r["quantity"].split(" ")[0]: r for r in json.loads(path.read_text())["rows"]
          if r["test"] == "bern"}
    assert set(mc) == {"mc.sequence_fisher", "mc.token_fisher_sum"}
    for r in mc.values():
        assert np.isfinite(r["statistic"]) and r["statistic"] <= 1.0, (seed, r)
        assert np.isfinite(r["max_abs_z"]), (seed, r)


T2 = {"model": {"vocab_size": 5, "context": 2, "embed_dim": 3, "hidden": 8, "eos": True,
                "init_seed": 0, "init_scale": 1.0},
      "prompts": [[], [4, 1]], "prompt_weights": [0.3, 0.7], "max_len": 3,
      "reward": {"name": "match", "target": [3, 1]}, "baseline": 0.25,
      "sampler": {"kind": "perturbed", "scale": 1.0, "seed": 0}}


def test_gradient_under_a_large_baseline_is_judged_on_its_summands_scale(tmp_path, capsys):
    """Under mu, E_mu[A h~] with b = 0.25 cancels b E[h~] against E[R h~]: its summands
    are ~1000x larger than G_mu. Judged against max|G_mu| a correct float32 run read
    2.6e-4 > 2e-5 and failed; against the summands' scale (sqrt(E[R^2]) + |b|)
    sqrt(max F) it passes (test_perturbed_torch_value_makes_run_fail shows a wrong value
    still fails)."""
    from fisher_ref import exact
    from fisher_ref.tasks import task_from_json
    from fisher_ref.checks.tolerances import gradient_scale
    cen = exact(task_from_json(T2), progress=False).streams["centered"]
    assert gradient_scale(cen) > 100 * np.max(np.abs(cen.gradient))  # really a cancellation
    (tmp_path / "t2.json").write_text(json.dumps(T2))
    path = tmp_path / "cmp.json"
    rc = main(["compare", "--task", str(tmp_path / "t2.json"), "--device", "cpu",
               "--dtype", "float64,float32", "--mc", "2000", "--json", str(path)])
    out = capsys.readouterr().out
    assert rc == 0, out
    rows = {(r["quantity"], r["dtype"]): r for r in json.loads(path.read_text())["rows"]}
    for q in ("gradient", "importance_gradient", "centered.gradient", "gradient_autodiff"):
        assert rows[(q, "float32")]["passed"] and rows[(q, "float64")]["passed"]


def test_bernstein_threshold_is_the_shared_mc_stats_halfwidth():
    from fisher_ref.monte_carlo.ztests import bernstein_halfwidth
    var, b = np.array([0.0, 1e-3, 4.0]), np.array([1e-16, 0.5, 3.0])
    np.testing.assert_array_equal(bernstein_threshold(var, b, 300, alpha=1e-6, m=7),
                                  bernstein_halfwidth(300, var, b, 1e-6 / 7))


def test_matmul_precision_is_highest_inside_and_restored():
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    try:
        with highest_matmul_precision():
            assert torch.get_float32_matmul_precision() == "highest"
            assert torch.backends.cuda.matmul.allow_tf32 is False
        assert torch.get_float32_matmul_precision() == "high"
    finally:
        torch.set_float32_matmul_precision(before)


def test_gpu_script_is_valid_bash():
    import pathlib
    import subprocess
    script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "gpu" / "gpu_compare.sh"
    res = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    assert "--device cuda --dtype float64,float32,bfloat16" in script.read_text()


@pytest.mark.parametrize("config", ["gpt2_small", "gpt2_offpolicy"])
def test_gpt2_configs_pass_every_row(config):
    rows = compare(load_config(config), device="cpu", dtypes=["float64", "float32"], mc=1500)
    failed = [r for r in rows if not r["passed"]]
    assert not failed, format_table(failed)
    f64 = [r for r in rows if r["dtype"] == "float64" and r["test"] == "rel"]
    assert len(f64) >= 19 and max(r["max_rel_error"] for r in f64) <= TOL_FLOAT64


def _peaked(config):
    spec = json.loads((Path(__file__).resolve().parents[2] / "fisher_ref" / "configs" /
                       f"{config}.json").read_text())
    spec["model"]["init_scale"] = 3.0
    return task_from_json(spec, name=f"{config}_peaked")


@pytest.mark.parametrize("config", ["offpolicy_stale", "no_eos"])
def test_float32_passes_on_peaked_models(config):
    """init_scale 3: probabilities near 0 and 1, bounds spanning decades. The correlation
    |Cov|/bound, judged by error propagation from its parts, passes in float32; judged
    flatly against its largest entry (the old rule) it did not."""
    task = _peaked(config)
    rows = compare(task, device="cpu", dtypes=["float64", "float32"], mc=0)
    failed = [r for r in rows if not r["passed"]]
    assert not failed, format_table(failed)
    out = tex.torch_exact(task, dtype="float32")
    ref = exact(task, progress=False)
    flat = max(rel_error(out["streams"][s]["correlation"], ref.streams[s].correlation)[1]
               for s in out["streams"])
    assert flat > TOL_FLOAT32  # really ill-conditioned: the flat rule fails


def test_propagated_rule_still_catches_a_wrong_correlation(monkeypatch):
    """A 1e-4 relative error in the correlation of the parameter with the largest bound
    (where the ratio is well conditioned) fails the float32 row."""
    task = _peaked("offpolicy_stale")
    real = tex.torch_exact

    def skewed(task, device="cpu", dtype="float64", **kwargs):
        out = real(task, device, dtype, **kwargs)
        pol = out["streams"]["policy"]
        pol["correlation"][np.argmax(pol["bound"])] *= 1 + 1e-4
        return out

    monkeypatch.setattr(tex, "torch_exact", skewed)
    rows = compare(task, device="cpu", dtypes=["float32"], mc=0)
    assert [r["quantity"] for r in rows if not r["passed"]] == ["correlation"]


def test_user_module_task_passes_in_float64_and_float32():
    """compare covers the generic adapter: a torch module of the user's, on the numpy
    engine (through torch autograd) and on the torch engine (through vmap(jacrev))."""
    from fisher_ref.torch.module_model import causal_lm_task

    class Conv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(4, 3)
            self.conv = torch.nn.Conv1d(3, 4, kernel_size=2, padding=1)
            self.head = torch.nn.Linear(4, 3)

        def forward(self, ids):  # (b, n) -> (b, n+1, 3); the adapter takes the last row
            return self.head(torch.tanh(self.conv(self.emb(ids).transpose(1, 2))).transpose(1, 2)[:, :-1])

    torch.manual_seed(1)
    task = causal_lm_task(Conv().double(), [[1], [2, 1]], 3, lambda p, r: float(len(r)),
                          vocab_size=3, eos=True, bos=3, baseline="mean")
    rows = compare(task, device="cpu", dtypes=["float64", "float32"], mc=1500)
    failed = [r for r in rows if not r["passed"]]
    assert not failed, format_table(failed)


def test_compare_refuses_a_fisher_only_reference(monkeypatch):
    """A reference from exact(quantities="fisher") lacks what compare checks: refused
    before the torch engine runs."""
    task = load_config("default")
    ref = exact(task, progress=False, quantities="fisher")
    monkeypatch.setattr(tex, "torch_exact", lambda *a, **k: pytest.fail("torch ran first"))
    with pytest.raises(ValueError, match="compare needs every exact quantity"):
        compare(task, ref=ref)
