"""Tasks: shipped configs, JSON round trip, and bad input that names the problem."""
import json

import numpy as np
import pytest

from fisher_ref import Task, exact, list_configs, load_config, load_task, task_from_json
from fisher_ref.rewards import CountReward

BASE = {"model": {"vocab_size": 4, "context": 2, "embed_dim": 2, "hidden": 3},
        "prompts": [[1], [2, 3]], "max_len": 2}


def _with(**kw):
    d = json.loads(json.dumps(BASE))
    d.update(kw)
    return d


def test_list_configs_names_every_shipped_config():
    assert set(list_configs()) >= {"default", "no_eos", "offpolicy_stale",
                                   "offpolicy_temperature", "tabular", "weighted_prompts"}


@pytest.mark.parametrize("name", list_configs())
def test_config_round_trips_through_json(name):
    task = load_config(name)
    d = task.to_json()
    again = task_from_json(json.loads(json.dumps(d)))
    assert np.array_equal(again.theta, task.theta)
    assert again.prompts == task.prompts and again.max_len == task.max_len
    assert np.allclose(again.prompt_weights, task.prompt_weights, rtol=0, atol=0)
    assert again.to_json() == d


def test_defaults_uniform_weights_count_reward_zero_baseline():
    t = task_from_json(BASE)
    assert t.prompt_weights.tolist() == [0.5, 0.5]
    assert isinstance(t.reward, CountReward) and t.reward.token == 1
    assert t.baseline == 0.0 and t.sampler is None and t.on_policy


def test_theta_key_fixes_parameters():
    t = task_from_json(BASE)
    t2 = task_from_json(_with(theta=(2 * t.theta).tolist()))
    assert np.array_equal(t2.theta, 2 * t.theta)


def test_with_replaces_and_validates():
    t = load_config("default")
    assert t.with_(baseline="mean").baseline == "mean"
    with pytest.raises(ValueError, match="max_len must be >= 1"):
        t.with_(max_len=0)


@pytest.mark.parametrize("change, words", [
    (dict(theta=[0.0] * 3), "theta has length 3 but the model has"),
    (dict(theta="nan"), "non-finite"),
    (dict(prompts=[[1, 7]]), "token id 7, out of range 0..3"),
    (dict(prompts=[[4]]), "id 4 is BOS"),
    (dict(prompts=[[1.5]]), "non-integer token"),
    (dict(prompts=[]), "at least one prompt"),
    (dict(prompts="12"), "prompts must be a list"),
    (dict(prompt_weights=[1.5, -0.5]), "must be non-negative"),
    (dict(prompt_weights=[0.5, 0.6]), "must sum to 1, they sum to 1.1"),
    (dict(prompt_weights=[1.0]), "has 1 entries for 2 prompts"),
    (dict(prompt_weights=[np.nan, 1.0]), "must be finite"),
    (dict(max_len=0), "max_len must be >= 1"),
    (dict(max_len=2.0), "max_len must be an integer"),
    (dict(max_len=True), "max_len must be an integer"),
    (dict(baseline="median"), "baseline must be a number or 'mean'"),
    (dict(baseline=float("inf")), "baseline must be finite"),
    (dict(reward={"name": "bleu"}), "unknown reward 'bleu'"),
    (dict(reward={"name": "count", "tok": 1}), "bad arguments for reward 'count'"),
    (dict(reward={"token": 1}), "must be a dict with a 'name'"),
    (dict(sampler={"kind": "beam"}), "unknown sampler kind 'beam'"),
    (dict(sampler={"kind": "temperature", "t": 1}), "bad arguments for sampler 'temperature'"),
    (dict(sampler={"kind": "temperature", "temperature": 0}), "positive finite"),
    (dict(colour="red"), "unknown task keys \\['colour'\\]"),
], ids=lambda v: None if isinstance(v, dict) else v[:40])
def test_bad_task_json_names_the_problem(change, words):
    data = _with(**change)
    if change.get("theta") == "nan":
        data["theta"] = [float("nan")] + [0.0] * (task_from_json(BASE).model.num_params - 1)
    with pytest.raises(ValueError, match=words):
        task_from_json(data)


@pytest.mark.parametrize("missing", ["model", "prompts", "max_len"])
def test_missing_required_key(missing):
    data = _with()
    del data[missing]
    with pytest.raises(ValueError, match=f"missing the required key '{missing}'"):
        task_from_json(data)


def test_task_must_be_an_object():
    with pytest.raises(ValueError, match="must be a JSON object"):
        task_from_json([1, 2])


def test_unknown_config():
    with pytest.raises(ValueError, match="unknown config 'nope'; shipped configs: default"):
        load_config("nope")


def test_load_task_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(BASE))
    t = load_task(path)
    assert t.name == "mine" and exact(t, progress=False).n_responses > 0
    with pytest.raises(FileNotFoundError, match="task file not found: .*absent.json"):
        load_task(tmp_path / "absent.json")
    bad = tmp_path / "bad.json"
    bad.write_text("{\"model\": ")
    with pytest.raises(ValueError, match="bad.json.? is not valid JSON"):
        load_task(bad)


def test_task_rejects_a_non_sampler():
    t = load_config("default")
    with pytest.raises(TypeError, match="sampler must be a fisher_ref.samplers.Sampler"):
        Task(model=t.model, theta=t.theta, prompts=t.prompts, prompt_weights=t.prompt_weights,
             max_len=2, reward=t.reward, sampler="temperature")


def test_old_policy_round_trips_through_json():
    from fisher_ref import task_from_json
    spec = load_config("tabular").to_json()
    for old in ("sampler", {"kind": "perturbed", "scale": 0.5, "seed": 4}):
        t = task_from_json({**spec, "old_policy": old})
        assert t.to_json()["old_policy"] == old
        assert task_from_json(t.to_json()).to_json() == t.to_json()
    assert "old_policy" not in load_config("tabular").to_json()
    with pytest.raises(ValueError, match="old_policy"):
        task_from_json({**spec, "old_policy": "theta"})


@pytest.mark.parametrize("weights, got", [
    ({"a": 1.0}, "got the dict"), (1.0, "got the float 1.0"), (1, "got the int 1"),
    ([[1.0]], r"got a nested list of shape \(1, 1\)"),
    ([[0.5], [0.5]], r"got a nested list of shape \(2, 1\)"),
], ids=["dict", "float", "int", "nested", "nested_column"])
def test_prompt_weights_of_the_wrong_kind_say_what_they_are_and_what_is_expected(weights, got):
    """issue 46 item 5: a dict, a scalar or a nested list was refused with "prompt_weights
    has 1 entries for 1 prompts", which contradicts itself."""
    data = {**_with(), "prompts": [[1, 2]] if not isinstance(weights, list) or
            len(weights) == 1 else [[1, 2], [3]], "prompt_weights": weights}
    with pytest.raises(ValueError, match=r"prompt_weights must be a flat list of numbers, one "
                       r"per prompt \(\d prompts?\), " + got) as info:
        task_from_json(data)
    assert "entries for" not in str(info.value)
