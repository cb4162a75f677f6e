"""A worker's large arrays through shared memory (fisher_ref.parallel.worker_memory): the
caller gets the same arrays, read in place from a block the worker keeps from run to run
unless the caller still reads it, and nothing is left named in /dev/shm."""
import os

import pytest

from fisher_ref import load_config
from fisher_ref.parallel import exact_param_shard, worker_memory

from cases import with_options


def exact(task, param_shard, **kw):
    """The parameter shard ``param_shard`` of ``task`` (the knobs of ``kw`` as options)."""
    return exact_param_shard(task, param_shard, **with_options(kw))


def test_large_arrays_of_a_worker_come_back_through_shared_memory(monkeypatch):
    """A worker's per-window tables, states and sequences past SHARED_BYTES travel in one
    shared-memory block: the caller gets the same arrays, and the block is freed."""
    import numpy as np
    from multiprocessing import shared_memory
    task = load_config("offpolicy_stale")
    kw = dict(progress=False, topk=(1, 2), keep_states=True)
    monkeypatch.setattr(worker_memory, "SHARED_BYTES", 1)  # every array, in this process
    direct = exact(task, param_shard=(1, 2), **kw)  # the last: it keeps the records
    sent = worker_memory.share(exact(task, param_shard=(1, 2), **kw))
    name, slot, index, kept = sent.shared
    assert slot is None and kept == ()  # no run number: a block of its own, freed once copied
    assert {f for f, *_ in index} == {"window_tables", "states", "sequences"}
    assert all(getattr(sent, f)[k] is None for f, k, *_ in index)
    got = worker_memory.unpack(sent)
    assert not hasattr(got, "shared")
    for f in ("window_tables", "states", "sequences"):
        a, b = getattr(got, f), getattr(direct, f)
        assert a.keys() == b.keys()
        for k in b:
            assert np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype, (f, k)
    with pytest.raises(FileNotFoundError):  # freed by unpack
        shared_memory.SharedMemory(name=name)
    small = worker_memory.share(exact(task, param_shard=(0, 2), **dict(kw, keep_states=False)))
    assert not hasattr(small, "shared")  # nothing kept, nothing to share




def test_a_worker_keeps_its_block_from_run_to_run(monkeypatch):
    """Under a run number a worker writes its result into the block it used in the run
    before (same slot, same name) unless the caller still holds arrays read from it
    (``busy``): then into another block, and the arrays held stay as they were. A second
    result in one run goes into another slot, and a result too large (or over 4 times too
    small) for its slot into a new block. The caller reads the arrays in place (no copy),
    maps each block once and removes its name at once: nothing is left in /dev/shm."""
    import glob
    import numpy as np
    from multiprocessing import shared_memory
    monkeypatch.setattr(worker_memory, "_BLOCKS", {"run": None, "used": 0, "mem": []})
    monkeypatch.setattr(worker_memory, "_ATTACHED", {})
    monkeypatch.setattr(worker_memory, "_LENT", {})
    monkeypatch.setattr(worker_memory, "SHARED_BYTES", 1)
    small, large = load_config("default"), load_config("offpolicy_stale")
    kw = dict(progress=False, keep_states=True)
    want = {name: exact(t, param_shard=(1, 2), **kw)  # the last shard: it keeps the records
            for name, t in (("small", small), ("large", large))}
    before = set(glob.glob("/dev/shm/psm_*"))

    def send(task, run):
        return worker_memory.share(exact(task, param_shard=(1, 2), **kw), run,
                                   worker_memory.busy_blocks())

    def same(got, want):
        for f in ("window_tables", "states", "sequences"):
            a, b = getattr(got, f), getattr(want, f)
            assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in b), f
        return True

    try:
        first, second = send(small, 1), send(small, 1)  # two results of run 1
        slots = [r.shared[1] for r in (first, second)]
        assert slots == [(os.getpid(), 0), (os.getpid(), 1)]
        name = first.shared[0]
        assert second.shared[0] != name
        held = worker_memory.unpack(first)
        assert same(held, want["small"])
        assert not held.window_tables["token_fisher"].flags.owndata  # read in place
        with pytest.raises(FileNotFoundError):  # the caller removed the name when it mapped
            shared_memory.SharedMemory(name=name)
        worker_memory.unpack(second)
        del second  # its arrays gone: slot 1 is free again
        assert worker_memory.busy_blocks() == {name}
        part = held.window_tables["token_fisher"][:, 1:3]  # a view of one table
        expect = part.copy()
        del held, first  # the view alone still reads the block: it stays held
        assert worker_memory.busy_blocks() == {name}
        again = send(small, 2)  # slot 0's block backs `part`: another block
        assert again.shared[1] == slots[0] and again.shared[0] != name
        name = again.shared[0]
        assert same(worker_memory.unpack(again), want["small"])
        assert np.array_equal(part, expect)  # untouched by the run after it
        del part, again
        assert worker_memory.busy_blocks() == frozenset()
        third = send(small, 3)  # nothing held: written into the block of run 2 (listed first)
        assert (third.shared[0], third.shared[1]) == (name, slots[0])
        assert same(worker_memory.unpack(third), want["small"])
        del third
        assert [m.name for m in worker_memory._BLOCKS["mem"][0]] == [name]  # the other: given up
        size = worker_memory._BLOCKS["mem"][0][0].size
        for run, need, kept in ((4, size, True), (5, size // 4, True), (6, size // 4 - 1, False),
                                (7, size + 1, False)):
            mem, j = worker_memory._block(run, need)
            assert j == 0 and (mem.name == name) == kept and mem.size >= need, (run, need)
            name = mem.name
        other = send(large, 8)  # written into slot 0's block of run 7, or a new one
        other_name, slot, _, kept = other.shared
        assert kept == (other_name,)
        assert slot == slots[0]
        assert same(worker_memory.unpack(other), want["large"])
        assert set(worker_memory._ATTACHED[slot]) == {other_name}  # mapped anew, the old let go
        assert set(worker_memory._ATTACHED) == {slots[0], slots[1]}
        assert set(glob.glob("/dev/shm/psm_*")) <= before
    finally:
        worker_memory.drop_blocks()
        worker_memory.close_attached()
    assert worker_memory._ATTACHED == {} and worker_memory._BLOCKS["mem"] == []


def test_a_worker_whose_caller_died_removes_its_blocks_names(monkeypatch):
    """issue 46 item 13: what a worker does before it ends because its caller died
    (worker_process.watch_parent): the names of the blocks it keeps leave /dev/shm, while
    its own mapping stays writable (its main thread may be writing a result)."""
    monkeypatch.setattr(worker_memory, "_BLOCKS", {"run": None, "used": 0, "mem": []})
    mem, j = worker_memory._block(1, 4096)
    try:
        assert os.path.exists(f"/dev/shm/{mem.name.lstrip('/')}")
        worker_memory.unlink_blocks()
        assert not os.path.exists(f"/dev/shm/{mem.name.lstrip('/')}")
        mem.buf[:3] = b"ok!"
        worker_memory.unlink_blocks()  # twice: nothing left to remove, no error
    finally:
        worker_memory.drop_blocks()
