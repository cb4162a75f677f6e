"""The shared memory a worker of ``exact(task, workers=N)`` sends its large arrays
through (:func:`share`, in the worker), and the caller reads them from in place
(:func:`unpack`): the worker's blocks kept from run to run, the caller's mappings of them,
and the blocks the caller still reads (:func:`busy_blocks`), which the worker leaves alone."""
from __future__ import annotations

import atexit
import mmap
import os
import weakref

__all__ = ["FIELDS", "SHARED_BYTES", "busy_blocks", "close_attached", "drop_blocks", "share",
           "unlink_blocks", "unpack"]

#: Arrays of a worker's result at least this large come back through shared memory: on
#: the development machine 12 MiB took 47 ms through the result pipe and 16 ms through
#: shared memory, written, named and copied out (benchmarks/scaling/ipc_cost.py).
SHARED_BYTES = 2 ** 20
FIELDS = ("window_tables", "states", "sequences")  # the ShardResult dicts that grow

# A worker's shared-memory blocks, kept from run to run: a fresh block's pages cost far
# more to come by than to write (12 MiB: about 12 ms fresh against under 1 ms into a
# block written before, benchmarks/scaling/ipc_cost.py). ``mem[j]`` holds the blocks of the ``j``-th
# result the worker sends in one run (one result, unless it runs more than one shard of
# that run): the one last written first, and at most one other that the caller still
# held arrays of, so that a caller that keeps each result until the next run's is back
# (``r = exact(...)`` in a loop) finds the two blocks taking turns. In the caller, per
# worker slot, its mapping of each of those blocks by name: an ``mmap`` that the arrays
# of a result are read from in place (where the system names its shared memory in
# ``/dev/shm``), else a ``SharedMemory`` they are copied out of; and per block, weak
# references to the arrays read from it (:func:`busy_blocks`).
_BLOCKS = {"run": None, "used": 0, "mem": []}
_ATTACHED = {}  # {(pid, j): {name: mmap.mmap or SharedMemory}}
_LENT = {}  # {name: [weakref.ref(array), ...]}


def busy_blocks():
    """The names of the workers' blocks that still back an array of a result here: a
    worker does not write into them (:func:`_block`)."""
    for name in [n for n, refs in _LENT.items() if all(r() is None for r in refs)]:
        del _LENT[name]
    return frozenset(_LENT)


def _drop(mem):
    """A block given up: its name removed (unless the caller did already) and unmapped."""
    try:
        mem.unlink()
    except FileNotFoundError:  # the caller removed the name when it mapped the block
        pass
    mem.close()


def drop_blocks():
    """At a worker's exit: its blocks given up (the caller's mappings keep theirs alive)."""
    for blocks in _BLOCKS["mem"]:
        for mem in blocks:
            _drop(mem)
    _BLOCKS["mem"] = []


def unlink_blocks():
    """The names of this worker's blocks removed, its mappings of them left as they are (a
    thread may still be writing into one): what a worker whose caller died does before it
    ends (:func:`fisher_ref.parallel.worker_process.watch_parent`)."""
    for blocks in _BLOCKS["mem"]:
        for mem in blocks:
            try:
                mem.unlink()
            except FileNotFoundError:  # the caller removed the name when it mapped the block
                pass


def _block(run, size, busy=frozenset()):
    """A shared-memory block of at least ``size`` bytes for this worker's next result in
    run ``run``, and its slot: a block the same slot held in an earlier run when it is
    as large and no more than 4 times larger and the caller holds no array read from it
    (its name not in ``busy``, :func:`busy_blocks`); else a new one (``run=None``: always new, in
    a slot of its own). The slot keeps that block and, of its others, one the caller still
    holds (:data:`_BLOCKS`); ``_BLOCKS["mem"][j]`` lists them, the one returned first."""
    from multiprocessing import shared_memory
    st = _BLOCKS
    if run is None:
        return shared_memory.SharedMemory(create=True, size=size), None
    if st["run"] != run:
        st["run"], st["used"] = run, 0
        if not st["mem"]:
            atexit.register(drop_blocks)
    j, st["used"] = st["used"], st["used"] + 1
    mems = st["mem"]
    if j == len(mems):
        mems.append([])
    held = mems[j]
    mem = next((m for m in held if m.name not in busy and size <= m.size <= 4 * size), None)
    if mem is None:
        mem = shared_memory.SharedMemory(create=True, size=size)
    keep = [mem] + [m for m in held if m is not mem and m.name in busy][:1]
    for m in held:
        if all(m is not k for k in keep):
            _drop(m)
    mems[j] = keep
    return mem, j



