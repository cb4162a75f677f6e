"""The edges a second round of hostile input found (issue 23), through the command line
and the API: output paths that are not regular files, unbounded reads, task fields that
defaulted or were read silently, samplers, seeds, signals, and verify's verdict on valid
edge tasks. Each case ends in exit code 2 (or a documented exception naming the field,
path or option), with nothing left behind and nothing overwritten; a valid task gets an
honest verdict."""
import json
import os
import stat
import subprocess
import sys
import warnings
from pathlib import Path

import autograd.numpy as anp
import numpy as np
import pytest

import fisher_ref.cli.compare as cli_compare
from fisher_ref import exact, load_config, task_from_json
from fisher_ref.checks.identities import exact_checks, verify_task
from fisher_ref.fileio import atomic_output
from fisher_ref.models.function import FunctionModel
from fisher_ref.samplers import make_sampler
from fisher_ref.tasks import Task, load_task
from fisher_ref.engine.plan import EngineOptions
from tests.cli.test_bad_input import BASE, deadline, run_cli, task_file, verify_file

ROOT = Path(__file__).resolve().parents[2]


# ------------------------------------------------------------- output paths (item 1)

@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "pipe"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("argv", [["export", "--config", "tabular", "--out"],
                                  ["compare", "--config", "tabular", "--mc", "0", "--json"],
                                  ["bench", "--config", "tabular", "--json"]])
def test_an_output_path_that_is_a_fifo_is_refused_and_left_as_it_was(fifo, capsys, argv):
    rc, err = run_cli(argv + [str(fifo)], capsys)
    assert rc == 2 and "FIFO" in err and str(fifo) in err and "refusing to replace" in err
    assert stat.S_ISFIFO(os.stat(fifo).st_mode)
    assert sorted(p.name for p in fifo.parent.iterdir()) == ["pipe"]


def test_out_written_as_a_directory_is_refused(tmp_path, capsys):
    out = tmp_path / "dir"
    rc, err = run_cli(["export", "--config", "tabular", "--out", f"{out}/"], capsys)
    assert rc == 2 and "ends with a slash" in err
    assert not out.exists()


def test_out_equal_to_the_task_file_is_refused_and_the_task_kept(tmp_path, capsys):
    path = task_file(tmp_path)
    before = Path(path).read_bytes()
    for same in (path, str(Path(path).parent / "." / Path(path).name)):
        rc, err = run_cli(["export", "--task", path, "--out", same], capsys)
        assert rc == 2 and "is the --task file" in err
    assert Path(path).read_bytes() == before


def test_a_symlink_is_followed_and_stays_a_link(tmp_path, capsys):
    target, link = tmp_path / "real.npz", tmp_path / "link.npz"
    target.write_bytes(b"old")
    link.symlink_to(target)
    rc, _ = run_cli(["export", "--config", "tabular", "--out", str(link)], capsys)
    assert rc == 0 and link.is_symlink() and target.read_bytes()[:2] == b"PK"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.npz", "real.npz"]


def test_a_dangling_symlink_is_refused(tmp_path, capsys):
    link = tmp_path / "link.npz"
    link.symlink_to(tmp_path / "nowhere" / "x.npz")
    rc, err = run_cli(["export", "--config", "tabular", "--out", str(link)], capsys)
    assert rc == 2 and "symlink" in err and "does not exist" in err
    assert link.is_symlink() and not (tmp_path / "nowhere").exists()


def test_written_files_follow_the_umask(tmp_path, capsys):
    old = os.umask(0o022)
    try:
        out = tmp_path / "t.npz"
        assert run_cli(["export", "--config", "tabular", "--out", str(out)], capsys)[0] == 0
        assert stat.S_IMODE(out.stat().st_mode) == 0o644
        os.umask(0o077)
        with atomic_output(tmp_path / "private.txt") as tmp:
            Path(tmp).write_text("x")
        assert stat.S_IMODE((tmp_path / "private.txt").stat().st_mode) == 0o600
    finally:
        os.umask(old)


