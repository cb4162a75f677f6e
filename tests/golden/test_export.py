"""Golden files, the export side: every shipped file is held against an implementation
written from the documents alone, rebuilds from its own meta, regenerates byte for byte,
and its matrices satisfy the matrix form of the token decomposition."""
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fisher_ref import load_config, task_from_json
from fisher_ref.golden.export import (GOLDEN_CASES, GOLDEN_TASKS, NO_MATRICES, export_golden,
                               golden_arrays, golden_task, regenerate_golden_files,
                               size_table_row)
from fisher_ref.golden.format import (MATRIX_MAX_PARAMS, SCHEMA_VERSION, expected_keys,
                                      load_golden)
from fisher_ref.golden.check import (GOLDEN_DIR, compare_golden, compare_to_golden, file_scales,
                                golden_cases, golden_names, golden_path)

import independent_reference as indep

RTOL = 1e-10  # exact float64 agreement (docs/theory.md §9.3)
# The engine that wrote the committed files and the one running now may group sums
# differently (another version, another BLAS kernel): arrays then differ in the last
# bits (~1e-16 relative seen), never beyond this, on the documented scales.
REGENERATION_RTOL = 1e-12
MAX_TOTAL_BYTES = 20 * 10 ** 6  # every shipped golden file together
ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "golden_format.md"
README = GOLDEN_DIR / "README.md"
TASK_FILE_MODEL_KEYS = {"vocab_size", "eos", "init_seed", "init_scale"}


def strip_hashes(meta):
    return {k: v for k, v in meta.items() if k not in ("sha256", "meta_sha256", "generator")}


@pytest.mark.parametrize("golden", golden_cases())
def test_golden_files_match_independent_reference(golden):
    ref = indep.reference(golden.meta, golden["theta"])
    assert set(ref) == set(golden.keys())
    result = compare_to_golden(ref, golden, rtol=RTOL)
    worst = max(result.results, key=lambda r: r.rel)
    print(f"{golden.name}: largest error {worst.rel:.2e} ({worst.key})")
    assert result.passed, str(result)


@pytest.mark.parametrize("golden", golden_cases(arch="gpt2"))
def test_gpt2_files_match_transformers(golden):
    """A third route for GPT-2: Hugging Face's GPT2LMHeadModel built from the meta and
    theta alone (not fisher_ref.hf), its logits and torch-autograd token Fisher."""
    torch = pytest.importorskip("torch", reason="the hf extra (torch, transformers) is needed")
    transformers = pytest.importorskip("transformers", reason="the hf extra is needed")
    m = golden.meta["model"]
    config = transformers.GPT2Config(
        vocab_size=m["vocab_size"] + 1, n_positions=m["n_positions"], n_embd=m["embed_dim"],
        n_layer=m["n_layer"], n_head=m["n_head"], activation_function="gelu_new",
        layer_norm_epsilon=1e-5, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        tie_word_embeddings=True, attn_implementation="eager")
    hf = transformers.GPT2LMHeadModel(config).to(torch.float64).eval()
    params = dict(hf.named_parameters())
    assert [b["name"] for b in golden.meta["layout"]] == list(params)
    with torch.no_grad():
        for b in golden.meta["layout"]:
            size = int(np.prod(b["shape"]))
            block = golden["theta"][b["offset"]:b["offset"] + size].reshape(b["shape"])
            params[b["name"]].copy_(torch.from_numpy(block))
    names, V = list(params), m["vocab_size"]
    logits, fisher = [], []
    for row in golden["state_tokens"]:
        ids = torch.tensor([[V] + row[row >= 0].tolist()])

        def z_of(*flat):
            out = torch.func.functional_call(hf, dict(zip(names, flat)), (ids,))
            return out.logits[0, -1, :V]
        flat = tuple(p.detach() for p in params.values())
        jac = torch.autograd.functional.jacobian(z_of, flat)  # V x each block
        J = torch.cat([j.reshape(V, -1) for j in jac], dim=1).T.numpy()  # (P, V)
        z = z_of(*flat).detach().numpy()
        p = np.exp(z - z.max())
        p /= p.sum()
        c = J - J @ p[:, None]
        logits.append(z)
        fisher.append((c * c) @ p)
    result = compare_to_golden({"state_logits": np.array(logits),
                                "state_token_fisher": np.array(fisher)}, golden)
    assert result.passed, str(result)


@pytest.mark.parametrize("golden", golden_cases())
def test_theta_is_the_documented_initialisation_or_the_task_file_theta(golden):
    m, theta = golden.meta["model"], golden["theta"]
    if golden.meta["theta_source"] == "init":
        np.testing.assert_array_equal(theta, indep.init_theta(m, theta.size))
    else:
        assert golden.name in GOLDEN_TASKS
        task_file = json.loads((GOLDEN_DIR / "tasks" / f"{golden.name}.json").read_text())
        np.testing.assert_array_equal(theta, np.array(task_file["theta"]))
        assert not np.array_equal(theta, indep.init_theta(m, theta.size))


