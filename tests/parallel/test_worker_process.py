"""What a worker process runs (fisher_ref.parallel.worker_process): its shard, timed, with
its large arrays moved to shared memory; one BLAS thread; and an end of its own, with
nothing left behind, when the process that started it is killed."""
import glob
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fisher_ref import load_config
from fisher_ref.engine.plan import EngineOptions
from fisher_ref.parallel import exact_param_shard, worker_memory
from fisher_ref.parallel.worker_process import shard_in_worker

#: How long the workers of a killed caller may take to end and free what they held.
GONE_WITHIN_S = 10.0


def test_a_shard_in_a_worker_is_timed_and_its_arrays_shared(monkeypatch):
    task = load_config("default")
    monkeypatch.setattr(worker_memory, "SHARED_BYTES", 1)
    seconds, sent = shard_in_worker(exact_param_shard, task, {"param_shard": (1, 2)},
                                    dict(options=EngineOptions(keep_states=True)))
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
from fisher_ref import exact
from fisher_ref.rewards import FunctionReward
from tests.parallel.test_worker_process import _stall
exact(load_config("default").with_(reward=FunctionReward(_stall)), workers=2, progress=False)
"""


def _stat(pid):
    """``(parent pid, state, start time)`` of process ``pid`` (``/proc/<pid>/stat``), or
    ``None`` once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return int(fields[1]), fields[0], int(fields[19])


def _started_by(pid):
    """The processes ``pid`` started, theirs too: ``{pid: start time}``."""
    kids = {}
    for d in Path("/proc").iterdir():
        st = _stat(d.name) if d.name.isdigit() else None
        if st is not None:
            kids.setdefault(st[0], []).append((int(d.name), st[2]))
    out, todo = {}, [pid]
    while todo:
        for child, start in kids.get(todo.pop(), []):
            out[child] = start
            todo.append(child)
    return out


def _alive(started):
    """Those of ``started`` (``{pid: start time}``) still running: not gone, not a zombie,
    not another process that took the pid since."""
    return [pid for pid, start in started.items()
            if (st := _stat(pid)) is not None and st[1] != "Z" and st[2] == start]


def _cmdline(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[-80:]
    except OSError:
        return "?"


def _shm_held(pids):
    """The /dev/shm names (semaphores, shared-memory blocks) that processes ``pids`` map."""
    names = set()
    for pid in pids:
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        names |= {line.split()[-1] for line in maps.splitlines()
                  if "/dev/shm/" in line and not line.endswith("(deleted)")}
    return names


def test_workers_of_a_killed_caller_end_and_leave_nothing_behind(tmp_path):
    """issue 46 item 13: the caller of a workers=2 run killed with SIGKILL while its worker
    runs a shard: within GONE_WITHIN_S, no process it started is left (the worker, the
    resource tracker; found in /proc), and no /dev/shm entry any of them mapped."""
    mark = tmp_path / "worker_started"
    env = dict(os.environ, PYTHONPATH=os.getcwd(), FISHER_REF_TEST_MARK=str(mark))
    caller = subprocess.Popen([sys.executable, "-c", CALLER], env=env, cwd=os.getcwd(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started = {}
    try:
        deadline = time.monotonic() + 120
        while not mark.exists():
            assert caller.poll() is None, caller.stderr.read().decode()[-2000:]
            assert time.monotonic() < deadline, "the worker never started its shard"
            time.sleep(0.05)
        started = _started_by(caller.pid)
        assert started, "no process started by the caller"
        held = _shm_held([caller.pid, *started])
        assert any("/sem." in n for n in held), held  # the pool's queues: their semaphores
        caller.send_signal(signal.SIGKILL)
        caller.wait(10)
        end = time.monotonic() + GONE_WITHIN_S
        while (_alive(started) or any(map(os.path.exists, held))) and time.monotonic() < end:
            time.sleep(0.1)
        left = [(pid, _cmdline(pid)) for pid in _alive(started)]
        assert not left, f"processes left {GONE_WITHIN_S} s after the caller was killed: {left}"
        shm = sorted(n for n in held if os.path.exists(n))
        assert not shm, f"/dev/shm entries left {GONE_WITHIN_S} s after the kill: {shm}"
    finally:  # whatever the test found, nothing it started outlives it
        for pid in _alive(started):
            os.kill(pid, signal.SIGKILL)
        if caller.poll() is None:
            caller.kill()
