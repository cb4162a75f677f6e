"""``python -m fisher_ref verify`` (fisher_ref.cli.verify): its --workers option."""
from fisher_ref.cli import main


def test_cli_verify_takes_workers(capsys):
    assert main(["verify", "--mc", "0", "--quiet", "--workers", "2"]) == 0
    assert "checks passed" in capsys.readouterr().out
    for bad in ("0", "two", "-1"):
        assert main(["verify", "--mc", "0", "--workers", bad]) == 2  # bad input
        assert "--workers" in capsys.readouterr().err
