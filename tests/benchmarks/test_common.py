"""benchmarks/common.py: the command line a record names, and the scripts' integer check."""
import argparse
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))
from benchmarks.common import MADE_BY, made_by, positive  # noqa: E402


def test_made_by_is_the_command_from_the_repository_root_shell_quoted():
    script = ROOT / "benchmarks" / "speed" / "peer_timing.py"
    assert made_by(["--json", "a b.json", 3], script) == \
        "python benchmarks/speed/peer_timing.py --json 'a b.json' 3"
    assert MADE_BY + made_by([], script) == "# made by: python benchmarks/speed/peer_timing.py"


@pytest.mark.parametrize("text", ["0", "-3", "two", ""])
def test_positive_refuses_what_is_not_a_positive_integer(text):
    with pytest.raises(argparse.ArgumentTypeError,
                       match=f"must be a positive integer, got {text!r}"):
        positive(text)
    assert positive("7") == 7