def test_compare_json_temp_file_exists_only_while_writing(tmp_path, capsys, monkeypatch):
    """SIGTERM during the long computation leaves nothing: no temporary file exists then."""
    seen = []

    def fake_compare(task, **kw):
        seen.append(sorted(p.name for p in tmp_path.iterdir()))
        return [{"quantity": "q", "dtype": "float64", "device": "cpu", "max_abs_error": 0.0,
                 "max_rel_error": 0.0, "test": "rel", "statistic": 0.0, "tolerance": 1e-10,
                 "passed": True}]
    monkeypatch.setattr(cli_compare, "compare", fake_compare)
    out = tmp_path / "rows.json"
    rc, _ = run_cli(["compare", "--config", "tabular", "--device", "cpu", "--json", str(out)],
                    capsys)
    assert rc == 0 and seen == [[]] and json.loads(out.read_text())["rows"][0]["passed"]


def test_bench_scaling_does_not_create_a_missing_directory(tmp_path, capsys):
    missing = tmp_path / "a" / "b"
    rc, err = run_cli(["bench", "--scaling", str(missing)], capsys)
    assert rc == 2 and "does not exist" in err and not (tmp_path / "a").exists()


# ------------------------------------------------------------- unbounded reads (item 8)

def test_task_from_dev_zero_and_a_fifo_is_refused_at_once(tmp_path, capsys, fifo):
    for path in ("/dev/zero", "/dev/urandom", str(fifo)):
        with deadline(20):  # a read without end, or an open that blocks, would not return
            rc, err = verify_file(path, capsys)
        assert rc == 2 and path in err and "not a regular file" in err


def test_a_task_file_over_the_size_limit_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("fisher_ref.tasks.MAX_TASK_FILE_BYTES", 50)
    rc, err = verify_file(task_file(tmp_path), capsys)
    assert rc == 2 and "more than the limit of 50 bytes" in err


def test_a_prompt_longer_than_the_limit_is_refused_before_the_enumeration(tmp_path, capsys,
                                                                           monkeypatch):
    monkeypatch.setattr("fisher_ref.engine.run.root_block",
                        lambda *a, **k: pytest.fail("the enumeration started"))
    rc, err = verify_file(task_file(tmp_path, prompts=[[1] * 3000]), capsys)
    assert rc == 2 and "prompt 0 has 3,000 tokens, more than the limit 1,024" in err


# ---------------------------------------------------------- task fields (items 13-15)

@pytest.mark.parametrize("top, model, words", [
    (dict(theta=[True] + [0.1] * 118), None, "theta must be numbers, but entry 0 is true"),
    (dict(prompt_weights=[True, 0.0]), None, "prompt_weights must be numbers, but entry 0"),
    ({}, dict(bos=99), "model.bos is 99, but BOS is always id vocab_size"),
    ({}, dict(bos=True), "model.bos is True"),
    ({}, dict(init_seed=2 ** 64), "model.init_seed must be a non-negative integer of at most"),
    (dict(name="\ud800"), None, "cannot be written as UTF-8"),
    (dict(name="a\x1b[2Jb"), None, "control characters"),
    (dict(sampler={"kind": "perturbed", "scale": 1e300}), None,
     "sampler scale is 1e\\+300, outside 0 .. 1e\\+06"),
    (dict(sampler={"kind": "rounded", "decimals": 400}), None,
     "sampler decimals is 400, outside -20 .. 20"),
    (dict(sampler={"kind": "rounded", "decimals": -400}), None, "sampler decimals is -400"),
    (dict(sampler={"kind": "rounded", "decimals": 10 ** 20}), None,
     "sampler decimals is 1.0e\\+20"),
    (dict(sampler={"kind": "temperature", "temperature": 1e-300}), None,
     "sampler temperature is 1e-300, outside 1e-100"),
    (dict(sampler={"kind": "perturbed", "scale": 0.1, "seed": 2 ** 64}), None,
     "sampler seed must be an integer from 0 to 2\\^63 - 1"),
], ids=lambda v: None if isinstance(v, (dict, type(None))) else v[:30])
def test_fields_read_silently_before_are_refused_by_name(tmp_path, capsys, monkeypatch, top,
                                                         model, words):
    import re
    monkeypatch.setattr("fisher_ref.engine.run.root_block",
                        lambda *a, **k: pytest.fail("the enumeration started"))
    rc, err = verify_file(task_file(tmp_path, model, **top), capsys)
    assert rc == 2 and re.search(words, err), err


def test_a_bos_equal_to_vocab_size_is_accepted():
    spec = json.loads(json.dumps(BASE))
    spec["model"]["bos"] = spec["model"]["vocab_size"]
    assert task_from_json(spec).model.bos == 5
    t = load_config("default")  # its describe() writes bos: the round trip loads
    assert task_from_json(t.to_json()).model.bos == t.model.bos


