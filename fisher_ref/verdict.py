"""What every check's verdict does with its numbers: it is true when the check passed, it
prints as its one-line :attr:`message`, and :meth:`assert_ok` raises an
``AssertionError`` with that message otherwise (so ``assert check(...)`` and
``check(...).assert_ok()`` both work in a test). Numpy-free, for the numpy-only checkers.
"""
from __future__ import annotations

__all__ = ["Verdict"]


class Verdict:
    """A mixin for a dataclass with a ``passed`` field and a ``message`` property.

    Example:
        >>> class V(Verdict):
        ...     passed, message = False, "FAIL: by 2"
        >>> bool(V()), str(V())
        (False, 'FAIL: by 2')
    """

    def __bool__(self):
        return bool(self.passed)

    def __str__(self):
        return self.message

    def assert_ok(self):
        """Raise ``AssertionError`` with :attr:`message` unless the check passed."""
        if not self.passed:
            raise AssertionError(self.message)
        return self
