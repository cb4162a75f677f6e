"""Bad input, as a new user would give it, through the command line and the API.

Every case must end in a clear error: exit code 2 (the command line) or a documented
exception type (the API), with a message that names the field, option or path, and
no file left behind. Sizes are refused in closed form before anything is allocated;
those tests only ask that the call *returns* (under a generous deadline, never a
timing claim) and that the numbers in the message are readable.
"""
import contextlib
import errno
import io
import json
import math
import os
import re
import signal

import numpy as np
import pytest


from fisher_ref import Task, exact, load_config, task_from_json
from fisher_ref.cli import main
from fisher_ref.engine.plan import EnumerationTooLarge, count_states
from fisher_ref.limits import MAX_PARAMS
from fisher_ref.monte_carlo.sampling import estimate, sample
from fisher_ref.rewards import CountReward, FunctionReward
from fisher_ref.checks.identities import verify_task

import fisher_ref.engine.fast as exact_mod
from fisher_ref.engine.plan import EngineOptions
DEADLINE_S = 60  # generous: a refusal must return, not hang or swap; no timing is claimed
BASE = {"model": {"vocab_size": 5, "context": 2, "embed_dim": 3, "hidden": 8},
        "prompts": [[1, 2], [3]], "max_len": 3}
LONG_NUMBER = re.compile(r"\d{25}")  # a message must not print a 25-digit number


