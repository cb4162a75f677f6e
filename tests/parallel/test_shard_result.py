"""What a shard returns (fisher_ref.parallel.shard_result): small, picklable sums; the check
of (i, n); the task digest that keeps shards of different tasks apart."""
import pickle

import pytest

from fisher_ref import load_config
from fisher_ref.engine.fast import exact
from fisher_ref.parallel.shard_result import ShardResult, task_key
from fisher_ref.parallel.shards import merge
from fisher_ref.perf.scaling import load_scale_config
from fisher_ref.engine.plan import EngineOptions
from fisher_ref.parallel import exact_param_shard, exact_shard
from tests.parallel.test_shards import RTOL, merged_errors


def test_task_key_tells_tasks_apart():
    task = load_config("default")
    assert task_key(task) == task_key(load_config("default"))
    assert task_key(task) != task_key(task.with_(theta=task.theta + 1e-12))
    assert task_key(task) != task_key(load_config("no_eos"))


def test_shard_results_are_small_and_picklable():
    task = load_scale_config("medium").with_(max_len=3)
    single = exact(task, progress=False,
                   options=EngineOptions(keep_states=False, keep_sequences=False))
    parts = [pickle.loads(pickle.dumps(exact_shard(task, (i, 3))))
             for i in range(3)]  # "auto" keeps no rows in a shard
    P, T = task.model.num_params, task.max_len
    for p in parts:
        assert isinstance(p, ShardResult) and p.states is None and p.sequences is None
        assert p.nbytes < 8 * P * (2 * T * T + 2 * T + 20)  # sums only: no per-state arrays
    errs = merged_errors(merge(task, parts), single)
    assert max(errs.values()) <= RTOL, errs


@pytest.mark.parametrize("bad", [(2, 2), (-1, 2), (0, 0), "0/2", (True, 2), (0.0, 2), (1,)])
def test_bad_shard_is_refused(bad):
    with pytest.raises(ValueError, match="shard"):
        exact_shard(load_config("default"), bad)



def test_checksum_is_taken_when_made_and_travels_with_the_shard():
    """issue 46 item 9: a shard carries the SHA-256 of its payload, taken when it is made;
    it survives pickling (what a worker or Ray sends), and a number changed in place since
    is refused, naming the shard."""
    import numpy as np
    from fisher_ref.parallel.shard_result import ShardError, check_payload
    task = load_config("default")
    for part in (exact_shard(task, (1, 2), options=EngineOptions(keep_states=True)),
                 exact_param_shard(task, (0, 2))):
        assert len(part.checksum) == 64 and part.checksum == part.digest()
        back = pickle.loads(pickle.dumps(part))
        assert back.checksum == back.digest() == part.checksum
        check_payload(back)
        held = back.window_tables or back.moments["policy"]
        name = next(k for k, v in held.items() if isinstance(v, np.ndarray) and v.size)
        held[name].reshape(-1)[0] += 1.0
        with pytest.raises(ShardError, match=f"^{back.label}: .*checksum"):
            check_payload(back)


def test_shards_made_and_merged_by_one_call_skip_the_checksum():
    """Inside merged_here (what exact(task, workers=N) runs its own shard and the merge in)
    a shard is made without a checksum and merged so; outside, a shard without one is
    refused, and one with a checksum is checked inside too."""
    from fisher_ref.parallel.shard_result import ShardError, merged_here
    task = load_config("default")
    with merged_here():
        here = exact_param_shard(task, (1, 2))
    assert here.checksum is None
    sent = exact_param_shard(task, (0, 2))
    with merged_here():
        merge(task, [sent, here])
    with pytest.raises(ShardError, match="^parameter shard 1 of 2: .*checksum"):
        merge(task, [sent, here])
    sent.grad_ad[0] += 1.0
    with merged_here(), pytest.raises(ShardError, match="^parameter shard 0 of 2: .*checksum"):
        merge(task, [sent, here])