@pytest.mark.parametrize("text, words", [
    ('{"model": {"vocab_size": 5}, "prompts": [[1]], "max_len": 2, "max_len": 3}',
     "'max_len' appears twice"),
    ('{"model": {"vocab_size": 5, "vocab_size": 6}, "prompts": [[1]], "max_len": 2}',
     "'vocab_size' appears twice"),
    ('{"model": {"vocab_size": 5}, "prompts": [[1]], "max_len": NaN}', "NaN is not a JSON"),
    ('{"model": {"vocab_size": 5}, "prompts": [[1]], "max_len": 2, "baseline": Infinity}',
     "Infinity is not a JSON"),
    ('{"model": {"vocab_size": 5}, "prompts": [[1]], "max_len": ' + "9" * 5000 + "}",
     "max_len must be an integer"),
    ('{"model": {"vocab_size": 5, "init_scale": 1' + "0" * 400 + '}, "prompts": [[1]], '
     '"max_len": 2}', "model.init_scale is 1.0e\\+400, more than the limit 1,000"),
    ('{"model": {"vocab_size": 5, "init_scale": ' + "9" * 5000 + '}, "prompts": [[1]], '
     '"max_len": 2}', "model.init_scale must be a finite number"),
    ('{"model": {"vocab_size": 5}, "prompts": [[1]], "max_len": 2, "theta": ' +
     "[" * 200 + "]" * 200 + "}", "nested too deeply"),
])
def test_json_the_json_module_takes_silently_is_refused(tmp_path, capsys, text, words):
    import re
    path = tmp_path / "task.json"
    path.write_text(text)
    rc, err = verify_file(str(path), capsys)
    assert rc == 2 and re.search(words, err) and "Exceeds the limit" not in err, err
    assert len(err) < 2000


def test_an_unencodable_file_name_gives_a_printable_task_name(tmp_path):
    path = tmp_path / "caf\udce9.json"
    path.write_text(json.dumps(BASE))
    task = load_task(path)
    assert task.name.encode("utf-8") and task.name.isprintable()


def test_the_api_refuses_an_unencodable_name_at_construction():
    t = load_config("default")
    with pytest.raises(ValueError, match="cannot be written as UTF-8"):
        t.with_(name="\udcff")


def test_samplers_name_their_field_in_the_api():
    for spec, words in [({"kind": "perturbed", "scale": 10 ** 400}, "sampler scale"),
                        ({"kind": "temperature", "temperature": 1e101}, "sampler temperature")]:
        with pytest.raises(ValueError, match=words):
            make_sampler(spec)


# ------------------------------------------------------------------- seeds, signals


def test_compare_refuses_a_bad_seed_in_the_api_before_any_work(monkeypatch):
    from fisher_ref.checks.compare import compare
    monkeypatch.setattr("fisher_ref.engine.fast.exact",
                        lambda *a, **k: pytest.fail("work started before the seed was checked"))
    with pytest.raises(ValueError, match="seed must be an integer from 0 to 2\\^63 - 1"):
        compare(load_config("tabular"), seed=2 ** 64)


