"""The progress bar: silent when quick or disabled, a line with a newline when shown."""
import io

from fisher_ref.progress import Progress


def test_shown_after_delay_and_closed_with_newline():
    out = io.StringIO()
    bar = Progress(10, "enumerating", enabled=True, delay=0.0, stream=out)
    bar.update(5)
    bar.close()
    text = out.getvalue()
    assert "enumerating [" in text and "50.0%" in text and text.endswith("\n")


def test_quick_jobs_print_nothing():
    out = io.StringIO()
    bar = Progress(10, enabled=True, delay=60.0, stream=out)
    bar.update(10)
    bar.close()
    assert out.getvalue() == ""


def test_disabled_prints_nothing():
    out = io.StringIO()
    bar = Progress(10, enabled=False, delay=0.0, stream=out)
    bar.update(3)
    bar.close()
    assert out.getvalue() == "" and bar.done == 3


def test_none_shows_only_on_a_terminal():
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert Progress(1, enabled=None, stream=io.StringIO()).enabled is False
    assert Progress(1, enabled=None, stream=Tty()).enabled is True
