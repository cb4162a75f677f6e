"""``python -m fisher_ref`` entry point."""
import sys

from fisher_ref.cli import main

sys.exit(main())
