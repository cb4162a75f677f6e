"""What every subcommand shares (fisher_ref.cli._common): --mc is a non-negative whole
number and --seed an integer from 0 to 2^63 - 1, checked alike by every command before
any work."""
import pytest

from tests.cli.test_bad_input import run_cli


@pytest.mark.parametrize("command", ["verify", "compare"])
@pytest.mark.parametrize("seed", ["-1", str(2 ** 64), "1.5", "x"])
def test_seeds_are_validated_alike_up_front(capsys, monkeypatch, command, seed):
    monkeypatch.setattr("fisher_ref.engine.run.root_block",
                        lambda *a, **k: pytest.fail("work started before the seed was checked"))
    rc, err = run_cli([command, "--config", "tabular", "--seed", seed], capsys)
    assert rc == 2 and "--seed" in err and "from 0 to 2^63 - 1" in err


@pytest.mark.parametrize("mc, words", [("-5", "non-negative whole number"),
                                       ("2.5", "non-negative whole number"),
                                       ("many", "non-negative whole number")])
def test_bad_mc_option_exits_2(capsys, mc, words):
    rc, err = run_cli(["verify", "--config", "default", "--mc", mc], capsys)
    assert rc == 2 and "--mc" in err and words in err
