"""Shards of the torch engine (``torch_exact(task, shard=(i, n))``, merged by
``torch_exact(task, merge=parts)``) against one torch run of the same task at 1e-12 on
every quantity (quantities that are 0 in exact arithmetic and variances measured on the
scale of what they are formed from, the correlation where its bound is above rounding), with the per-state and per-response arrays in the
same order, on-policy, off-policy, a GPT-2, several prompts and more shards than
subtrees."""
import pickle

import pytest

from fisher_ref import load_config
from fisher_ref.parallel.shards import ShardError
from fisher_ref.torch.exact import torch_exact
from fisher_ref.torch.shards import merge_errors

RTOL = 1e-12


@pytest.mark.parametrize("name", ["default", "offpolicy_temperature", "no_eos", "gpt2_small",
                                  "weighted_prompts"])
def test_merged_torch_shards_match_one_torch_run(name):
    task = load_config(name)
    one = torch_exact(task)
    for n in (1, 2, 3, 5):
        parts = [pickle.loads(pickle.dumps(torch_exact(task, shard=(i, n)))) for i in range(n)]
        errs = merge_errors(torch_exact(task, merge=parts), one)
        bad = {k: e for k, e in errs.items() if not e <= RTOL}
        assert not bad, f"{name}, {n} shards: {bad}"


def test_torch_merge_refuses_a_partial_set():
    task = load_config("default")
    parts = [torch_exact(task, shard=(i, 3)) for i in range(3)]
    with pytest.raises(ShardError, match="each of the 3 shards once"):
        torch_exact(task, merge=parts[:2])
    with pytest.raises(ValueError, match="shard"):
        torch_exact(task, shard=(3, 3))


def test_merge_errors_sees_a_changed_field_and_a_changed_record():
    import copy

    task = load_config("default")
    one = torch_exact(task)
    assert max(merge_errors(one, one).values()) == 0.0
    other = copy.deepcopy(one)
    f = other["streams"]["policy"]["sequence_fisher"]
    f[f.argmax()] *= 1 + 1e-9  # on the field's own scale: an error of 1e-9
    errs = merge_errors(other, one)
    assert abs(errs["policy.sequence_fisher"] - 1e-9) < 1e-12
    other["sequences"]["tokens"][0, 0] += 1
    with pytest.raises(ShardError, match="sequences.tokens"):
        merge_errors(other, one)