def test_verify_into_a_pipe_closed_early_is_quiet():
    """``verify | head -1``: the reader leaves early; no traceback, exit 0."""
    proc = subprocess.Popen([sys.executable, "-m", "fisher_ref", "verify", "--config",
                             "tabular", "--mc", "0", "--quiet"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader is gone before verify writes its first line
    err = proc.stderr.read().decode()
    rc = proc.wait(timeout=120)
    assert rc in (0, -13) and "Broken pipe" not in err and "Traceback" not in err, (rc, err)


def test_a_name_the_terminal_encoding_cannot_take_is_escaped(tmp_path):
    path = tmp_path / "t.json"
    path.write_text(json.dumps(dict(BASE, name="caf\u00e9 \u2603")))
    env = dict(os.environ, PYTHONIOENCODING="ascii")
    proc = subprocess.run([sys.executable, "-m", "fisher_ref", "verify", "--task", str(path),
                           "--mc", "0", "--quiet"], cwd=ROOT, env=env, capture_output=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr.decode()
    assert b"caf\\xe9 \\u2603" in proc.stdout


# ----------------------------------------------- honest verdicts on valid edge tasks

def _no_warnings_verify(task, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return verify_task(task, progress=False, **kw)


@pytest.mark.parametrize("make", [
    lambda: task_from_json({"model": {"arch": "gpt2", "vocab_size": 5, "n_positions": 8,
                                      "embed_dim": 4, "n_layer": 1, "n_head": 1,
                                      "init_scale": 0.0}, "prompts": [[1, 2]], "max_len": 2}),
    lambda: Task(FunctionModel(lambda th, w: anp.zeros((w.shape[0], 4)) + 0.0 * th[0], 3, 4, 1),
                 np.array([0.1, 0.2, 0.3]), ((1,),), np.ones(1), 2, lambda p, r: len(r)),
], ids=["gpt2_init_scale_0", "function_model_ignoring_theta"])
def test_all_zero_sensitivities_pass_verify_without_warnings(make):
    _, rows = _no_warnings_verify(make(), mc=0)
    assert all(r.passed for r in rows), [(r.check, r.value) for r in rows if not r.passed]
    (share,) = [r for r in rows if r.check.startswith("share of (state, param)")]
    assert "f_unif = 0 at every" in share.note


@pytest.mark.parametrize("scale", [1e-160, 1e-300])
def test_tiny_rewards_keep_their_spread_and_pass(scale):
    """std(A) is homogeneous in R: rewards 1e-160 give std 1e-160 times that of rewards 1,
    to rounding, where squaring first underflowed (0.2% off at 1e-160, 0 at 1e-300)."""
    t = load_config("default")
    one = exact(t.with_(reward=lambda p, r: 1.0 + r.count(2)), progress=False)
    tiny_task = t.with_(reward=lambda p, r: scale * (1.0 + r.count(2)))
    tiny = exact(tiny_task, progress=False)
    assert tiny.reward_std == pytest.approx(scale * one.reward_std, rel=1e-12)
    assert np.allclose(tiny.bound, scale * one.bound, rtol=1e-12, atol=0)
    rows = exact_checks(tiny)
    assert all(r.passed for r in rows), [(r.check, r.value) for r in rows if not r.passed]


def test_rows_that_need_the_kept_states_say_why_they_are_missing():
    bare = exact(load_config("default"), progress=False, options=EngineOptions(keep_states=False))
    (row,) = [r for r in exact_checks(bare) if r.identity == "4-5 pairwise, uniform reference"]
    assert row.kind == "info" and "not kept" in row.check and row.passed


def test_tiny_rewards_give_the_monte_carlo_rows_of_rewards_near_one():
    """The z-tests divide by exact variances that hold R^2: rewards of 2^-540 (1e-163)
    underflowed them to 0 (|z| = inf, a false failure). Scaled by a power of two the
    z-values are those of the same task with rewards near 1, bit for bit."""
    t = load_config("default")
    rows = {}
    for s in (1.0, 2.0 ** -540):
        _, got = verify_task(t.with_(reward=lambda p, r, s=s: s * (1.0 + r.count(2))), mc=2000,
                             seed=3, progress=False)
        rows[s] = [(r.check, r.value) for r in got if r.kind == "z"]
        assert all(r.passed for r in got), [(r.check, r.value) for r in got if not r.passed]
    assert rows[1.0] == rows[2.0 ** -540]


def test_subnormal_rewards_get_an_honest_verdict_and_a_row_saying_so():
    t = load_config("default").with_(reward=lambda p, r: 1e-320 * (1.0 + r.count(2)))
    _, rows = _no_warnings_verify(t, mc=0)
    assert all(r.passed for r in rows), [(r.check, r.value) for r in rows if not r.passed]
    assert any(r.kind == "info" and r.check.startswith("rewards and baseline scaled by")
               for r in rows)


@pytest.mark.parametrize("sig, code", [("SIGTERM", 143), ("SIGINT", 130)])
def test_a_signal_during_a_write_leaves_nothing_behind(tmp_path, capsys, monkeypatch, sig, code):
    """The signal arrives while the golden file's temporary file exists: it is removed,
    no output appears, and the exit is clean (no traceback)."""
    import signal
    import fisher_ref.golden.format as fmt
    real = fmt.Path.write_bytes

    def write_then_signal(self, data):
        real(self, data[:100])
        os.kill(os.getpid(), getattr(signal, sig))
    monkeypatch.setattr(fmt.Path, "write_bytes", write_then_signal)
    out = tmp_path / "t.npz"
    rc, err = run_cli(["export", "--config", "tabular", "--out", str(out)], capsys)
    assert rc == code and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []
