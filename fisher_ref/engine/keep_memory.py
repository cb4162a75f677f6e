"""This process's C library told to keep the memory it frees (glibc's ``mallopt``), and
whether it does: :func:`keep_freed_memory`, :func:`kept_in_process`, :func:`memory_kept`
(which the fast engine reads to size an MLP's sub-blocks, and which a worker of
``exact(task, workers=N)`` sets for itself)."""
from __future__ import annotations

import os
import re

__all__ = ["KEPT_AT_LEAST", "OLD_MMAP_CAP", "keep_freed_memory", "kept_in_process",
           "memory_kept", "startup_environ"]

#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: The most an older glibc (2.26 and before, at least) takes as its mmap threshold on 64-bit.
OLD_MMAP_CAP = 1 << 25
#: What :func:`keep_freed_memory` set in this process (:func:`kept_in_process`).
_KEPT = None


def keep_freed_memory(max_block=1 << 30, max_kept=(1 << 31) - 1):
    """Have this process's C library keep the memory it frees, for the next allocation,
    instead of handing it back to the system and faulting fresh pages in again.

    With glibc's default settings, much of what a run of ``exact`` frees goes back to the
    system (a block above the mmap threshold at once, the free top of the heap once it
    passes the trim threshold), so the next run in the same process pays again for the
    pages of its temporaries (``benchmarks/memory/alloc_effects.py`` counts them). After this call, a
    block under ``max_block`` bytes comes from the heap (blocks past about 64 MiB in a
    thread's own arena are still mapped alone), and the free top of the heap is trimmed
    only once it reaches ``max_kept`` bytes: runs that stay within both keep their pages,
    and the process holds that memory until it exits. It is glibc's ``mallopt``
    (``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``), set for the whole process and not undone:
    call it at the start of a long-lived process that runs ``exact`` many times (a
    notebook, a sweep), not in a library. Starting Python with the variables of
    :data:`fisher_ref.perf.bench.KEEP_MEMORY` does the same from the start, except that
    those trim nothing (``mallopt`` takes at most ``2**31 - 1`` bytes). A glibc that caps
    the mmap threshold at 32 MiB (older releases) is given 32 MiB when it refuses more.
    A worker of ``exact(task, workers=N)`` (a process of ours alone) calls it with
    ``max_block=2**25, max_kept=2**30``. Once memory is kept (:func:`memory_kept`), the fast
    engine sums an MLP's last level in larger sub-blocks.

    Args:
        max_block, max_kept: bytes, each an int in ``1..2**31 - 1`` (``mallopt`` takes a
            C ``int``).

    Returns:
        ``True`` when the C library took both settings (the mmap threshold perhaps capped,
        see :func:`kept_in_process`); ``False`` when it has no ``mallopt`` (not glibc) or
        refused a setting. Whatever it took is recorded either way.

    Raises:
        ValueError: ``max_block`` or ``max_kept`` is not an int in ``1..2**31 - 1``.

    Example:
        >>> import fisher_ref
        >>> fisher_ref.keep_freed_memory()  # doctest: +SKIP
        True
    """
    global _KEPT
    import operator
    values = []
    for name, v in (("max_block", max_block), ("max_kept", max_kept)):
        try:
            n = None if isinstance(v, bool) else operator.index(v)
        except TypeError:
            n = None
        if n is None or not 0 < n < 1 << 31:
            raise ValueError(f"keep_freed_memory: {name} must be an int in 1..2**31 - 1 "
                             f"(bytes, a C int), got {v!r}")
        values.append(n)
    max_block, max_kept = values
    import ctypes
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library the process runs on
    except (OSError, AttributeError, TypeError):  # no mallopt: nothing to set
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    block = next((b for b in dict.fromkeys((max_block, min(max_block, OLD_MMAP_CAP)))
                  if mallopt(_M_MMAP_THRESHOLD, b) == 1), None)
    kept = max_kept if mallopt(_M_TRIM_THRESHOLD, max_kept) == 1 else None
    if block is not None or kept is not None:  # the process has changed: say so
        old = _KEPT or (None, None)
        _KEPT = (block if block is not None else old[0], kept if kept is not None else old[1])
    return block is not None and kept is not None


def kept_in_process():
    """What :func:`keep_freed_memory` set in this process, ``(max_block, max_kept)`` (either
    ``None`` where the C library refused it), or ``None`` when it has changed nothing: a
    measurement in this process of the C library's default memory would be recorded under
    the wrong condition."""
    return _KEPT


def startup_environ():
    """The environment this process started with (``/proc/self/environ``), which is what
    glibc read its malloc settings from; ``os.environ`` where the file is not there."""
    try:
        with open("/proc/self/environ", "rb") as f:
            items = [kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv]
        return {k.decode(errors="surrogateescape"): v.decode(errors="surrogateescape")
                for k, v in items}
    except OSError:
        return dict(os.environ)


#: The least settings under which :func:`memory_kept` counts freed memory as kept: an mmap
#: threshold past the largest temporary of a grown sub-block, and room to keep them all.
KEPT_AT_LEAST = {"MALLOC_MMAP_THRESHOLD_": OLD_MMAP_CAP, "MALLOC_TRIM_THRESHOLD_": 1 << 28}


def memory_kept():
    """Whether this process keeps the memory it frees: glibc was told so, by
    :func:`keep_freed_memory` here (both settings taken) or by the variables
    ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` it started with, each at least
    :data:`KEPT_AT_LEAST`. The fast engine then gives the MLP's last level larger sub-blocks
    (:class:`fisher_ref.engine.plan.Budgets`): fewer numpy calls, whose larger temporaries
    no longer cost fresh pages on every run. Speed only: the numbers are the same to
    rounding (sums over other sub-blocks; ``tests/engine/test_keep_memory.py`` holds
    the two budgets to each other at 1e-12). Outside glibc, ``False``."""
    import platform
    if platform.libc_ver()[0] != "glibc":
        return False
    env = startup_environ()
    called = kept_in_process() or (None, None)  # a setting the call took replaces the start's
    for (name, least), value in zip(KEPT_AT_LEAST.items(), called):
        if value is None:
            text = env.get(name, "")  # as glibc reads it: decimal, or 0x hexadecimal
            if not re.fullmatch(r"[1-9][0-9]*|0[xX][0-9a-fA-F]+", text):
                return False
            value = int(text, 0)
        if value < least:
            return False
    return True
