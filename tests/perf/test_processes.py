"""How bench runs a side (fisher_ref.perf.processes): the memory conditions' environment,
and a side's process that fails or dies is an error, not a hang."""
import fisher_ref.perf.processes as processes
import pytest


def test_condition_env_sets_or_unsets_the_variables(monkeypatch):
    import os
    monkeypatch.setitem(os.environ, "MALLOC_MMAP_THRESHOLD_", "5")
    monkeypatch.setitem(os.environ, "OMP_NUM_THREADS", "7")
    plain, kept = processes.condition_env(False, 1), processes.condition_env(True, 2)
    assert "MALLOC_MMAP_THRESHOLD_" not in plain and plain["OMP_NUM_THREADS"] == "1"
    assert all(kept[k] == v for k, v in processes.KEEP_MEMORY.items())
    assert all(kept[k] == "2" for k in processes.THREAD_VARS)
    assert processes.condition_env(False, 0)["OMP_NUM_THREADS"] == "7"  # 0: threads left alone


def test_failure_inside_a_measurement_process_is_reported():
    import pickle
    with pytest.raises(processes.MeasurementFailed, match="'fisher_ref' failed in its process"):
        processes.SideProcess("fisher_ref", pickle.dumps(None), 1)  # exact(None) raises in the worker


class _ExitOnLoad:
    """Unpickled, it ends the process at once (as a crash or the OOM killer would)."""

    def __reduce__(self):
        import os
        return os._exit, (3,)


def test_a_measurement_process_that_dies_is_an_error_not_a_hang():
    """Were the parent to hold the child's end of the pipe, recv() would block for ever: a
    watchdog ends the test with a failure instead."""
    import pickle
    import signal

    def hung(*_):
        raise AssertionError("SideProcess waited for a dead process for 120 s")
    old = signal.signal(signal.SIGALRM, hung)
    signal.alarm(120)
    try:
        with pytest.raises(processes.MeasurementFailed,
                           match=r"ended without an answer \(exit code 3\)"):
            processes.SideProcess("fisher_ref", pickle.dumps(_ExitOnLoad()), 1)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