@contextlib.contextmanager
def deadline(seconds=DEADLINE_S):
    """Fail (TimeoutError) if the block runs past ``seconds`` (SIGALRM, main thread)."""
    def expire(signum, frame):
        raise TimeoutError(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def task_file(tmp_path, change=None, filename="task.json", **top):
    """A task file: BASE with ``top`` keys replaced and ``change`` applied to the model."""
    d = json.loads(json.dumps(BASE))
    d.update(top)
    if change:
        d["model"].update(change)
    path = tmp_path / filename
    path.write_text(json.dumps(d))
    return str(path)


def run_cli(argv, capsys):
    """``(exit code, stderr)`` of the command line, within the deadline."""
    with deadline():
        rc = main(argv)
    return rc, capsys.readouterr().err


def verify_file(path, capsys, *extra):
    return run_cli(["verify", "--task", path, "--mc", "0", "--quiet", *extra], capsys)


# ---------------------------------------------------------------- task fields

@pytest.mark.parametrize("top, model, words", [
    (dict(baseline=True), None, "baseline must be a number or 'mean', got True"),
    (dict(baseline="1.5"), None, "baseline must be a number or 'mean', got '1.5'"),
    (dict(baseline=None), None, "baseline must be a number"),
    (dict(baseline=1e308), None, "baseline must be at most 1e\\+100"),
    (dict(baseline=-1e101), None, "baseline must be at most 1e\\+100"),
    (dict(prompt_weights=["0.5", "0.5"]), None, "prompt_weights must be numbers"),
    (dict(prompt_weights=[True, False]), None, "prompt_weights must be numbers"),
    (dict(prompt_weights="0.5,0.5"), None, "prompt_weights must be a flat list"),
    (dict(prompt_weights=[[0.5], [0.5]]), None, "got a nested list of shape"),
    (dict(prompt_weights=[0.5, 0.5001]), None, "prompt_weights must sum to 1"),
    (dict(theta=["a"] * 119), None, "theta must be numeric"),
    (dict(theta=[1e300] * 119), None, "theta.* larger than 1e\\+06"),
    (dict(theta=[[0.0]] * 119), None, "theta must be a flat vector"),
    (dict(reward={"name": "match", "target": [1, 2, 3, 4]}), None,
     "target has 4 tokens but a response has at most max_len=3"),
    (dict(reward={"name": "match", "target": [1, 2]}), dict(eos=False),
     "without EOS every response has exactly max_len=3"),
    (dict(reward={"name": "count", "token": "1"}), None, "reward 'count' needs a non-negative"),
    (dict(reward={"name": "count", "token": True}), None, "reward 'count' needs a non-negative"),
    (dict(sampler={"kind": "temperature", "temperature": "hot"}), None, "sampler temperature"),
    (dict(sampler={"kind": "temperature", "temperature": True}), None, "sampler temperature"),
    (dict(sampler={"kind": "perturbed", "scale": "x"}), None, "sampler scale"),
    (dict(sampler={"kind": "perturbed", "scale": 0.1, "seed": -1}), None, "sampler seed"),
    (dict(sampler={"kind": "perturbed", "scale": 0.1, "seed": 1.5}), None, "sampler seed"),
    (dict(prompts=None), None, "prompts must be a list"),
    (dict(max_len="3"), None, "max_len must be an integer"),
    (dict(max_len=1e6), None, "max_len must be an integer"),
    (dict(name=5), None, "name must be a string"),
    (dict(model=None), None, "model spec must be a dict"),
    ({}, dict(init_scale=1e300), "model.init_scale must be at most 1000"),
    ({}, dict(init_scale=-1e4), "model.init_scale must be at most 1000"),
    ({}, dict(init_scale="1"), "model.init_scale must be a finite number"),
    ({}, dict(vocab_size="5"), "model.vocab_size must be a positive integer"),
    ({}, dict(eos="yes"), "model.eos must be true or false"),
    ({}, dict(init_seed=-1), "model.init_seed must be a non-negative integer"),
    ({}, dict(arch="rnn"), "unknown model arch 'rnn'"),
], ids=lambda v: None if isinstance(v, (dict, type(None))) else v[:30])
def test_bad_task_field_exits_2_naming_it(tmp_path, capsys, top, model, words):
    rc, err = verify_file(task_file(tmp_path, model, **top), capsys)
    assert rc == 2 and re.search(words, err), err


def test_non_utf8_task_file_names_the_path(tmp_path, capsys):
    path = tmp_path / "latin1.json"
    path.write_bytes('{"name": "caf\xe9"}'.encode("latin-1"))
    rc, err = verify_file(str(path), capsys)
    assert rc == 2 and "latin1.json" in err and "not UTF-8" in err


def test_deeply_nested_json_is_refused(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    rc, err = verify_file(str(path), capsys)
    assert rc == 2 and "deep.json" in err


# ---------------------------------------------------------------- the size guard

def _readable(err):
    return not LONG_NUMBER.search(err)


@pytest.mark.parametrize("top, model, words", [
    (dict(max_len=1000000), None, "e\\+602059 states"),
    (dict(max_len=1000), None, "e\\+601 states"),
    (dict(max_len=10 ** 400), None, "states"),
    ({}, dict(vocab_size=10 ** 9), "parameters, more than the limit 10,000,000"),
    ({}, dict(hidden=10 ** 9), "parameters, more than the limit"),
    ({}, dict(embed_dim=10 ** 9), "parameters, more than the limit"),
    ({}, dict(vocab_size=10 ** 400), "parameters, more than the limit"),
    ({}, dict(context=10 ** 6), "model.context is 1,000,000, more than the limit 1,024"),
    (dict(model={"arch": "tabular", "vocab_size": 1000, "context": 10}), None,
     "1.0e\\+33 parameters"),
    (dict(model={"arch": "tabular", "vocab_size": 10 ** 9, "context": 1}), None, "parameters"),
    (dict(model={"arch": "gpt2", "vocab_size": 5, "n_layer": 10 ** 9}), None, "model.n_layer"),
    (dict(model={"arch": "gpt2", "vocab_size": 5, "embed_dim": 10 ** 9, "n_head": 1}), None,
     "1.2e\\+19 parameters"),
    (dict(model={"arch": "gpt2", "vocab_size": 10 ** 9}), None, "parameters"),
    (dict(model={"arch": "gpt2", "vocab_size": 5, "n_positions": 10 ** 9}), None,
     "model.n_positions"),
], ids=lambda v: None if isinstance(v, (dict, type(None))) else v[:24])
def test_sizes_are_refused_in_closed_form(tmp_path, capsys, monkeypatch, top, model, words):
    """Refused before any state is enumerated (a model too large: before its theta is
    drawn), with readable numbers."""
    monkeypatch.setattr("fisher_ref.engine.run.root_block",
                        lambda *a, **k: pytest.fail("the enumeration started"))
    if "states" not in words:  # the model itself is too large
        monkeypatch.setattr(np.random, "default_rng",
                            lambda *a, **k: pytest.fail("theta was drawn before the refusal"))
    rc, err = verify_file(task_file(tmp_path, model, **top), capsys)
    assert rc == 2 and re.search(words, err) and _readable(err), err


def test_mc_1e10_is_refused_before_the_enumeration(capsys, monkeypatch):
    monkeypatch.setattr(exact_mod, "exact", lambda *a, **k: pytest.fail("enumerated first"))
    rc, err = run_cli(["verify", "--config", "default", "--mc", "1e10", "--quiet"], capsys)
    assert rc == 2 and "n=10,000,000,000" in err and "use n <=" in err and "GiB" in err


def test_api_sizes_are_refused():
    task = load_config("default")
    rng = np.random.default_rng(0)
    with deadline():
        with pytest.raises(ValueError, match="Monte Carlo refused: n=10,000,000,000"):
            estimate(task, 10 ** 10, rng)
        with pytest.raises(ValueError, match="Monte Carlo refused"):
            sample(task, 10 ** 12, rng)
        with pytest.raises(EnumerationTooLarge, match="states") as info:
            exact(task.with_(max_len=10 ** 6), progress=False)
        assert _readable(str(info.value))
        with pytest.raises(EnumerationTooLarge):
            count_states(5, 10 ** 9, True)
        for T, n in ((10 ** 400, 10), (3, 10 ** 400)):  # past float range: still readable
            with pytest.raises(ValueError, match="Monte Carlo refused") as info:
                estimate(task.with_(max_len=T), n, rng)
            assert _readable(str(info.value))
        with pytest.raises(EnumerationTooLarge, match="10\\^\\(10\\^300\\) or more states"):
            exact(task.with_(max_len=10 ** 400), progress=False)
    # the largest n the message suggests does fit
    with pytest.raises(ValueError) as info:
        estimate(task, 10 ** 10, rng)
    fit = int(re.search(r"use n <= ([\d,]+)", str(info.value)).group(1).replace(",", ""))
    from fisher_ref.monte_carlo.sampling import check_mc_size
    check_mc_size(task, fit, False)


def test_a_vocabulary_whose_sensitivities_cannot_fit_is_refused():
    """V = 2,000,000 with P ~ 6e6: one window's j alone is 1e14 bytes. Monte Carlo and
    the exact engine refuse before computing it; drawing alone still works."""
    d = {"model": {"vocab_size": 2_000_000, "context": 1, "embed_dim": 1, "hidden": 1},
         "prompts": [[1]], "max_len": 1}
    task = task_from_json(d)
    rng = np.random.default_rng(0)
    with deadline():
        with pytest.raises(ValueError, match="no n fits"):
            estimate(task, 2, rng)
        with pytest.raises(EnumerationTooLarge, match="estimated memory"):
            exact(task, progress=False)
        assert sample(task, 2, rng)["tokens"].shape == (2, 1)


@pytest.mark.parametrize("kw, exc, words", [
    (dict(max_bytes=float("nan")), ValueError, "max_bytes must be a positive number"),
    (dict(max_bytes=-1), ValueError, "max_bytes must be a positive number"),
    (dict(max_bytes=0), ValueError, "max_bytes must be a positive number"),
    (dict(max_bytes="8GB"), TypeError, "max_bytes must be a positive number"),
    (dict(max_bytes=True), TypeError, "max_bytes"),
    (dict(max_seconds=float("nan")), ValueError, "max_seconds must be a positive number"),
    (dict(max_seconds=None), TypeError, "max_seconds"),
], ids=lambda v: None if isinstance(v, (dict, type)) else v[:24])
def test_engine_limits_are_checked(kw, exc, words):
    with pytest.raises(exc, match=words):
        exact(load_config("default"), progress=False, options=EngineOptions(**kw))


def test_infinite_limits_mean_no_limit():
    r = exact(load_config("tabular"), progress=False,
              options=EngineOptions(max_seconds=math.inf, max_bytes=math.inf))
    assert r.n_responses > 0


# ---------------------------------------------------------------- the API

@pytest.mark.parametrize("bad", [None, "default", {"model": {}}, 3])
def test_engines_name_the_task_argument(bad):
    rng = np.random.default_rng(0)
    for call in (lambda: exact(bad), lambda: estimate(bad, 10, rng),
                 lambda: sample(bad, 10, rng), lambda: verify_task(bad)):
        with pytest.raises(TypeError, match="task must be a fisher_ref Task"):
            call()
    if bad == "default":
        with pytest.raises(TypeError, match="load_config\\('default'\\)"):
            exact(bad)


def _task_kwargs(**change):
    t = load_config("default")
    kw = dict(model=t.model, theta=t.theta, prompts=t.prompts, prompt_weights=t.prompt_weights,
              max_len=t.max_len, reward=t.reward)
    kw.update(change)
    return kw


@pytest.mark.parametrize("change, exc, words", [
    (dict(model=None), TypeError, "Task.model must be a model"),
    (dict(model="mlp_window"), TypeError, "Task.model must be a model"),
    (dict(theta=None), ValueError, "theta must be a flat vector"),
    (dict(prompts=None), ValueError, "prompts must be a list"),
    (dict(prompt_weights=None), ValueError, "prompt_weights must be a flat list"),
    (dict(prompt_weights=["0.5", "0.5"]), ValueError, "prompt_weights must be numbers"),
    (dict(baseline=True), ValueError, "baseline must be a number"),
    (dict(baseline=10 ** 400), ValueError, "baseline must be at most"),
    (dict(reward=None), ValueError, "reward must be a dict"),
    (dict(max_len=None), ValueError, "max_len must be an integer"),
], ids=lambda v: None if isinstance(v, (dict, type)) else v[:24])
def test_task_fields_name_themselves(change, exc, words):
    with pytest.raises(exc, match=words):
        Task(**_task_kwargs(**change))


@pytest.mark.parametrize("value, words", [(1e200, "at most 1e\\+100"), ("1.5", "not a number"),
                                          (float("inf"), "non-finite"), (None, "not a number")])
def test_custom_reward_values_are_checked(value, words):
    t = load_config("tabular")
    task = t.with_(reward=FunctionReward(lambda p, r: value))
    with pytest.raises(ValueError, match="reward returned .*" + words):
        exact(task, progress=False)


def test_verify_task_arguments_are_checked():
    task = load_config("tabular")
    for kw, words in ((dict(mc=-1), "mc .*non-negative"), (dict(mc=2.5), "mc .*non-negative"),
                      (dict(seed=-1), "seed must be a non-negative")):
        with pytest.raises(ValueError, match=words):
            verify_task(task, progress=False, **kw)


# ---------------------------------------------------------------- files and paths

def test_task_path_problems_exit_2_naming_the_path(tmp_path, capsys):
    for path, words in ((str(tmp_path), "is a directory"), ("", "a file path is required"),
                        (str(tmp_path / "absent.json"), "not found")):
        rc, err = verify_file(path, capsys)
        assert rc == 2 and words in err and (path in err if path else "''" in err), err


def test_unreadable_task_file_exits_2_naming_it(tmp_path, capsys, monkeypatch):
    """Permission denied (simulated: the tests may run as root, who may read anything)."""
    path = task_file(tmp_path)

    def denied(self, *a, **k):
        raise PermissionError(errno.EACCES, "Permission denied", str(self))

    monkeypatch.setattr(type(tmp_path), "read_text", denied)
    rc, err = verify_file(path, capsys)
    assert rc == 2 and "Permission denied" in err and path in err


@pytest.mark.parametrize("sub", ["", "dir", "missing/x.npz"])
def test_bad_out_path_is_refused_before_work(tmp_path, capsys, monkeypatch, sub):
    (tmp_path / "dir").mkdir()
    out = "" if sub == "" else str(tmp_path / sub)
    monkeypatch.setattr(exact_mod, "exact", lambda *a, **k: pytest.fail("computed first"))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    rc, err = run_cli(["export", "--config", "default", "--out", out], capsys)
    assert rc == 2 and "--out" in err and (repr(out) in err)
    assert sorted(p.name for p in tmp_path.rglob("*")) == before


def _failing_writes(monkeypatch, err):
    """Every open for writing and every os.replace fails with ``err`` (a full disk,
    a read-only directory): whichever way a writer writes, it meets the error."""
    real_open = io.open

    def fake_open(file, mode="r", *a, **k):
        if any(c in mode for c in "wax+"):
            raise OSError(err, os.strerror(err), str(file))
        return real_open(file, mode, *a, **k)

    def fake_replace(src, dst, *a, **k):
        raise OSError(err, os.strerror(err), str(dst))

    monkeypatch.setattr(io, "open", fake_open)
    monkeypatch.setattr("builtins.open", fake_open)
    monkeypatch.setattr(os, "replace", fake_replace)


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES], ids=["disk-full", "denied"])
def test_failed_export_write_exits_2_and_leaves_no_file(tmp_path, capsys, monkeypatch, err):
    out = tmp_path / "golden.npz"
    _failing_writes(monkeypatch, err)
    rc, msg = run_cli(["export", "--config", "tabular", "--out", str(out)], capsys)
    monkeypatch.undo()
    assert rc == 2 and os.strerror(err) in msg, msg
    assert list(tmp_path.iterdir()) == []  # no file, no temporary left behind


