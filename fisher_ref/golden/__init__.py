"""Golden files: the exact arrays of a task, written once and checked anywhere.

- :mod:`fisher_ref.golden.format`: the file format (keys, scales, the checked reader;
  the keys and scales in :mod:`~fisher_ref.golden.schema`, the hashes in
  :mod:`~fisher_ref.golden.hashes`, the reader's checks in
  :mod:`~fisher_ref.golden.validation`);
- :mod:`fisher_ref.golden.check`: comparing another implementation's arrays with a file
  (numpy only; :mod:`fisher_ref.testing` is its public face);
- :mod:`fisher_ref.golden.export`: computing and writing the files (needs the engine).

This ``__init__`` imports nothing, so that checking a golden file loads numpy only.
The shipped files are rewritten by ``python -m fisher_ref regenerate``.
"""
