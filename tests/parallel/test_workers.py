"""The shards of one exact run in local worker processes (fisher_ref.parallel.workers):
the same result as one process, one BLAS thread each, one shard in the calling process,
'auto' sized by the cost, the cores and the memory limit, a dead worker named by its
shard, a broken kept pool replaced, and tasks the workers cannot receive refused."""
import os
import subprocess
import sys

import pytest

from fisher_ref import load_config
from fisher_ref.parallel import workers as workers_mod
from fisher_ref.parallel.run import exact
from fisher_ref.engine.plan import EngineOptions, estimate_cost
from fisher_ref.perf.scaling import load_scale_config
from fisher_ref.rewards import FunctionReward
from fisher_ref.parallel import exact_param_shard
from tests.parallel.test_shards import RTOL, merged_errors
from cases import with_options


@pytest.mark.parametrize("bad", [0, -2, 1.5, "many", True, None])
def test_bad_workers_is_refused(bad):
    with pytest.raises(ValueError, match="workers"):
        exact(load_config("default"), progress=False, workers=bad)


def test_auto_workers_stay_in_process_for_small_runs(monkeypatch):
    task = load_config("default")
    cost = estimate_cost(task)
    assert cost.seconds < workers_mod.AUTO_MIN_SECONDS
    assert workers_mod.resolve_workers("auto", cost) == 1
    monkeypatch.setattr(workers_mod, "AUTO_MIN_SECONDS", 0.0)
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 6)
    assert workers_mod.resolve_workers("auto", cost) == 6
    assert workers_mod.resolve_workers(3, cost) == 3


def test_workers_give_the_single_run():
    """Two local processes (spawned, one BLAS thread each): the same result."""
    task = load_config("offpolicy_stale")
    kw = dict(progress=False, topk=(1, 2))
    single = exact(task, workers=1, **with_options(kw))
    par = exact(task, workers=2, **with_options(kw))
    errs = merged_errors(par, single)
    assert max(errs.values()) <= RTOL, errs
    assert par.cost.workers == 2


def _blas_env(_):
    return {k: os.environ.get(k) for k in workers_mod.BLAS_THREAD_VARS}


def test_workers_run_one_blas_thread():
    """Workers start with every BLAS thread variable at 1; the parent's own are restored."""
    before = _blas_env(None)
    workers_mod.shutdown()  # fresh processes, started under the variables
    with workers_mod._one_blas_thread():
        envs = list(workers_mod._executor(2).map(_blas_env, range(4)))
    assert all(v == "1" for env in envs for v in env.values()), envs
    assert _blas_env(None) == before


def _where(task, shard, **kw):
    """A stand-in engine: which process ran the shard, and its BLAS thread counts."""
    from threadpoolctl import threadpool_info
    return shard, os.getpid(), sorted({p["num_threads"] for p in threadpool_info()})


def _where_params(task, param_shard, **kw):
    return _where(task, param_shard)


def test_one_shard_runs_here_and_the_others_in_workers():
    """The calling process runs one shard itself (one BLAS thread meanwhile) while n - 1
    workers run the rest: shard 0 of subtree shards, the last of parameter shards (the
    one that keeps the records); a pool of n - 1 processes is kept."""
    out = workers_mod.run_shards(_where, load_config("default"), 3, {})
    assert [o[0] for o in out] == [(0, 3), (1, 3), (2, 3)]
    assert out[0][1] == os.getpid() and os.getpid() not in (out[1][1], out[2][1])
    assert all(o[2] == [1] for o in out), out
    assert workers_mod._POOL["n"] == 2
    out = workers_mod.run_shards(_where_params, load_config("default"), 3, {},
                                 by="param_shard")
    assert [o[0] for o in out] == [(0, 3), (1, 3), (2, 3)]
    assert out[2][1] == os.getpid() and os.getpid() not in (out[0][1], out[1][1])
    assert all(o[2] == [1] for o in out), out
    times = workers_mod.last_run_times()  # where that run's wall time went
    assert times["here"][0] == 2 and set(times["workers"]) == {0, 1}
    parts = [times["here"][1], times["after_here"], *times["workers"].values()]
    assert all(s > 0 for s in parts) and times["here"][1] + times["after_here"] <= times["total"]
    assert max(times["workers"].values()) <= times["total"]


def _die(prompt, response):
    """A reward that ends the process it runs in, when that is a worker (the last
    parameter shard runs in the calling process, as with workers=1)."""
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        os._exit(3)
    return 0.0


