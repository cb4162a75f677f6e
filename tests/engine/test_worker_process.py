"""What a worker process runs (fisher_ref.engine.worker_process): its shard, timed, with
its large arrays moved to shared memory; one BLAS thread; and an end of its own, with
nothing left behind, when the process that started it is killed."""
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fisher_ref import load_config
from fisher_ref.engine import worker_memory
from fisher_ref.engine.fast import exact
from fisher_ref.engine.worker_process import shard_in_worker

#: How long the workers of a killed caller may take to end and free what they held.
GONE_WITHIN_S = 10.0


def test_a_shard_in_a_worker_is_timed_and_its_arrays_shared(monkeypatch):
    task = load_config("default")
    monkeypatch.setattr(worker_memory, "SHARED_BYTES", 1)
    seconds, sent = shard_in_worker(exact, task, {"param_shard": (1, 2)},
                                    dict(progress=False, keep_states=True))
    assert seconds > 0 and sent.shared[1] is None  # no run number: a block of its own
    worker_memory.unpack(sent)  # read back, and the block freed


def _stall(prompt, response):
    """A reward that, in a worker process, says so (a file named by FISHER_REF_TEST_MARK)
    and then takes longer than any test waits: the worker is busy when its caller dies."""
    import multiprocessing
    if multiprocessing.parent_process() is not None:
        Path(os.environ["FISHER_REF_TEST_MARK"]).touch()
        time.sleep(120)
    return float(len(response))


CALLER = """
from fisher_ref import load_config
from fisher_ref.engine.fast import exact
from fisher_ref.rewards import FunctionReward
from tests.engine.test_worker_process import _stall
exact(load_config("default").with_(reward=FunctionReward(_stall)), workers=2, progress=False)
"""


def _shm_held(procs):
    """The /dev/shm names (semaphores, shared-memory blocks) that ``procs`` map."""
    names = set()
    for p in procs:
        try:
            maps = Path(f"/proc/{p.pid}/maps").read_text()
        except OSError:
            continue
        names |= {line.split()[-1] for line in maps.splitlines()
                  if "/dev/shm/" in line and not line.endswith("(deleted)")}
    return names


def _alive(procs):
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            pass
    return out


def test_workers_of_a_killed_caller_end_and_leave_nothing_behind(tmp_path):
    """issue 46 item 13: the caller of a workers=2 run killed with SIGKILL while its worker
    runs a shard: within GONE_WITHIN_S, no process it started is left (the worker, the
    resource tracker), and no /dev/shm entry any of them mapped."""
    mark = tmp_path / "worker_started"
    env = dict(os.environ, PYTHONPATH=os.getcwd(), FISHER_REF_TEST_MARK=str(mark))
    caller = subprocess.Popen([sys.executable, "-c", CALLER], env=env, cwd=os.getcwd(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = []
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert caller.poll() is None, caller.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the worker never started its shard"
            time.sleep(0.05)
        started = psutil.Process(caller.pid).children(recursive=True)
        assert started, "no process started by the caller"
        held = _shm_held([psutil.Process(caller.pid), *started])
        assert any("/sem." in n for n in held), held  # the pool's queues: their semaphores
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)
        end = time.monotonic() + GONE_WITHIN_S
        while (_alive(started) or any(map(os.path.exists, held))) and time.monotonic() < end:
            time.sleep(0.1)
        left = [(p.pid, " ".join(p.cmdline())[-80:]) for p in _alive(started)]
        assert not left, f"processes left {GONE_WITHIN_S} s after the caller was killed: {left}"
        shm = sorted(n for n in held if os.path.exists(n))
        assert not shm, f"/dev/shm entries left {GONE_WITHIN_S} s after the kill: {shm}"
    finally:  # whatever the test found, nothing it started outlives it
        for p in _alive(started):
            p.kill()
        if caller.poll() is None:
            caller.kill()
