"""The measurements behind the records in ``docs/`` (``benchmarks/README.md``); not part of
the installed package."""
