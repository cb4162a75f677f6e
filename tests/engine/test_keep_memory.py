"""fisher_ref.engine.keep_memory.keep_freed_memory: glibc told, in this process, to keep the
memory it frees.

The calls that take effect run in a child process: mallopt changes a process for good, and
the test process's own allocator stays as it started."""
import ctypes
import json
import platform
import subprocess
import sys

import numpy as np
import pytest

from fisher_ref import load_config
from fisher_ref.engine import keep_memory as keep_mod
from fisher_ref.perf.bench import bench, condition_env
from fisher_ref.perf.memory import MemoryConditionError
from fisher_ref.engine.plan import EngineOptions

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")


@pytest.fixture(autouse=True)
def _nothing_kept_here(monkeypatch):
    """What a test's calls record in this process is undone after it."""
    monkeypatch.setattr(keep_mod, "_KEPT", None)

#: A child in glibc's default memory: the probe's answer before and after the call, what the
#: call returned and recorded, and the page faults of repeated runs of exact on medium.
CHILD = r"""
import json, resource
import fisher_ref
from fisher_ref.engine.keep_memory import keep_freed_memory, kept_in_process
from fisher_ref.perf.memory import freed_memory_reused
from fisher_ref.perf.scaling import load_scale_config

task = load_scale_config("medium")

def faults(runs=5):
    out = []
    for _ in range(runs):
        r0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        fisher_ref.exact(task, progress=False, workers=1)
        out.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - r0)
    return sorted(out)[len(out) // 2]

fisher_ref.exact(task, progress=False, workers=1)  # first touches: not counted
before = [freed_memory_reused(), faults()]
took = keep_freed_memory()
fisher_ref.exact(task, progress=False, workers=1)  # the heap grows to its peak once more
print(json.dumps({"before": before, "took": took, "kept": kept_in_process(),
                  "after": [freed_memory_reused(), faults()]}))
"""


@glibc_only
def test_keep_freed_memory_keeps_a_freed_block_and_stops_the_faults_of_repeated_runs():
    out = subprocess.run([sys.executable, "-c", CHILD], env=condition_env(False),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["took"] is True and r["kept"] == [2 ** 30, 2 ** 31 - 1], r
    assert r["before"][0] is False and r["after"][0] is True, r  # the probe, 64 MiB block
    # medium frees its temporaries at the end of every run: glibc's defaults fault most of
    # them in again in most runs (medians of five 3,000-8,800 pages here in 22 children),
    # kept, the next runs reuse them (0 in every child)
    assert r["after"][1] * 4 < r["before"][1], r


@pytest.mark.parametrize("kw", [{"max_block": 0}, {"max_block": 2 ** 31}, {"max_kept": -1},
                                {"max_kept": True}, {"max_block": 1.5}, {"max_block": "1"},
                                {"max_block": np.int64(2 ** 31)}])
def test_keep_freed_memory_refuses_what_mallopt_cannot_take(kw, monkeypatch):
    monkeypatch.setattr(ctypes, "CDLL", lambda *a: pytest.fail("mallopt reached"))
    name = next(iter(kw))
    with pytest.raises(ValueError, match=f"{name} must be an int in 1..2"):
        keep_mod.keep_freed_memory(**kw)
    assert keep_mod.kept_in_process() is None


def _libc(monkeypatch, answer):
    """A C library whose ``mallopt(param, value)`` returns ``answer(param, value)``; the
    calls are listed."""
    calls = []

    class Lib:
        @staticmethod
        def mallopt(param, value):
            calls.append((param, value))
            return answer(param, value)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a: Lib())
    return calls


MMAP, TRIM = -3, -1  # M_MMAP_THRESHOLD, M_TRIM_THRESHOLD


def test_keep_freed_memory_takes_numpy_integers_and_records_a_half_taken_call(monkeypatch):
    calls = _libc(monkeypatch, lambda param, value: int(param == MMAP))  # refuses the trim
    assert keep_mod.keep_freed_memory(np.int64(2 ** 25), np.int32(2 ** 30)) is False
    assert calls == [(MMAP, 2 ** 25), (TRIM, 2 ** 30)]
    assert keep_mod.kept_in_process() == (2 ** 25, None)  # changed, so not the default


