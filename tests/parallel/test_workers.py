"""The shards of one exact run in local worker processes (fisher_ref.parallel.workers):
the same result as one process, one BLAS thread each, one shard in the calling process,
'auto' sized by the cost, the cores and the memory limit, a dead worker named by its
shard, a broken kept pool replaced, and tasks the workers cannot receive refused."""
import os
import subprocess
import sys

import pytest

from fisher_ref import load_config
from fisher_ref.parallel import worker_memory, workers as workers_mod
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


def test_explicit_workers_are_capped_at_the_useful_count_with_a_warning(monkeypatch):
    """issue 46 item 14: workers=1000 on a 0.1 s task started 118 processes on 2 cores
    without a word. The count is capped at the cores this process may run on and at one
    parameter per worker, with a warning naming the cap and why (no process is started
    here but the one of the last check)."""
    import warnings
    task, options = load_config("default"), EngineOptions()
    P = task.model.num_params
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 3)
    with pytest.warns(UserWarning, match=r"workers=1000 capped at 3: this process may run on "
                                         r"3 cores"):
        assert workers_mod.local_workers(task, 1000, options) == 3
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 10 * P)
    with pytest.warns(UserWarning, match=rf"workers=1000 capped at {P}: the model has {P} "
                                         r"parameters"):
        assert workers_mod.local_workers(task, 1000, options) == P
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a count within both caps: not a word
        assert workers_mod.local_workers(task, 3, options) == 3
    monkeypatch.setattr(workers_mod, "available_cores", lambda: 2)
    with pytest.warns(workers_mod.WorkersCapped, match="capped at 2"):
        assert exact(task, progress=False, workers=5).cost.workers == 2


def test_workers_give_the_single_run():
    """Two local processes (spawned, one BLAS thread each): the same result."""
    task = load_config("offpolicy_stale")
    kw = dict(progress=False, topk=(1, 2))
    single = exact(task, workers=1, **with_options(kw))
    par = exact(task, workers=2, **with_options(kw))
    errs = merged_errors(par, single)
    assert max(errs.values()) <= RTOL, errs
    assert par.cost.workers == 2


def test_only_the_workers_shards_are_checked_by_their_checksum(monkeypatch):
    """The caller hashes one payload per worker's shard (issue 46 item 9's checksum, checked
    at the merge), and none for its own shard, which it makes and merges itself."""
    from fisher_ref.parallel.shard_result import ShardResult
    hashed, digest = [], ShardResult.digest
    monkeypatch.setattr(ShardResult, "digest", lambda self: hashed.append(self.shard)
                        or digest(self))
    exact(load_config("default"), progress=False, workers=2)
    assert hashed == [(0, 2)]


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
        (maps,) = worker_memory._ATTACHED.values()  # one worker, one slot
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
    assert worker_memory._ATTACHED == {}


def test_workers_with_tables_past_the_shared_size_give_the_single_run():
    """v16's per-window tables of a parameter shard (4 MiB each) come back through shared
    memory from the worker: the merged run equals the single one."""
    task = load_scale_config("v16")
    single, par = exact(task, workers=1, progress=False), exact(task, workers=2, progress=False)
    errs = merged_errors(par, single)
    assert max(errs.values()) <= RTOL, errs
    # the worker's half of a per-window table is past the size sent through shared memory
    half = exact_param_shard(task, (0, 2), options=EngineOptions(keep_states=True))
    assert half.window_tables["token_fisher"].nbytes >= worker_memory.SHARED_BYTES


def test_a_failed_run_frees_the_shared_memory_of_results_that_came_back(monkeypatch):
    """A result a failed run will not read is unpacked only to free its block."""
    from concurrent.futures import Future
    from multiprocessing import shared_memory
    task = load_config("default")
    monkeypatch.setattr(worker_memory, "SHARED_BYTES", 1)
    sent = 0.1, worker_memory.share(exact_param_shard(task, (1, 2),
                                                      options=EngineOptions(keep_states=True)))
    name = sent[1].shared[0]
    done, failed, pending = Future(), Future(), Future()
    done.set_result(sent)
    failed.set_exception(ValueError("shard 2"))
    workers_mod._free({done: 1, failed: 2, pending: 3})
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)
    assert not hasattr(sent, "shared")