def test_a_dead_worker_is_an_error_naming_its_shard():
    exact(load_config("default"), progress=False, workers=2)
    assert workers_mod.last_run_times()  # a run that ended well is timed
    task = load_config("default").with_(reward=FunctionReward(_die))
    with pytest.raises(RuntimeError, match=r"shard 0 of 2"):
        exact(task, progress=False, workers=2)
    assert workers_mod.last_run_times() == {}  # a failed run times nothing
    # the next run starts a fresh pool
    good = load_config("default")
    assert merged_errors(exact(good, progress=False, workers=2),
                         exact(good, progress=False, workers=1))["policy.sequence_fisher"] <= RTOL


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    """Workers are spawned without importing the calling script: one written without
    ``if __name__ == "__main__":`` runs once, not again in every worker."""
    script = tmp_path / "no_guard.py"
    script.write_text("from fisher_ref import load_config, exact\n"
                      "r = exact(load_config('default'), workers=2, progress=False)\n"
                      "print('ran', r.cost.workers)\n")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["ran", "2"], out.stdout


def _main_reward(prompt, response):
    return float(len(response))


def test_a_task_holding_main_objects_is_refused_by_explicit_workers(monkeypatch):
    _main_reward.__module__ = "__main__"  # as if written in the calling script
    try:
        task = load_config("default").with_(reward=FunctionReward(_main_reward))
        exact(load_config("default"), progress=False, workers=2)
        assert workers_mod.last_run_times()
        with pytest.raises(ValueError, match="__main__"):
            exact(task, progress=False, workers=2)
        assert workers_mod.last_run_times() == {}  # a refused run times nothing either
        monkeypatch.setattr(workers_mod, "AUTO_MIN_SECONDS", 0.0)
        assert workers_mod.local_workers(task, "auto", EngineOptions()) == 1
    finally:
        _main_reward.__module__ = __name__


def test_auto_workers_fit_in_the_memory_limit(monkeypatch):
    """'auto' takes fewer workers where all of them would pass max_bytes; an explicit
    count is refused instead."""
    task = load_scale_config("v16")
    monkeypatch.setattr(workers_mod, "AUTO_MIN_SECONDS", 0.0)
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 4)
    kw = EngineOptions(keep_states=False, keep_sequences=False, max_bytes=float("inf"))
    assert workers_mod.local_workers(task, "auto", kw) == 4
    two = estimate_cost(task, workers=2).bytes
    kw = kw.with_(max_bytes=two)
    assert workers_mod.local_workers(task, "auto", kw) == 2
    kw = kw.with_(max_bytes=estimate_cost(task).bytes)
    assert workers_mod.local_workers(task, "auto", kw) == 1


def test_auto_workers_stay_in_process_under_tracemalloc(monkeypatch):
    """A traced run (perf.scaling.measure) sees only its own process: 'auto' stays there."""
    import tracemalloc
    monkeypatch.setattr(workers_mod, "AUTO_MIN_SECONDS", 0.0)
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 4)
    kw = EngineOptions(keep_states=False, keep_sequences=False, max_bytes=float("inf"))
    task = load_config("default")
    assert workers_mod.local_workers(task, "auto", kw) > 1
    tracemalloc.start()
    try:
        assert workers_mod.local_workers(task, "auto", kw) == 1
    finally:
        tracemalloc.stop()


def test_a_broken_kept_pool_is_replaced():
    """A pool whose worker died outside a run (killed by the system, say) is not handed
    out again: the next run starts a fresh one."""
    import os
    import signal
    good = load_config("default")
    exact(good, progress=False, workers=2)
    ex = workers_mod._POOL["executor"]
    for pid, proc in list(ex._processes.items()):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:  # already gone
            pass
        proc.join(10)  # dead before the next run, as a worker killed between runs is
    out = exact(good, progress=False, workers=2)
    assert workers_mod._POOL["executor"] is not ex
    assert merged_errors(out, exact(good, progress=False, workers=1))["policy.sequence_fisher"] <= RTOL


def _raise_in_worker(prompt, response):
    """A reward that raises in a worker process (the caller's shard is spared)."""
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        raise ArithmeticError("boom in the worker")
    return 0.0


def _raise_here(prompt, response):
    """A reward that raises in the calling process only (the workers take their time)."""
    import multiprocessing
    import time
    if multiprocessing.parent_process() is None:
        raise ArithmeticError("boom in the caller")
    time.sleep(0.001)
    return 0.0


