"""The side-by-side benchmark (fisher_ref.perf.bench); wall times are never asserted. Its
command line is tested in tests/cli/test_bench.py."""
import platform

import pytest

torch = pytest.importorskip("torch", reason="bench times the torch engine (the torch extra)")

import fisher_ref.perf.processes as processes  # noqa: E402
from fisher_ref import load_config  # noqa: E402
from fisher_ref.perf.bench import MEASUREMENTS, bench, format_table  # noqa: E402
from fisher_ref.perf.memory import MemoryConditionError  # noqa: E402
from fisher_ref.rewards import FunctionReward  # noqa: E402

pytestmark = pytest.mark.torch
#: keep_memory sets glibc's malloc variables; elsewhere bench refuses it (tested below)
glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc",
                                reason="keep_memory sets glibc's malloc variables")


def test_bench_isolates_each_side_with_pinned_threads_and_reports_them():
    res = bench(load_config("no_eos"), repeats=2, names=["fisher_ref", "torch_cpu_float64"],
                threads=1)
    assert res["isolated"] and res["threads"] == 1
    assert set(res["times"]) == {"fisher_ref", "torch_cpu_float64"}
    assert all(len(t) == 2 and min(t) > 0 for t in res["times"].values())
    r = res["ratio"]["torch_cpu_float64"]
    assert r == pytest.approx(res["median"]["fisher_ref"] / res["median"]["torch_cpu_float64"])
    assert res["ratio_min"]["torch_cpu_float64"] == pytest.approx(
        res["min"]["fisher_ref"] / res["min"]["torch_cpu_float64"])
    assert len(res["loadavg"]) == 3 and all(len(x) == 3 for x in res["loadavg"])
    torch_env, np_env = res["env"]["torch_cpu_float64"], res["env"]["fisher_ref"]
    assert torch_env["torch_threads"] == 1 and np_env["torch_threads"] is None
    for e in (torch_env, np_env):
        assert e["max_rss_bytes"] > 0
        assert e["blas_source"] == "threadpoolctl" and e["blas"]
        assert all(p["threads"] == 1 for p in e["blas"]), e["blas"]
    table = format_table(res)
    assert "ratio fisher_ref/torch_cpu_float64 = " in table and "load average" in table


def test_unpicklable_task_is_timed_in_process_with_threads_restored():
    task = load_config("no_eos")
    task = task.with_(reward=FunctionReward(lambda p, r: float(len(r))))
    before = torch.get_num_threads()
    res = bench(task, repeats=1, names=["fisher_ref", "torch_cpu_float64"], threads=1)
    assert not res["isolated"] and res["env"]["torch_cpu_float64"]["torch_threads"] == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="isolate=True needs a task that can be pickled"):
        bench(task, repeats=1, names=["fisher_ref"], isolate=True)


def test_gpt2_config_benches_against_the_transformers_adapter():
    res = bench(load_config("gpt2_small"), repeats=1, names=["fisher_ref", "torch_cpu_float64"])
    assert res["ratio"]["torch_cpu_float64"] > 0


def test_numpy_sides_run_without_torch():
    res = bench(load_config("default"), repeats=1, names=["fisher_ref", "fisher_ref_fisher"],
                threads=1)
    assert res["isolated"]
    assert all(res["env"][n]["torch_threads"] is None for n in res["env"])


@glibc_only
def test_each_run_counts_its_page_faults_and_kept_memory_reaches_each_process(monkeypatch):
    """Every round records each side's minor page faults and kernel seconds; with
    keep_memory the processes start with glibc's variables set, and a side that allocates
    tens of MB per run (medium) stops faulting its pages in again on every run."""
    import os
    from fisher_ref.perf.scaling import load_scale_config
    task = load_scale_config("medium")
    monkeypatch.setitem(os.environ, "MALLOC_TRIM_THRESHOLD_", processes.KEEP_MEMORY[
        "MALLOC_TRIM_THRESHOLD_"])  # set here: the plain sides still get the defaults
    plain = bench(task, repeats=3, names=["fisher_ref"], threads=1)
    kept = bench(task, repeats=3, names=["fisher_ref"], threads=1, keep_memory=True)
    for res in (plain, kept):
        k = res["kernel"]["fisher_ref"]
        assert len(k["page_faults"]) == len(k["seconds"]) == 3
        assert all(isinstance(x, int) and x >= 0 for x in k["page_faults"])
        assert all(x >= 0 for x in k["seconds"])
        assert "faults/run" in format_table(res)
    assert not plain["keep_memory"] and kept["keep_memory"]
    assert kept["env"]["fisher_ref"]["malloc"] == processes.KEEP_MEMORY
    assert plain["env"]["fisher_ref"]["malloc"] == dict.fromkeys(processes.KEEP_MEMORY)
    assert "freed memory kept" in format_table(kept)
    # the allocator, probed in a process started as the sides are
    assert kept["freed_memory_reused"] is True and plain["freed_memory_reused"] is False
    assert "block kept and reused in a process started as" in format_table(kept)
    assert "block handed back in a process started as" in format_table(plain)
    # kept: once the heap has grown to the run's peak (a round or two) no page is fresh
    # (0-3 faults here); plain: 3,300-7,100 a run (three trials of 3 rounds each)
    faults = [min(r["kernel"]["fisher_ref"]["page_faults"]) for r in (plain, kept)]
    assert faults[1] * 10 < faults[0], faults