@pytest.mark.parametrize("name", GOLDEN_CASES)
def test_committed_file_rebuilds_from_its_meta(name):
    """The meta (task) and theta alone give the same arrays, at the regeneration
    tolerance: what `python -m fisher_ref regenerate` would write."""
    committed = load_golden(golden_path(name))
    task = golden_task(name)
    assert task.to_json() == committed.meta["task"]
    data = dict(committed.meta["task"], theta=committed["theta"].tolist())
    arrays = golden_arrays(task_from_json(data, name=name),
                           matrices=committed.meta["matrices"])
    assert set(arrays) == set(committed.keys())
    result = compare_golden(committed, arrays, rtol=REGENERATION_RTOL)
    assert result.passed, (
        f"{name} regenerates to different arrays:\n{result}\nIf the change is intended, run "
        "`python -m fisher_ref regenerate` (and bump SCHEMA_VERSION if keys or "
        "meanings changed).")


def test_regeneration_is_byte_for_byte_reproducible(tmp_path):
    """The generator is deterministic: no timestamps, fixed key order, fixed JSON."""
    names = ("tabular", "t5_rounded", "zero_prob_mlp")
    first = regenerate_golden_files(tmp_path / "a", names)
    second = regenerate_golden_files(tmp_path / "b", names)
    for p, q in zip(first, second):
        assert p.read_bytes() == q.read_bytes(), f"{p.name} differs between two regenerations"
        committed = load_golden(golden_path(p.stem))
        assert strip_hashes(load_golden(p).meta) == strip_hashes(committed.meta)


def test_shipped_files_are_the_golden_cases_and_small():
    assert golden_names() == sorted(GOLDEN_CASES)
    total = sum(golden_path(n).stat().st_size for n in GOLDEN_CASES)
    assert total < MAX_TOTAL_BYTES, total


def documented_kib(text, name):
    row = next(line for line in text.splitlines() if line.startswith(f"| `{name}.npz` |"))
    return float(row.rstrip(" |").rsplit("|", 1)[1].replace(",", "").split()[0])


def test_readme_table_lists_every_file_with_its_size():
    text = README.read_text()
    total = 0
    for name in GOLDEN_CASES:
        size = golden_path(name).stat().st_size
        total += size
        row = size_table_row(golden_path(name))
        assert row.rsplit("|", 2)[0] in text, row  # every column but the size, exactly
        assert abs(documented_kib(text, name) - size / 1024) <= 1, (name, size)
    assert f"{total / 1e6:.1f} MB" in text


def test_matrices_follow_the_parameter_limit():
    for g in (p.values[0] for p in golden_cases()):
        want = g.sizes["P"] <= MATRIX_MAX_PARAMS and g.name not in NO_MATRICES
        assert g.meta["matrices"] == want, g.name
        assert ("sequence_fisher_matrix" in g) == want


@pytest.mark.parametrize("golden", golden_cases())
def test_matrix_forms_agree_with_the_diagonal_arrays(golden):
    """diag E[h h^T] = F, diag of the token sum = sum_s pi f, E[h] and E[A h] from
    seq_score, and p = softmax(state_logits): the new arrays against the engine's."""
    S, Rs = file_scales(golden.arrays)
    h, w, A = golden["seq_score"], golden["seq_prob"], golden["seq_advantage"]
    z = golden["state_logits"]
    p = np.exp(z - z.max(axis=1, keepdims=True))
    mine = {"sequence_fisher": w @ h ** 2, "score_mean": w @ h,
            "gradient": w @ (A[:, None] * h), "state_probs": p / p.sum(axis=1, keepdims=True)}
    if golden.meta["matrices"]:
        mine["sequence_fisher"] = np.diag(golden["sequence_fisher_matrix"])
        mine["token_fisher_sum"] = np.diag(golden["token_fisher_matrix_sum"])
    result = compare_to_golden(mine, golden, rtol=RTOL)
    assert result.passed, str(result)


@pytest.mark.parametrize("golden", golden_cases())
def test_sequence_fisher_matrix_is_token_sum(golden):
    """E[h h^T] = sum_s pi(s) Cov_p(j) (docs/theory.md §2.10) at 1e-10 of max F."""
    if not golden.meta["matrices"]:
        assert golden.name in NO_MATRICES
        return
    result = compare_to_golden({"sequence_fisher_matrix": golden["token_fisher_matrix_sum"]},
                               golden, rtol=RTOL)
    assert result.passed, str(result)
    A = golden["sequence_fisher_matrix"]  # symmetric up to rounding
    assert np.max(np.abs(A - A.T)) <= RTOL * np.max(np.diag(A))


@settings(max_examples=8, derandomize=True, database=None, deadline=None)
@given(V=st.integers(2, 5), T=st.integers(1, 3), eos=st.booleans(), seed=st.integers(0, 99),
       scale=st.floats(0.3, 3.0), empty=st.booleans())
