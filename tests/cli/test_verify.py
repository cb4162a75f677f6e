"""``python -m fisher_ref verify`` (fisher_ref.cli.verify): its --workers option, and an
output that fits a 100-column terminal."""
import pytest

from fisher_ref.checks.table import TABLE_WIDTH
from fisher_ref.cli import main


def test_cli_verify_takes_workers(capsys):
    assert main(["verify", "--mc", "0", "--quiet", "--workers", "2"]) == 0
    assert "checks passed" in capsys.readouterr().out
    for bad in ("0", "two", "-1"):
        assert main(["verify", "--mc", "0", "--workers", bad]) == 2  # bad input
        assert "--workers" in capsys.readouterr().err


@pytest.mark.parametrize("config, mc", [("default", 500), ("offpolicy_temperature", 500)])
def test_cli_verify_fits_100_columns(config, mc, capsys):
    """The first command of the README: every line of its output fits a 100-column
    terminal (the notes go to a legend under the table)."""
    assert main(["verify", "--config", config, "--mc", str(mc), "--quiet"]) == 0
    out = capsys.readouterr().out
    wide = [line for line in out.splitlines() if len(line) > TABLE_WIDTH]
    assert TABLE_WIDTH == 100 and not wide, wide
    assert "\nnotes:\n[1] " in out and "checks passed" in out


def test_cli_verify_failure_line_fits_100_columns(monkeypatch, capsys):
    """A failed run names every failed check, wrapped within the 100 columns."""
    import fisher_ref.cli.verify as cli_verify
    real = cli_verify.verify_task

    def failing(*args, **kwargs):
        result, rows = real(*args, **kwargs)
        for row in rows:
            if row.kind == "equal":
                row.value = 1.0  # every equality row fails
        return result, rows

    monkeypatch.setattr(cli_verify, "verify_task", failing)
    assert main(["verify", "--mc", "0", "--quiet"]) == 1
    out = capsys.readouterr().out
    assert "FAILED: total probability = 1" in out
    assert max(len(line) for line in out.splitlines()) <= TABLE_WIDTH
