"""The torch peer (``scripts/torch_peer.py``, the benchmark baseline) against fisher_ref.

The peer shares no code with fisher_ref (its own parameters, windows, MLP and
walk, scores by ``torch.func``); it must give the sequence Fisher, the score mean
and the token Fisher of every state at 1e-10 on shipped configs and on random
task files.
"""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from cases import RTOL, rel
from fisher_ref import exact, task_from_json
from fisher_ref.engine.plan import Budgets
from fisher_ref.engine.keep_memory import memory_kept

torch = pytest.importorskip("torch", reason="the torch peer needs torch (CI installs it)")

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("torch_peer", ROOT / "scripts" / "torch_peer.py")
torch_peer = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(torch_peer)


def _config(name):
    return json.loads((ROOT / "fisher_ref" / "configs" / f"{name}.json").read_text())


def _states_by_key(prompt, depth, tokens, values):
    """``values`` rows keyed by (prompt, depth, generated tokens), in key order."""
    keys = [(int(p), int(d), tuple(int(t) for t in tok))
            for p, d, tok in zip(prompt, depth, tokens)]
    order = sorted(range(len(keys)), key=keys.__getitem__)
    return [keys[i] for i in order], values[order]


def assert_peer_matches(spec, expand=True):
    peer = torch_peer.peer_exact(spec, expand=expand)
    r = exact(task_from_json(spec), progress=False)
    F = r.sequence_fisher
    assert rel(peer["fisher"], F) <= RTOL
    assert rel(peer["score_mean"], r.score_mean, np.sqrt(F.max())) <= RTOL
    st_ = r.states
    plen = np.array([len(p) for p in spec["prompts"]])[st_["prompt"]]
    gen = [row[n:n + d] for row, n, d in zip(st_["tokens"].tolist(), plen, st_["depth"])]
    k_ref, f_ref = _states_by_key(st_["prompt"], st_["depth"], gen, st_["token_fisher"])
    k_peer, f_peer = _states_by_key(peer["prompt"], peer["depth"], peer["tokens"],
                                    peer["token_fisher"])
    assert k_peer == k_ref
    assert rel(f_peer, f_ref) <= RTOL


@pytest.mark.parametrize("expand", [True, False])
@pytest.mark.parametrize("name", ["default", "no_eos", "weighted_prompts"])
def test_peer_matches_fisher_ref_on_configs(name, expand):
    """Both of the peer's ways to sum the last level: expanded per parent, and each
    response's h formed."""
    assert_peer_matches(_config(name), expand)


def test_peer_matches_fisher_ref_on_medium_cut_to_two_tokens():
    spec = json.loads((ROOT / "fisher_ref/configs/scale/medium.json").read_text())
    spec["max_len"] = 2
    assert_peer_matches(spec)


def test_peer_reads_theta_from_the_task():
    spec = _config("default")
    spec["theta"] = (0.5 * torch_peer.peer_theta(spec["model"])).tolist()
    assert_peer_matches(spec)


def test_peer_looks_windows_up_by_tuple_when_the_key_table_would_be_large(monkeypatch):
    monkeypatch.setattr(torch_peer, "DENSE_KEYS", 0)
    assert_peer_matches(_config("weighted_prompts"))


def test_bench_like_for_like_side_gives_the_peer_output():
    """bench's ``fisher_ref_fisher`` side stands in for the peer: on an off-policy config
    (the peer reads no sampler) it returns the same per-state token Fisher as the peer,
    and exact(quantities="fisher") of that task the same F."""
    from fisher_ref.perf.bench import MEASUREMENTS
    from fisher_ref.results import FisherStreamResult
    spec = _config("offpolicy_stale")
    task = task_from_json(spec)
    assert task.sampler is not None
    f_ours = MEASUREMENTS["fisher_ref_fisher"](task)()
    peer = torch_peer.peer_exact(spec)
    r = exact(task.with_(sampler=None), progress=False, quantities="fisher")
    assert isinstance(r.streams["policy"], FisherStreamResult) and list(r.streams) == ["policy"]
    assert rel(peer["fisher"], r.sequence_fisher) <= RTOL
    st_ = r.states
    plen = np.array([len(p) for p in spec["prompts"]])[st_["prompt"]]
    gen = [row[n:n + d] for row, n, d in zip(st_["tokens"].tolist(), plen, st_["depth"])]
    k_ref, f_ref = _states_by_key(st_["prompt"], st_["depth"], gen, f_ours)
    k_peer, f_peer = _states_by_key(peer["prompt"], peer["depth"], peer["tokens"],
                                    peer["token_fisher"])
    assert k_peer == k_ref and rel(f_peer, f_ref) <= RTOL


def test_peer_refuses_other_architectures():
    with pytest.raises(ValueError, match="mlp_window model only"):
        torch_peer.peer_exact(_config("gpt2_small"))


@settings(derandomize=True, database=None, deadline=None, max_examples=20)
@given(st.integers(2, 5), st.booleans(), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 4), st.integers(0, 10 ** 6), st.floats(0.2, 2.5), st.integers(1, 3),
       st.lists(st.lists(st.integers(0, 4), max_size=3), min_size=1, max_size=3))
def test_peer_matches_fisher_ref_on_random_task_files(V, eos, k, d, H, seed, scale, T, prompts):
    prompts = [[t % V for t in p] for p in prompts]
    spec = {"model": {"vocab_size": V, "context": k, "embed_dim": d, "hidden": H, "eos": eos,
                      "init_seed": seed, "init_scale": scale},
            "prompts": prompts, "max_len": T if V <= 4 else min(T, 2),
            "reward": {"name": "count", "token": 0}}
    assert_peer_matches(spec)
    assert_peer_matches(spec, expand=False)


def test_timing_script_writes_a_record_and_refuses_to_overwrite_it(tmp_path, capsys):
    """``torch_peer.py --json`` writes what the speed page quotes: timings per side, ratios,
    the commit and the memory condition. Wall times are not asserted."""
    path = tmp_path / "peer.json"
    assert torch_peer.main(["--tasks", "medium", "--repeats", "1", "--json", str(path)]) is None
    rec = json.loads(path.read_text())
    t = rec["tasks"]["medium"]
    assert rec["repeats"] == 1 and rec["memory_kept"] is False and rec["commit"]
    # the last level's budget, the engine's own for this process's memory
    assert rec["sub_elements_given"] is None and rec["sub_elements"] == \
        Budgets().sub_block_elements(factored=True, kept=memory_kept())
    assert t["num_params"] == 1044 and set(t["median"]) == {"exact", "exact fisher", "peer",
                                                            "peer per h"}
    assert t["ratio"]["exact / peer"] == t["median"]["exact"] / t["median"]["peer"]
    assert all(len(v) == 1 for v in t["wall"].values())
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        torch_peer.main(["--tasks", "medium", "--json", str(path)])
    assert exc.value.code == 2 and "not overwritten" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        torch_peer.main(["--repeats", "0"])
    with pytest.raises(SystemExit) as exc:
        torch_peer.main(["--json", str(tmp_path / "no such dir" / "peer.json")])
    assert exc.value.code == 2 and "the directory does not exist" in capsys.readouterr().err


def test_timing_script_records_a_budget_of_ones_own(tmp_path, capsys):
    path = tmp_path / "peer.json"
    assert torch_peer.main(["--tasks", "medium", "--repeats", "1", "--sub-elements", "4096",
                            "--json", str(path)]) is None
    rec = json.loads(path.read_text())
    assert rec["sub_elements"] == 4096 and rec["sub_elements_given"] == 4096
    assert "sub-block budget at the last level: 4,096 elements" in capsys.readouterr().out
