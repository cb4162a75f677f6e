"""``python -m fisher_ref estimators``: one row per preset, exit 2 on bad input."""
import json

import numpy as np
import pytest

from fisher_ref.cli import main
from fisher_ref.cli.estimators import report_rows
from fisher_ref.estimators import expected_loss_gradient, presets as P

from tests.estimators.brute import tiny_task


def _task_file(tmp_path, **kw):
    spec = tiny_task(**kw).to_json()
    path = tmp_path / "task.json"
    path.write_text(json.dumps(spec))
    return str(path)


def test_prints_one_row_per_preset(tmp_path, capsys):
    path = _task_file(tmp_path, sampler={"kind": "temperature", "temperature": 1.5},
                      reference={"kind": "perturbed", "scale": 0.3, "seed": 5})
    assert main(["estimators", "--task", path, "--group-size", "2", "--batch", "8"]) == 0
    out = capsys.readouterr().out
    rows = [line.split() for line in out.splitlines()[2:]]
    assert [r[0] for r in rows] == list(P.PRESETS)
    seq = next(r for r in rows if r[0] == "sequence_is")
    assert float(seq[2]) == pytest.approx(-1.0, abs=1e-5) and float(seq[4]) < 1e-9
    assert "MSE@8" in out


def test_rows_are_the_library_numbers():
    task = tiny_task({"kind": "temperature", "temperature": 1.5})
    (row,) = report_rows(task, 1, 4, ["token_is"])
    lg = expected_loss_gradient(task, P.token_is())
    assert row[2:5] == pytest.approx((lg.scale, lg.cosine, lg.relative_bias), rel=1e-12)
    assert row[5] == pytest.approx(lg.variance_trace, rel=1e-12)
    assert row[6] == pytest.approx(lg.mse(4), rel=1e-12)
    assert np.isfinite(row[6])


def test_group_size_one_leaves_out_group_presets(capsys):
    assert main(["estimators", "--config", "tabular", "--group-size", "1"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert "reinforce" in names and "rloo" not in names and "k3_loss" not in names


@pytest.mark.parametrize("argv,match", [
    (["--group-size", "0"], "--group-size"),
    (["--batch", "0"], "--batch"),
    (["--preset", "ppo"], "unknown preset"),
    (["--group-size", "3", "--max-groups", "10"], "groups"),
    (["--group-size", "two"], "group-size"),
    (["--config", "nope"], "unknown config"),
    (["--groups-per-batch", "0"], "--groups-per-batch"),
    (["--groups-per-batch", "1.5"], "groups-per-batch"),
    (["--groups-per-batch", "3", "--group-size", "2"], "groups_per_batch=3"),
    (["--pad", "short"], "--pad"),
])
def test_bad_input_exits_2(argv, match, capsys):
    assert main(["estimators", "--config", "tabular"][: 3 if "--config" not in argv else 1]
                + argv) == 2
    assert match in capsys.readouterr().err


def test_groups_per_batch_and_pad_reach_the_library(capsys):
    task = tiny_task(vocab=2, max_len=3)
    (row,) = report_rows(task, 2, 4, ["dr_grpo"], groups_per_batch=2, pad="longest")
    lg = expected_loss_gradient(task, P.dr_grpo(), 2, groups_per_batch=2, pad="longest")
    assert row[2:5] == pytest.approx((lg.scale, lg.cosine, lg.relative_bias), rel=1e-12)
    assert main(["estimators", "--config", "tabular", "--group-size", "1", "--preset",
                 "reinforce", "--groups-per-batch", "2"]) == 0
    assert "groups per batch 2" in capsys.readouterr().out


def test_past_max_groups_the_advice_names_the_cli_options(capsys):
    """issue 46 item 18: the refusal past max_groups suggested ``symmetric=True`` (no CLI
    flag) and did not name ``--max-groups``; it now names --group-size, --symmetric and
    --max-groups, and --symmetric exists and gives the ordered tuples' numbers."""
    argv = ["estimators", "--config", "tabular", "--group-size", "3", "--max-groups", "50"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--symmetric" in err and "raise --max-groups (now 50)" in err
    assert "--group-size" in err and "symmetric=True" not in err
    assert "estimators refused" in err
    assert main(argv[:-2] + ["--preset", "grpo", "--preset", "rloo"]) == 0
    ordered = capsys.readouterr().out.splitlines()[2:]
    assert main(argv[:-2] + ["--preset", "grpo", "--preset", "rloo", "--symmetric"]) == 0
    multisets = capsys.readouterr().out.splitlines()[2:]
    for a, b in zip(ordered, multisets):  # the same expected gradients, fewer groups
        na, nb = a.split(), b.split()
        assert na[:2] == nb[:2]
        np.testing.assert_allclose([float(x) for x in nb[2:]], [float(x) for x in na[2:]],
                                   rtol=1e-4, atol=1e-9)
    with_sym = ["estimators", "--config", "tabular", "--group-size", "3", "--symmetric",
                "--max-groups", "5"]
    assert main(with_sym) == 2
    err = capsys.readouterr().err
    assert "multisets" in err and "raise --max-groups (now 5)" in err
    assert ", --symmetric" not in err  # already given: not advised again


def test_a_repeated_preset_is_reported_once(capsys):
    """issue 46 item 18: ``--preset grpo --preset grpo`` printed the grpo row twice."""
    assert main(["estimators", "--config", "tabular", "--preset", "grpo", "--preset", "rloo",
                 "--preset", "grpo"]) == 0
    names = [line.split()[0] for line in capsys.readouterr().out.splitlines()[2:]]
    assert names == ["grpo", "rloo"]