def share(out, run=None, busy=frozenset()):
    """In a worker: ``out`` (a shard's result) with its large arrays (those of
    :data:`FIELDS` past :data:`SHARED_BYTES`) moved to a shared-memory block
    (``out.shared``: ``(name, slot, [(field, key, offset, shape, dtype), ...], kept)``,
    ``kept`` the names of the blocks the slot keeps) that the caller reads them from
    (:func:`unpack`). ``run``: the caller's number of the run, under which the worker
    reuses a block of an earlier run whose name is not in ``busy`` (:func:`_block`;
    ``run=None``: a block of its own, freed by the caller)."""
    import numpy as np
    big = [(f, k, v) for f in FIELDS for k, v in (getattr(out, f, None) or {}).items()
           if isinstance(v, np.ndarray) and v.nbytes >= SHARED_BYTES]
    if not big:
        return out
    align = lambda n: -(-n // 64) * 64  # each array at a multiple of 64 bytes
    mem, j = _block(run, sum(align(v.nbytes) for *_, v in big), busy)
    index, at = [], 0
    try:
        for f, k, v in big:
            np.ndarray(v.shape, v.dtype, buffer=mem.buf, offset=at)[...] = v
            index.append((f, k, at, v.shape, v.dtype.str))
            getattr(out, f)[k] = None
            at += align(v.nbytes)
    except BaseException:
        if j is None:
            _drop(mem)
        raise
    kept = () if j is None else tuple(m.name for m in _BLOCKS["mem"][j])
    out.shared = (mem.name, None if j is None else (os.getpid(), j), index, kept)
    if j is None:
        mem.close()  # the caller removes it once copied
    return out


def unpack(out):
    """The arrays a worker left in shared memory (:func:`share`), put back into
    the result. From a kept block (a slot's): read in place, from this process's mapping of
    it, made once per block (its name removed at once: the worker's mapping and this one
    hold it), the result's arrays keeping the mapping alive; while they live the worker
    writes elsewhere (:func:`busy_blocks`). So no copy is made, and no fresh page of this process
    is faulted in for them. The mappings of blocks the slot no longer keeps are let go.
    Where a block cannot be mapped so (no ``/dev/shm``), and from a block of its own
    (freed here), the arrays are copied out."""
    shared = getattr(out, "shared", None)
    if shared is None:
        return out
    import numpy as np
    name, slot, index, kept = shared
    maps = _ATTACHED.setdefault(slot, {}) if slot is not None else {}
    for other in [n for n in maps if n not in kept]:  # blocks the worker has given up
        buf = maps.pop(other)
        if not isinstance(buf, mmap.mmap):
            buf.close()
    if name not in maps:
        maps[name] = _map(name, keep=slot is not None)
    buf = maps[name]
    views = isinstance(buf, mmap.mmap)
    lent = []
    try:
        for f, k, at, shape, dtype in index:
            dt = np.dtype(dtype)
            if views:  # every view of `flat` (the reshaped one too) has it as its base
                flat = np.frombuffer(buf, dt, int(np.prod(shape)), at)
                lent.append(flat)
                a = flat.reshape(shape)
            else:
                a = np.ndarray(shape, dt, buffer=buf.buf, offset=at).copy()
            getattr(out, f)[k] = a
    finally:
        if slot is None:
            buf.close()
    if lent:
        _LENT[name] = [weakref.ref(a) for a in lent]
    del out.shared
    return out


def _map(name, keep):
    """The block ``name``, its name removed: an ``mmap`` of it where the system names
    shared memory in ``/dev/shm`` and the block is kept (``keep``), which lives as long as
    the arrays read from it; else a ``SharedMemory`` (to copy out of and close)."""
    from multiprocessing import resource_tracker, shared_memory
    path = os.path.join("/dev/shm", name.lstrip("/"))
    if keep and os.path.exists(path):
        fd = os.open(path, os.O_RDWR)
        try:
            buf = mmap.mmap(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        os.unlink(path)  # as SharedMemory.unlink: the name, and the tracker's record of it
        resource_tracker.unregister("/" + name.lstrip("/"), "shared_memory")
        return buf
    mem = shared_memory.SharedMemory(name=name)
    try:
        mem.unlink()
    except BaseException:
        mem.close()
        raise
    return mem


def close_attached():
    """The caller's mappings of the workers' blocks given up (their pool ended): an
    ``mmap`` goes with the last array read from it, a ``SharedMemory`` is closed."""
    for maps in _ATTACHED.values():
        for buf in maps.values():
            if not isinstance(buf, mmap.mmap):
                buf.close()
    _ATTACHED.clear()
    _LENT.clear()