# ---------------------------------------------------------------- valid edges

def test_weights_within_tolerance_are_renormalised_and_verify(tmp_path, capsys):
    """[0.5, 0.5000000008] sums to 1 + 8e-10, inside WEIGHT_SUM_TOL (1e-9): accepted,
    divided by the sum (so verify's total probability holds at 1e-10), ratios kept."""
    path = task_file(tmp_path, prompt_weights=[0.5, 0.5000000008])
    rc, _ = verify_file(path, capsys)
    assert rc == 0
    t = task_from_json(json.loads(open(path).read()))
    w = t.prompt_weights
    assert abs(w.sum() - 1.0) <= 2 * np.finfo(float).eps
    assert w[1] / w[0] == pytest.approx(1.0000000016, rel=1e-15)
    # weights already summing to 1 to rounding are kept bit for bit (round trip)
    again = task_from_json(json.loads(json.dumps(t.to_json())))
    assert np.array_equal(again.prompt_weights, w)


def test_match_targets_that_can_match_are_accepted():
    """With EOS: a target of max_len tokens matches a response that ran to max_len
    without EOS; the empty target matches EOS first. Both have positive mean reward."""
    for target in ([1, 2, 3], []):
        d = json.loads(json.dumps(BASE))
        d["reward"] = {"name": "match", "target": target}
        r = exact(task_from_json(d), progress=False)
        assert r.expected_reward > 0, target


def test_limits_themselves_are_accepted():
    d = json.loads(json.dumps(BASE))
    d["model"]["init_scale"] = 1e3
    assert task_from_json(d).model.spec.init_scale == 1e3
    V = 100  # an MLP just under the parameter limit is built (its theta is drawn)
    H = (MAX_PARAMS - (V + 1) - V) // (1 + 1 + V)
    spec = {"vocab_size": V, "context": 1, "embed_dim": 1, "hidden": H}
    assert task_from_json({"model": spec, "prompts": [[1]], "max_len": 1}).model.num_params \
        <= MAX_PARAMS
    spec["hidden"] = H + 100
    with pytest.raises(ValueError, match="more than the limit"):
        task_from_json({"model": spec, "prompts": [[1]], "max_len": 1})
    t = load_config("tabular")
    assert Task(**_task_kwargs(baseline=1e100)).baseline == 1e100
    assert t.with_(reward=CountReward(1)).reward.token == 1
