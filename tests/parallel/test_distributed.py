"""fisher_ref.parallel.distributed.exact_ray on a local Ray (two CPUs), against exact(task) here.

Ray is started once for the module. Every merged run is held to a single run of the
fast engine at 1e-12 (tests/parallel/test_shards.py's measure), including a run in which
one shard's worker process dies on its first attempt (``os._exit``, remembered by a
marker file, so that the retry succeeds); a shard that always fails ends the run with
an error naming it, after exactly ``max_retries + 1`` attempts, and no result.
"""
import os

import pytest

# the distributed extra; CI installs it and fails on any skip
ray = pytest.importorskip("ray", reason="needs ray: pip install -e \".[distributed]\"")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.engine.plan import EngineOptions  # noqa: E402
from fisher_ref.parallel.distributed import ShardFailed, exact_ray  # noqa: E402
from fisher_ref.parallel.run import exact  # noqa: E402

from tests.parallel.test_shards import RTOL, merged_errors


@pytest.fixture(scope="module")
def local_ray():
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield
    ray.shutdown()


def single(task, **kw):
    return exact(task, progress=False, workers=1,
                 options=EngineOptions(keep_states=False, keep_sequences=False), **kw)


def assert_same(merged, one):
    errs = merged_errors(merged, one)
    assert max(errs.values()) <= RTOL, {k: e for k, e in errs.items() if e > RTOL}


def test_ray_shards_give_the_single_run(local_ray):
    task = load_config("offpolicy_temperature")
    assert_same(exact_ray(task, shards=3, topk=(1, 2)), single(task, topk=(1, 2)))


def test_ray_keeps_the_arrays_when_asked(local_ray):
    task = load_config("weighted_prompts")
    merged = exact_ray(task, keep_states=True, keep_sequences=True)  # shards: the cluster's CPUs
    one = exact(task, progress=False, workers=1,
                options=EngineOptions(keep_states=True, keep_sequences=True))
    assert_same(merged, one)
    assert merged.states is not None and merged.sequences is not None


def _runner_dying_once(marker):
    def run(task, shard, options):
        if shard[0] == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os._exit(7)  # the worker process dies mid-run
        from fisher_ref.parallel import exact_shard
        return exact_shard(task, shard, options=options)
    return run


def test_a_killed_worker_is_retried(local_ray, tmp_path):
    marker = str(tmp_path / "killed")
    task = load_config("default")
    merged = exact_ray(task, shards=3, max_retries=2, runner=_runner_dying_once(marker))
    assert os.path.exists(marker)  # shard 1's first attempt did die
    assert_same(merged, single(task))


def _runner_failing(log, bad):
    def run(task, shard, options):
        if shard[0] == bad:
            with open(log, "a") as f:
                f.write("attempt\n")
            raise RuntimeError(f"shard {shard} cannot run")
        from fisher_ref.parallel import exact_shard
        return exact_shard(task, shard, options=options)
    return run


def test_a_shard_failing_for_good_is_an_error_naming_it(local_ray, tmp_path):
    log = str(tmp_path / "attempts")
    with pytest.raises(ShardFailed, match=r"shard 2 of 3 failed after 2 attempt") as info:
        exact_ray(load_config("default"), shards=3, max_retries=1, runner=_runner_failing(log, 2))
    assert info.value.shard == (2, 3)
    assert open(log).read().count("attempt") == 2  # max_retries + 1 attempts


@pytest.mark.parametrize("kw, field", [({"shards": 0}, "shards"), ({"max_retries": -1},
                                                                    "max_retries")])
def test_bad_arguments_are_refused(kw, field):
    with pytest.raises(ValueError, match=field):
        exact_ray(load_config("default"), **kw)


def test_the_cost_guard_counts_the_shards_side_by_side(local_ray, monkeypatch):
    """A run too slow for one core but not for its shards side by side goes through; one
    whose single worker needs more memory than allowed is refused before any task runs."""
    from fisher_ref import EnumerationTooLarge, estimate_cost
    from fisher_ref.engine import plan as plan_mod
    monkeypatch.setattr(plan_mod, "_SECONDS_PER_WORKER", 0.0)  # a tiny task: no start cost
    task = load_config("default")
    one, two = estimate_cost(task), estimate_cost(task, workers=2)
    limit = (one.seconds + two.seconds) / 2
    assert two.seconds < limit < one.seconds
    with pytest.raises(EnumerationTooLarge):
        exact(task, progress=False, workers=1, options=EngineOptions(max_seconds=limit))
    assert_same(exact_ray(task, shards=2, max_seconds=limit), single(task))
    with pytest.raises(EnumerationTooLarge, match="memory"):
        exact_ray(task, shards=2, max_bytes=one.bytes / 2)


def _unused_port():
    """A local port nothing listens on: bound, then let go."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_address_where_nothing_answers_fails_in_bounded_time():
    """issue 46 item 19: exact_ray(address="127.0.0.1:1") had returned nothing after 452 s
    (Ray retries without end). An address that refuses connections fails at once, and one
    that accepts but does not answer as a Ray cluster within connect_timeout, then: a
    ConnectionError naming the address either way."""
    import socket
    import time
    task = load_config("default")
    address = f"127.0.0.1:{_unused_port()}"
    t0 = time.monotonic()
    with pytest.raises(ConnectionError, match=f"nothing accepts a connection at address "
                                              f"'{address}'"):
        exact_ray(task, address=address, connect_timeout=5)
    with pytest.raises(ConnectionError, match=f"'ray://{address}'"):
        exact_ray(task, address=f"ray://{address}", connect_timeout=5)
    assert time.monotonic() - t0 < 10
    with socket.socket() as mute:  # accepts, and never says a word
        mute.bind(("127.0.0.1", 0))
        mute.listen()
        address = f"127.0.0.1:{mute.getsockname()[1]}"
        t0 = time.monotonic()
        with pytest.raises(ConnectionError, match=f"at address '{address}' accepts connections "
                                                  r"but did not answer .* within "
                                                  r"connect_timeout=2 s"):
            exact_ray(task, address=address, connect_timeout=2)
        assert time.monotonic() - t0 < 10


@pytest.mark.parametrize("kw, field", [(dict(address=5), "address"),
                                       (dict(address=b"127.0.0.1:1"), "address"),
                                       (dict(connect_timeout=0), "connect_timeout"),
                                       (dict(connect_timeout=float("inf")), "connect_timeout"),
                                       (dict(connect_timeout="30"), "connect_timeout")])
def test_bad_address_or_timeout_is_refused_by_name(kw, field):
    """issue 46 item 19: exact_ray(address=5) raised Ray's own "argument of type 'int' is not
    iterable"."""
    with pytest.raises(ValueError, match=f"exact_ray: {field} must be"):
        exact_ray(load_config("default"), **kw)


def test_the_address_check_knows_a_ray_cluster(local_ray):
    """The check exact_ray makes of an address passes for the GCS of a running Ray (the
    one it would join), so that only addresses where no cluster answers are refused."""
    from fisher_ref.parallel.distributed import check_address
    gcs = ray.get_runtime_context().gcs_address
    check_address(gcs, 10)
    check_address(f"ray://{gcs}", 10)  # the same server: the check reads host:port
    task = load_config("default")
    assert_same(exact_ray(task, address=gcs, shards=2), single(task))
