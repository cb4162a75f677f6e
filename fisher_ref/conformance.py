"""``fisher_ref.conformance``: the documented path of :mod:`fisher_ref.checks.conformance`
(checking another implementation's token Fisher against the exact one)."""
from fisher_ref.checks.conformance import *  # noqa: F401,F403
from fisher_ref.checks.conformance import __all__  # noqa: F401
