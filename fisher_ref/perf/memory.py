"""Peak resident memory of this process, as the benchmarks and memory tests report it."""
from __future__ import annotations

import resource
import sys

__all__ = ["peak_rss_bytes", "freed_memory_reused", "probe_process", "check_memory_condition",
           "startup_environ", "MemoryConditionError", "MEMORY_LABELS"]


def peak_rss_bytes():
    """This process's peak resident set size in bytes.

    On Linux it is ``VmHWM`` from ``/proc/self/status``: the high-water mark of this
    address space. ``getrusage``'s ``ru_maxrss`` is not used there because Linux keeps
    it across ``fork`` and ``exec``: a child started from a large process (a test
    worker) reports at least its parent's peak. Elsewhere ``ru_maxrss`` (bytes on
    macOS, KiB on other systems).

    Example:
        >>> peak_rss_bytes() > 0
        True
    """
    hwm = _status_bytes("VmHWM")
    if hwm is not None:
        return hwm
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _status_bytes(field):
    """A size field of ``/proc/self/status`` (``VmHWM``, ``VmRSS``) in bytes, or ``None``
    where the file does not give it (not Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    return None


def _rss_bytes():
    """This process's resident set size now, or ``None``."""
    return _status_bytes("VmRSS")


#: How :func:`freed_memory_reused`'s answers read in a report.
MEMORY_LABELS = {True: "kept and reused", False: "handed back", None: "could not tell"}


class MemoryConditionError(RuntimeError):
    """A process's allocator did not do with freed memory what the measurement's memory
    condition says (:func:`check_memory_condition`)."""


def freed_memory_reused(nbytes=64 << 20):
    """Whether this process's allocator keeps a freed block of ``nbytes`` resident and hands
    it to the next allocation of that size: ``True`` or ``False``, measured by the resident
    set size (a block filled with ones, freed, and allocated again: handed back, the
    resident size drops by the block; kept and reused, it neither drops nor grows again),
    so the answer does not depend on the page size or on huge pages; ``None`` when it
    cannot tell (no ``/proc/self/status``, or a change between the two).

    glibc hands a freed block back to the system when it was mapped on its own (above
    the mmap threshold; glibc raises that threshold as blocks are freed, but never past
    32 MiB on 64-bit systems, so the default size lies above it) or when the free memory at
    the top of the heap passes the trim threshold. So the answer is ``False`` with glibc's
    default settings and ``True`` with :data:`fisher_ref.perf.bench.KEEP_MEMORY` set when
    the process started. The probe raises this process's peak RSS by the block: run it in
    a process of its own (:func:`probe_process`), not in one whose peak is measured.
    """
    import numpy as np
    block = np.ones(nbytes // 8)
    full = _rss_bytes()
    del block
    freed = _rss_bytes()
    block = np.ones(nbytes // 8)
    again = _rss_bytes()
    del block
    if None in (full, freed, again):
        return None
    if full - freed > nbytes // 2:
        return False
    if full - freed < nbytes // 8 and again - freed < nbytes // 8:
        return True
    return None


def startup_environ():
    """The environment this process started with
    (:func:`fisher_ref.engine.keep_memory.startup_environ`). Imported when called, so that the
    probe's child, which runs this file by its path, needs no installed package."""
    from fisher_ref.engine.keep_memory import startup_environ as environ
    return environ()


def probe_process(env=None, nbytes=64 << 20, timeout=120):
    """:func:`freed_memory_reused` in a new Python process with the environment ``env``
    (this process's as it started, :func:`startup_environ`, by default): what the allocator
    of any process started so does, with no effect on this process's memory. This file runs
    by its path, so the answer comes from this code whatever the working directory holds.

    Raises:
        MemoryConditionError: the probe did not run to an answer (its output is quoted).
    """
    import subprocess
    code = ("import runpy, sys; sys.path.pop(0); "
            "print(runpy.run_path(sys.argv[1])['freed_memory_reused'](int(sys.argv[2])))")
    try:
        out = subprocess.run([sys.executable, "-c", code, __file__, str(int(nbytes))],
                             env=startup_environ() if env is None else dict(env),
                             capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise MemoryConditionError(f"the allocator probe did not answer within {timeout} s; "
                                   "the memory condition is not known") from None
    lines = out.stdout.strip().splitlines()
    answers = {"True": True, "False": False, "None": None}
    if out.returncode or not lines or lines[-1] not in answers:
        raise MemoryConditionError(
            f"the allocator probe did not run to an answer (exit {out.returncode}); its "
            f"output: {out.stdout.strip()[-300:]!r}; its errors: {out.stderr.strip()[-500:]!r}")
    return answers[lines[-1]]


def check_memory_condition(keep, reused, what="the measurement", env=None, kept_here=None):
    """Raise :class:`MemoryConditionError` unless the probe's answer ``reused``
    (:func:`freed_memory_reused`) agrees with the condition ``keep``: a run recorded as kept
    memory must have kept it, and one recorded as the C library's default must not have
    (``MALLOC_*`` variables, ``GLIBC_TUNABLES`` or another allocator preloaded can make it
    keep). Under the default, a probe that cannot tell (``None``: no ``/proc``) passes;
    under kept memory it does not. ``env``: the environment the probed process had, whose
    allocator settings the message names; ``kept_here``: what
    :func:`fisher_ref.engine.keep_memory.keep_freed_memory` set in the measured process, ``(max_block,
    max_kept)``, or ``None``: a process whose allocator that call changed is in no
    condition but its own, and the message names the call."""
    if kept_here is None and (reused is keep or (reused is None and not keep)):
        return
    import platform
    libc = " ".join(platform.libc_ver()).strip() or "C library unknown"
    asked = "kept memory" if keep else "the C library's default"
    if kept_here is not None:  # this process's allocator was changed while it ran
        raise MemoryConditionError(
            f"{what} asks for {asked}, but this process changed its allocator settings "
            f"(keep_freed_memory() set max_block={kept_here[0]}, max_kept={kept_here[1]}; "
            f"{libc}): its timings would be recorded under the wrong condition; measure in "
            "a new process (isolate=True)")
    happened = {True: "kept a freed 64 MiB block and reused it",
                False: "handed a freed 64 MiB block back",
                None: "gave the probe no clear answer (a freed 64 MiB block)"}[reused]
    env = startup_environ() if env is None else env
    found = {k: v for k, v in env.items()
             if k.startswith("MALLOC_") or k in ("GLIBC_TUNABLES", "LD_PRELOAD")}
    settings = ", ".join(f"{k}={v}" for k, v in sorted(found.items())) or "none"
    raise MemoryConditionError(
        f"{what} asks for {asked}, but a process started alike {happened} ({libc}; allocator "
        f"settings in its environment: {settings}): its timings would be recorded under the "
        "wrong condition" + (
            "; this C library does not keep freed memory with these settings" if keep
            else "; unset the settings that keep it, or preload no other allocator"))
