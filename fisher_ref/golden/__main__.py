"""``python -m fisher_ref.golden``: the golden files are rewritten by
``python -m fisher_ref regenerate`` now; this entry point only says so (exit 2)."""
import sys

if __name__ == "__main__":
    print("error: `python -m fisher_ref.golden --regenerate` is now "
          "`python -m fisher_ref regenerate [DIR] [--names NAME ...]`", file=sys.stderr)
    sys.exit(2)