def test_matrix_identity_on_random_tasks(V, T, eos, seed, scale, empty):
    task = task_from_json({"model": {"vocab_size": V, "context": 2, "embed_dim": 2, "hidden": 3,
                                     "eos": eos, "init_seed": seed, "init_scale": scale},
                           "prompts": [[]] if empty else [[V - 1], [0, 1 % V]],
                           "max_len": T, "reward": {"name": "count", "token": V - 1}})
    a = golden_arrays(task)
    F = a["sequence_fisher"].max()
    assert np.max(np.abs(a["sequence_fisher_matrix"] - a["token_fisher_matrix_sum"])) <= RTOL * F
    assert np.max(np.abs(np.diag(a["sequence_fisher_matrix"]) - a["sequence_fisher"])) <= RTOL * F


def test_meta_holds_schema_model_task_layout():
    for g in (p.values[0] for p in golden_cases()):
        meta = g.meta
        assert meta["schema"] == "fisher_ref.golden"
        assert meta["schema_version"] == SCHEMA_VERSION and isinstance(meta["schema_version"], int)
        assert meta["generator"].startswith("fisher_ref ")
        assert TASK_FILE_MODEL_KEYS | {"arch", "bos"} <= set(meta["model"])
        assert meta["model"]["bos"] == meta["model"]["vocab_size"]
        assert {"prompts", "prompt_weights", "max_len", "reward", "baseline", "sampler"} <= set(
            meta["task"])
        off = 0
        for block in meta["layout"]:
            assert block["offset"] == off
            off += int(np.prod(block["shape"]))
        assert off == g["theta"].size == meta["sizes"]["P"]
        assert set(g.keys()) == set(expected_keys(meta["offpolicy"], meta["matrices"]))


def test_the_cases_cover_what_the_format_promises():
    metas = [p.values[0].meta for p in golden_cases()]
    tasks = [m["task"] for m in metas]
    assert {t["reward"]["name"] for t in tasks} == {"count", "match", "length"}
    assert any(t["reward"] == {"name": "count", "token": 0} and t["model"]["eos"] for t in tasks)
    assert {(t["sampler"] or {}).get("kind") for t in tasks} == {None, "temperature",
                                                                 "perturbed", "rounded"}
    assert {m["model"]["arch"] for m in metas} == {"mlp_window", "tabular", "gpt2"}
    assert max(m["sizes"]["V"] for m in metas) >= 12 and max(m["sizes"]["T"] for m in metas) >= 5
    assert any(m["model"]["init_scale"] >= 3 for m in metas)
    assert any([] in t["prompts"] for t in tasks)
    assert any(len(set(t["prompt_weights"])) > 1 for t in tasks)
    assert any(t["baseline"] == "mean" for t in tasks)
    zero = [p.values[0] for p in golden_cases()
            if np.any((p.values[0]["state_probs"] == 0) & (p.values[0]["state_reach"] > 0)[:, None])]
    assert {g.name for g in zero} >= {"zero_prob_tabular", "zero_prob_mlp"}


def test_custom_reward_is_recorded_and_loads(tmp_path):
    def longer_is_better(prompt, response):
        return 0.5 * len(response)
    task = load_config("default").with_(reward=longer_is_better)
    g = load_golden(export_golden(task, tmp_path / "custom.npz"))
    assert g.meta["task"]["reward"] == {"name": "custom", "function": "longer_is_better"}
    np.testing.assert_allclose(g["seq_reward"], 0.5 * (g["seq_tokens"] >= 0).sum(axis=1))


def test_failed_export_leaves_no_partial_file(tmp_path, monkeypatch):
    import fisher_ref.golden.export as golden_module

    def broken(*args, **kwargs):
        raise RuntimeError("the engine stopped half way")
    out = tmp_path / "X.npz"
    monkeypatch.setattr(golden_module, "score_pass", broken)
    with pytest.raises(RuntimeError):
        export_golden(load_config("tabular"), out)
    assert list(tmp_path.iterdir()) == []


def test_too_large_an_export_is_refused_before_it_runs(monkeypatch):
    import fisher_ref.golden.export as golden_module
    monkeypatch.setattr(golden_module, "MAX_EXPORT_BYTES", 10_000)
    with pytest.raises(ValueError, match=r"would hold about .* GiB \(42 states, 170 responses"):
        golden_arrays(load_config("default"))


def test_matrices_argument_is_checked():
    big = task_from_json({"model": {"vocab_size": 30, "context": 2, "embed_dim": 8,
                                    "hidden": 60, "eos": True},
                          "prompts": [[1]], "max_len": 1})
    assert big.model.num_params > MATRIX_MAX_PARAMS
    with pytest.raises(ValueError, match=f"needs P <= {MATRIX_MAX_PARAMS}"):
        golden_arrays(big, matrices=True)
    with pytest.raises(ValueError, match="matrices must be 'auto', True or False"):
        golden_arrays(load_config("tabular"), matrices="yes")
    a = golden_arrays(big)
    assert "sequence_fisher_matrix" not in a and a["seq_score"].shape == (30, big.model.num_params)


def test_doctests():
    import doctest
    import fisher_ref.golden.export
    assert doctest.testmod(fisher_ref.golden).failed == 0