def test_keep_freed_memory_caps_the_block_where_an_older_glibc_refuses_more(monkeypatch):
    calls = _libc(monkeypatch, lambda param, value: int(param == TRIM or value <= 2 ** 25))
    assert keep_mod.keep_freed_memory() is True
    assert calls == [(MMAP, 2 ** 30), (MMAP, 2 ** 25), (TRIM, 2 ** 31 - 1)]
    assert keep_mod.kept_in_process() == (2 ** 25, 2 ** 31 - 1)


def test_keep_freed_memory_refused_whole_records_nothing(monkeypatch):
    calls = _libc(monkeypatch, lambda param, value: 0)
    assert keep_mod.keep_freed_memory(2 ** 20, 2 ** 20) is False
    assert calls == [(MMAP, 2 ** 20), (TRIM, 2 ** 20)]  # a block under the cap: one try
    assert keep_mod.kept_in_process() is None


def test_keep_freed_memory_says_false_without_glibc(monkeypatch):
    def no_libc(*a):
        raise OSError("no such library")
    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    assert keep_mod.keep_freed_memory() is False
    assert keep_mod.kept_in_process() is None


def test_in_process_bench_after_keep_freed_memory_is_not_the_default_condition(monkeypatch):
    monkeypatch.setattr(keep_mod, "_KEPT", (2 ** 30, 2 ** 31 - 1))  # as after the call
    with pytest.raises(MemoryConditionError, match=r"this process changed its allocator "
                       r"settings \(keep_freed_memory\(\) set max_block=1073741824, "
                       r"max_kept=2147483647.*isolate=True"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"], isolate=False)


def _startup(monkeypatch, **env):
    monkeypatch.setattr(keep_mod, "startup_environ", lambda: dict(env))


@pytest.mark.parametrize("env, kept", [
    ({}, False),
    ({"MALLOC_MMAP_THRESHOLD_": "1073741824", "MALLOC_TRIM_THRESHOLD_": "2147483647"}, True),
    ({"MALLOC_MMAP_THRESHOLD_": str(2 ** 25), "MALLOC_TRIM_THRESHOLD_": str(2 ** 28)}, True),
    ({"MALLOC_MMAP_THRESHOLD_": str(2 ** 25 - 1), "MALLOC_TRIM_THRESHOLD_": str(2 ** 30)}, False),
    ({"MALLOC_MMAP_THRESHOLD_": str(2 ** 30), "MALLOC_TRIM_THRESHOLD_": str(2 ** 28 - 1)}, False),
    ({"MALLOC_TRIM_THRESHOLD_": str(2 ** 30)}, False),
    ({"MALLOC_MMAP_THRESHOLD_": "1g", "MALLOC_TRIM_THRESHOLD_": str(2 ** 30)}, False),
    ({"MALLOC_MMAP_THRESHOLD_": "0x40000000", "MALLOC_TRIM_THRESHOLD_": "0X80000000"}, True),
    ({"MALLOC_MMAP_THRESHOLD_": "1_073_741_824", "MALLOC_TRIM_THRESHOLD_": str(2 ** 30)}, False),
    ({"MALLOC_MMAP_THRESHOLD_": " 1073741824", "MALLOC_TRIM_THRESHOLD_": str(2 ** 30)}, False),
])
def test_memory_kept_reads_the_variables_the_process_started_with(env, kept, monkeypatch):
    _startup(monkeypatch, **env)
    assert keep_mod.memory_kept() is kept


@pytest.mark.parametrize("recorded, kept", [((2 ** 30, 2 ** 31 - 1), True), ((2 ** 25, 2 ** 30), True),
                                            ((2 ** 20, 2 ** 31 - 1), False), ((2 ** 30, 2 ** 20), False)])
def test_memory_kept_after_keep_freed_memory_follows_what_it_set(recorded, kept, monkeypatch):
    """The call's settings replace those of the start: small ones undo kept variables."""
    _startup(monkeypatch, MALLOC_MMAP_THRESHOLD_="1073741824", MALLOC_TRIM_THRESHOLD_="2147483647")
    monkeypatch.setattr(keep_mod, "_KEPT", recorded)
    assert keep_mod.memory_kept() is kept


@pytest.mark.parametrize("recorded, env_kept, kept", [
    ((2 ** 30, None), False, False), ((2 ** 30, None), True, True),
    ((1024, None), True, False), ((None, 2 ** 20), True, False), ((None, 2 ** 30), True, True)])
def test_a_half_taken_call_leaves_the_start_to_decide_the_other_setting(recorded, env_kept,
                                                                         kept, monkeypatch):
    """A call of which glibc refused a part changed only the part it took: that part is
    the call's, the other the start's."""
    monkeypatch.setattr(keep_mod, "_KEPT", recorded)
    if env_kept:
        _startup(monkeypatch, MALLOC_MMAP_THRESHOLD_="1073741824",
                 MALLOC_TRIM_THRESHOLD_="2147483647")
    else:
        _startup(monkeypatch)
    assert keep_mod.memory_kept() is kept


def test_memory_kept_is_false_outside_glibc(monkeypatch):
    _startup(monkeypatch, MALLOC_MMAP_THRESHOLD_="1073741824", MALLOC_TRIM_THRESHOLD_="2147483647")
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("", ""))
    assert keep_mod.memory_kept() is False


