"""``python -m fisher_ref`` entry point.

SIGTERM while the command line is imported (nothing written yet) exits with 143, as it
does inside a run (:func:`fisher_ref.cli.main`), not with the -15 of the default action.
"""
import signal
import sys


def _terminated_early(signum, frame):
    print("error: terminated (SIGTERM)", file=sys.stderr)
    raise SystemExit(143)


signal.signal(signal.SIGTERM, _terminated_early)  # while the imports run

from fisher_ref.cli import main  # noqa: E402

sys.exit(main())
