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
from fisher_ref.parallel import exact_shard
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