def test_a_shard_raising_in_a_worker_is_an_error_naming_it_and_ends_the_pool():
    task = load_config("default").with_(reward=FunctionReward(_raise_in_worker))
    with pytest.raises(RuntimeError, match=r"shard 0 of 2 failed in its worker process: "
                                           r"ArithmeticError: boom in the worker"):
        exact(task, progress=False, workers=2)
    assert "executor" not in workers_mod._POOL  # ended, not kept with a shard running
    good = load_config("default")
    assert merged_errors(exact(good, progress=False, workers=2),
                         exact(good, progress=False, workers=1))["policy.sequence_fisher"] <= RTOL


def test_the_callers_shard_failing_ends_the_workers_still_running():
    """The caller's shard (the last) raises while shard 0 still runs in its worker: the error is
    the caller's own (as with workers=1), and the running worker is ended with the pool."""
    task = load_config("default").with_(reward=FunctionReward(_raise_here))
    with pytest.raises(ArithmeticError, match="boom in the caller"):
        exact(task, progress=False, workers=2)
    assert "executor" not in workers_mod._POOL
    good = load_config("default")
    assert merged_errors(exact(good, progress=False, workers=2),
                         exact(good, progress=False, workers=1))["policy.sequence_fisher"] <= RTOL


def test_large_arrays_of_a_worker_come_back_through_shared_memory(monkeypatch):
    """A worker's per-window tables, states and sequences past SHARED_BYTES travel in one
    shared-memory block: the caller gets the same arrays, and the block is freed."""
    import numpy as np
    from multiprocessing import shared_memory
    task = load_config("offpolicy_stale")
    kw = dict(progress=False, topk=(1, 2), keep_states=True)
    monkeypatch.setattr(workers_mod, "SHARED_BYTES", 1)  # every array, in this process
    direct = exact_param_shard(task, (1, 2), **with_options(kw))  # the last: the records
    seconds, sent = workers_mod._shard_in_worker(exact_param_shard, task,
                                                 {"param_shard": (1, 2)}, with_options(kw))
    assert seconds > 0
    name, slot, index, kept = sent.shared
    assert slot is None and kept == ()  # no run number: a block of its own, freed once copied
    assert {f for f, *_ in index} == {"window_tables", "states", "sequences"}
    assert all(getattr(sent, f)[k] is None for f, k, *_ in index)
    got = workers_mod._unpack(sent)
    assert not hasattr(got, "shared")
    for f in ("window_tables", "states", "sequences"):
        a, b = getattr(got, f), getattr(direct, f)
        assert a.keys() == b.keys()
        for k in b:
            assert np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype, (f, k)
    with pytest.raises(FileNotFoundError):  # freed by _unpack
        shared_memory.SharedMemory(name=name)
    _, small = workers_mod._shard_in_worker(exact_param_shard, task, {"param_shard": (0, 2)},
                                            with_options(dict(kw, keep_states=False)))
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
    monkeypatch.setattr(workers_mod, "_BLOCKS", {"run": None, "used": 0, "mem": []})
    monkeypatch.setattr(workers_mod, "_ATTACHED", {})
    monkeypatch.setattr(workers_mod, "_LENT", {})
    monkeypatch.setattr(workers_mod, "SHARED_BYTES", 1)
    small, large = load_config("default"), load_config("offpolicy_stale")
    kw = dict(progress=False, keep_states=True)
    kw = with_options(kw)
    want = {name: exact_param_shard(t, (1, 2), **kw)  # the last shard: it keeps the records
            for name, t in (("small", small), ("large", large))}
    before = set(glob.glob("/dev/shm/psm_*"))

    def send(task, run):
        return workers_mod._shard_in_worker(exact_param_shard, task, {"param_shard": (1, 2)},
                                            kw, run,
                                            workers_mod._busy())[1]

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
        held = workers_mod._unpack(first)
        assert same(held, want["small"])
        assert not held.window_tables["token_fisher"].flags.owndata  # read in place
        with pytest.raises(FileNotFoundError):  # the caller removed the name when it mapped
            shared_memory.SharedMemory(name=name)
        workers_mod._unpack(second)
        del second  # its arrays gone: slot 1 is free again
        assert workers_mod._busy() == {name}
        part = held.window_tables["token_fisher"][:, 1:3]  # a view of one table
        expect = part.copy()
        del held, first  # the view alone still reads the block: it stays held
        assert workers_mod._busy() == {name}
        again = send(small, 2)  # slot 0's block backs `part`: another block
        assert again.shared[1] == slots[0] and again.shared[0] != name
        name = again.shared[0]
        assert same(workers_mod._unpack(again), want["small"])
        assert np.array_equal(part, expect)  # untouched by the run after it
        del part, again
        assert workers_mod._busy() == frozenset()
        third = send(small, 3)  # nothing held: written into the block of run 2 (listed first)
        assert (third.shared[0], third.shared[1]) == (name, slots[0])
        assert same(workers_mod._unpack(third), want["small"])
        del third
        assert [m.name for m in workers_mod._BLOCKS["mem"][0]] == [name]  # the other: given up
        size = workers_mod._BLOCKS["mem"][0][0].size
        for run, need, kept in ((4, size, True), (5, size // 4, True), (6, size // 4 - 1, False),
                                (7, size + 1, False)):
            mem, j = workers_mod._block(run, need)
            assert j == 0 and (mem.name == name) == kept and mem.size >= need, (run, need)
            name = mem.name
        other = send(large, 8)  # written into slot 0's block of run 7, or a new one
        other_name, slot, _, kept = other.shared
        assert kept == (other_name,)
        assert slot == slots[0]
        assert same(workers_mod._unpack(other), want["large"])
        assert set(workers_mod._ATTACHED[slot]) == {other_name}  # mapped anew, the old let go
        assert set(workers_mod._ATTACHED) == {slots[0], slots[1]}
        assert set(glob.glob("/dev/shm/psm_*")) <= before
    finally:
        workers_mod._drop_blocks()
        workers_mod._close_attached()
    assert workers_mod._ATTACHED == {} and workers_mod._BLOCKS["mem"] == []


def test_kept_pool_runs_leave_no_shared_memory_behind():
    """Runs of v16 on the kept pool: a run writes into the block of the run before once
    nothing holds that run's arrays (its per-state tables read, or the result dropped),
    into a new block while they are held; nothing is named in /dev/shm meanwhile, and
    shutdown drops the mappings. Every run gives the single run."""
    import glob
    task = load_scale_config("v16")
    before = set(glob.glob("/dev/shm/psm_*"))
    single = exact(task, workers=1, progress=False)
    names = []

    def run():
        r = exact(task, workers=2, progress=False)
        (maps,) = workers_mod._ATTACHED.values()  # one worker, one slot
        names.append(set(maps))
        assert set(glob.glob("/dev/shm/psm_*")) <= before
        return r

    held = run()
    fresh = run()  # held's tables are read in place from the first block: another one
    assert len(names[0]) == 1 and len(names[1]) == 2 and names[0] < names[1]
    for r in (held, fresh):
        assert max(merged_errors(r, single).values()) <= RTOL  # reads every per-state array
    again = run()  # the per-state arrays were gathered: no table is held, the last reused
    assert names[2] == names[1] - names[0]
    turn = run()  # `again` holds its tables: another block, kept beside it
    assert len(names[3]) == 2 and names[2] < names[3]
    del again
    last = run()  # `turn` held, `again` gone: the two blocks take turns, no third
    assert names[4] == names[3]
    for r in (turn, last):
        assert max(merged_errors(r, single).values()) <= RTOL
    workers_mod.shutdown()
    assert workers_mod._ATTACHED == {}


def test_workers_with_tables_past_the_shared_size_give_the_single_run():
    """v16's per-window tables of a parameter shard (4 MiB each) come back through shared
    memory from the worker: the merged run equals the single one."""
    task = load_scale_config("v16")
    single, par = exact(task, workers=1, progress=False), exact(task, workers=2, progress=False)
    errs = merged_errors(par, single)
    assert max(errs.values()) <= RTOL, errs
    # the worker's half of a per-window table is past the size sent through shared memory
    half = exact_param_shard(task, (0, 2), options=EngineOptions(keep_states=True))
    assert half.window_tables["token_fisher"].nbytes >= workers_mod.SHARED_BYTES


def test_a_failed_run_frees_the_shared_memory_of_results_that_came_back(monkeypatch):
    """A result a failed run will not read is unpacked only to free its block."""
    from concurrent.futures import Future
    from multiprocessing import shared_memory
    task = load_config("default")
    monkeypatch.setattr(workers_mod, "SHARED_BYTES", 1)
    sent = workers_mod._shard_in_worker(exact_param_shard, task, {"param_shard": (1, 2)},
                                        with_options(dict(progress=False, keep_states=True)))
    name = sent[1].shared[0]
    done, failed, pending = Future(), Future(), Future()
    done.set_result(sent)
    failed.set_exception(ValueError("shard 2"))
    workers_mod._free({done: 1, failed: 2, pending: 3})
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
    assert not hasattr(sent, "shared")