@glibc_only
def test_keep_memory_that_the_allocator_ignores_is_an_error(monkeypatch):
    """A glibc that refuses the mmap threshold (some cap it at 32 MiB) hands freed blocks
    back even with the variables set; the run must not be recorded as kept memory. A
    threshold of 1 MiB stands in for a refused one: the probe's 64 MiB block lies above it."""
    monkeypatch.setattr(processes, "KEEP_MEMORY", {"MALLOC_MMAP_THRESHOLD_": str(2 ** 20),
                                            "MALLOC_TRIM_THRESHOLD_": str(2 ** 62)})
    with pytest.raises(MemoryConditionError, match="asks for kept memory, but a process started "
                                                   "alike handed a freed 64 MiB block back"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"], keep_memory=True)


@glibc_only
def test_default_memory_that_the_environment_keeps_is_an_error(monkeypatch):
    """A setting of the user's own (here MALLOC_TOP_PAD_: a gigabyte kept at the top of the
    heap) makes the allocator keep freed memory: a run recorded as the C library's default
    would have measured kept memory."""
    import os
    monkeypatch.setitem(os.environ, "MALLOC_TOP_PAD_", str(2 ** 30))
    with pytest.raises(MemoryConditionError, match="asks for the C library's default, but a "
                                                   "process started alike kept a freed 64 MiB"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"])


@glibc_only
def test_in_process_the_probe_sees_the_settings_this_process_started_with():
    """glibc reads its settings when a process starts: an in-process bench is checked
    against those, not against os.environ as changed since (either way round)."""
    import os
    import subprocess
    import sys
    code = ("import os\n"
            "from fisher_ref import load_config\n"
            "from fisher_ref.perf.bench import bench\n"
            "from fisher_ref.perf.memory import MemoryConditionError\n"
            "os.environ.pop('MALLOC_TOP_PAD_', None)  # gone from os.environ, not from glibc\n"
            "try:\n"
            "    bench(load_config('no_eos'), repeats=1, names=['fisher_ref'], isolate=False)\n"
            "    print('no error')\n"
            "except MemoryConditionError as exc:\n"
            "    print(exc)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env={**env, "MALLOC_TOP_PAD_": str(2 ** 30)})
    assert "bench in-process asks for the C library's default" in out.stdout, out.stderr
    # and a setting added after start changes nothing: the default holds
    code = code.replace("os.environ.pop('MALLOC_TOP_PAD_', None)",
                        "os.environ['MALLOC_TOP_PAD_'] = str(2 ** 30)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=300, env=env)
    assert out.stdout.strip().endswith("no error"), (out.stdout, out.stderr)


def test_the_probe_leaves_the_sides_peak_memory_alone():
    """The allocator probe touches 64 MiB twice: it runs in a process of its own, so a
    side's peak RSS is what its own work needs (measured alike in a child: within 16 MiB;
    measured 56.9 against 57.3 MiB)."""
    import subprocess
    import sys
    child = ("from fisher_ref import load_config\n"
             "from fisher_ref.perf.bench import MEASUREMENTS\n"
             "from fisher_ref.perf.memory import peak_rss_bytes\n"
             "fn = MEASUREMENTS['fisher_ref'](load_config('no_eos'))\n"
             "fn(); fn(); fn()\n"
             "print(peak_rss_bytes())\n")
    own = int(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                             check=True, timeout=300).stdout.split()[-1])
    res = bench(load_config("no_eos"), repeats=2, names=["fisher_ref"])
    assert res["env"]["fisher_ref"]["max_rss_bytes"] < own + 16 * 2 ** 20, (
        res["env"]["fisher_ref"]["max_rss_bytes"], own)


@glibc_only
def test_keep_memory_needs_a_process_per_side():
    with pytest.raises(ValueError, match="needs one process per measurement"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"], isolate=False,
              keep_memory=True)
    with pytest.raises(ValueError, match="keep_memory must be True or False"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"], keep_memory="yes")
    task = load_config("no_eos").with_(reward=FunctionReward(lambda p, r: float(len(r))))
    with pytest.raises(ValueError, match="keep_memory=True needs a task that can be pickled"):
        bench(task, repeats=1, names=["fisher_ref"], keep_memory=True)


def test_keep_memory_is_refused_on_another_c_library(monkeypatch):
    monkeypatch.setattr(platform, "libc_ver", lambda *a, **k: ("", ""))  # musl, macOS
    with pytest.raises(ValueError, match="runs on another C library"):
        bench(load_config("no_eos"), repeats=1, names=["fisher_ref"], keep_memory=True)


@pytest.mark.parametrize("kwargs, match", [
    (dict(repeats=0), "repeats must be a positive integer"),
    (dict(repeats=1, threads=-1), "threads must be a non-negative integer"),
    (dict(repeats=1, names=["fisher_ref", "jax"]), "unknown measurements"),
])
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        bench(load_config("no_eos"), **kwargs)