@pytest.mark.parametrize("quantities", ["all", "fisher"])
@pytest.mark.parametrize("kept", [False, True])
def test_the_last_level_takes_larger_sub_blocks_where_memory_is_kept(kept, quantities,
                                                                     monkeypatch):
    """With the default budget, medium's last level (1,331 parents) runs in two even
    sub-blocks in default memory (564 parents a budget's row: 2.4 rows, rounded to 2), and in one where freed memory is kept (a default run and
    a fisher-only one); an explicit budget is the same in both; the numbers are those of
    the other budget to 1e-12."""
    from fisher_ref.engine import complete, fast
    from fisher_ref.engine.plan import Budgets, KEPT_SUB_ELEMENTS, SUB_ELEMENTS
    from fisher_ref.perf.scaling import load_scale_config
    from tests.engine.test_fast import result_errors
    task, calls = load_scale_config("medium"), []
    where = "last_level_all" if quantities == "all" else "last_level_fisher"
    real = getattr(complete, where)

    def counted(*args):
        calls.append(len(args[6]))  # w (all) or W (fisher): a row per parent
        return real(*args)

    monkeypatch.setattr(complete, where, counted)
    monkeypatch.setattr(fast, "memory_kept", lambda: kept)
    got = fast.exact(task, progress=False, quantities=quantities)
    assert calls == ([1331] if kept else [665, 666]), calls
    calls.clear()
    other = fast.exact(task, progress=False, quantities=quantities,
                       options=EngineOptions(budgets=Budgets(
        sub_elements=SUB_ELEMENTS if kept else KEPT_SUB_ELEMENTS)))
    assert calls == ([665, 666] if kept else [1331]), calls
    errs = result_errors(got, other)
    assert all(e <= 1e-12 for e in errs.values()), errs


def test_budgets_sub_block_elements():
    from fisher_ref.engine.plan import Budgets, KEPT_SUB_ELEMENTS, SUB_ELEMENTS
    auto = Budgets()
    assert auto.sub_elements is None
    assert [auto.sub_block_elements(f, k) for f in (False, True) for k in (False, True)] == \
        [SUB_ELEMENTS, SUB_ELEMENTS, SUB_ELEMENTS, KEPT_SUB_ELEMENTS]
    assert {Budgets(sub_elements=7).sub_block_elements(f, k) for f in (0, 1) for k in (0, 1)} == {7}
