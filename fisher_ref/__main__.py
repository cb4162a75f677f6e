"""``python -m fisher_ref`` entry point."""
import sys

from .cli import main

sys.exit(main())
