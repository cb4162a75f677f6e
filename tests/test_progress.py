"""The progress bar: silent when quick or disabled, a line with a newline when shown.

Time comes from an injected clock, so no test depends on how fast the machine is.
"""
import io

from fisher_ref._progress import Progress


class FakeClock:
    """Seconds that move only when the test says so."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_shown_after_delay_and_closed_with_newline():
    out, clock = io.StringIO(), FakeClock()
    bar = Progress(10, "enumerating", enabled=True, delay=2.0, stream=out, clock=clock)
    bar.update(2)
    assert out.getvalue() == ""  # 0 s elapsed: before the delay
    clock.now += 3.0
    bar.update(3)
    text = out.getvalue()
    assert "enumerating [" in text and "50.0%" in text and "3.0s elapsed" in text
    bar.close()
    assert out.getvalue().endswith("\n")


def test_quick_jobs_print_nothing():
    out, clock = io.StringIO(), FakeClock()
    bar = Progress(10, enabled=True, delay=60.0, stream=out, clock=clock)
    clock.now += 59.9  # just short of the delay
    bar.update(10)
    bar.close()
    assert out.getvalue() == ""


def test_redraws_at_most_every_half_second():
    out, clock = io.StringIO(), FakeClock()
    bar = Progress(100, enabled=True, delay=0.0, stream=out, clock=clock)
    clock.now += 1.0
    bar.update(1)
    clock.now += 0.2
    bar.update(1)  # 0.2 s after the last line: not drawn
    assert out.getvalue().count("\r") == 1
    clock.now += 0.4
    bar.update(1)
    assert out.getvalue().count("\r") == 2 and "3.0%" in out.getvalue()


def test_disabled_prints_nothing():
    out = io.StringIO()
    bar = Progress(10, enabled=False, delay=0.0, stream=out, clock=FakeClock())
    bar.update(3)
    bar.close()
    assert out.getvalue() == "" and bar.done == 3


def test_none_shows_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert Progress(1, enabled=None, stream=io.StringIO()).enabled is False
    assert Progress(1, enabled=None, stream=Tty()).enabled is True
