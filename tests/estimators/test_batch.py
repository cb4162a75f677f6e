"""The batch a loss reads (fisher_ref.estimators.batch): group_arrays takes each token's
distribution from its window row (zero past the end), and make_batch gathers the
generated tokens' log-probabilities in the graph of logp_all, which sum to the responses'
sequence log-probabilities."""
import numpy as np
import torch

from fisher_ref.estimators.batch import make_batch, group_arrays
from fisher_ref.estimators.groups import response_table

from .brute import tiny_task
from .test_gradient import REF, STALE


def test_group_arrays_and_make_batch_read_the_table():
    table = response_table(tiny_task(STALE, REF, max_len=3))
    pr = table.prompts[1]
    idx = np.array([[0, len(pr) - 1], [3, 3], [len(pr) // 2, 1]])  # (n, G) groups
    a = group_arrays(table, pr, idx)
    n, G, T, V = a["logp_all"].shape
    assert (n, G, T, V) == (3, 2, 3, 3) and a["tokens"].shape == a["mask"].shape == (n, G, T)
    for i, g in np.ndindex(n, G):
        y = idx[i, g]
        for t in range(T):
            live = t < pr.lengths[y]
            assert a["mask"][i, g, t] == live and a["tokens"][i, g, t] == pr.tokens[y, t]
            for key, src in (("logp_all", table.logp), ("sampler_logp_all", table.sampler_logp),
                             ("ref_logp_all", table.ref_logp)):
                want = src[pr.rows[y, t]] if live else np.zeros(V)
                assert np.array_equal(a[key][i, g, t], want), (key, i, g, t)
    assert np.array_equal(a["rewards"], pr.rewards[idx])

    logp_all = torch.tensor(a["logp_all"][0], requires_grad=True)
    b = make_batch(logp_all, torch.tensor(a["sampler_logp_all"][0]),
                   torch.tensor(a["ref_logp_all"][0]), torch.tensor(a["tokens"][0]),
                   torch.tensor(a["mask"][0]), torch.tensor(a["rewards"][0]), pr.prompt)
    assert b.group_size == 2 and b.prompt == pr.prompt
    np.testing.assert_allclose(b.logp.sum(1).detach().numpy(), pr.logp[idx[0]], rtol=1e-12)
    np.testing.assert_allclose(b.sampler_logp.sum(1).numpy(), pr.sampler_logp[idx[0]],
                               rtol=1e-12)
    assert b.lengths.tolist() == pr.lengths[idx[0]].tolist()
    assert not b.old_logp.requires_grad and torch.equal(b.old_logp, b.logp.detach())
    assert torch.all(b.ref_logp[~b.mask] == 0) and torch.all(b.logp.detach()[~b.mask] == 0)
    b.logp.sum().backward()  # the gather is in logp_all's graph: one 1 per generated token
    onehot = np.zeros((G, T, V))
    for g, t in zip(*np.nonzero(a["mask"][0])):
        onehot[g, t, a["tokens"][0][g, t]] = 1.0
    assert np.array_equal(logp_all.grad.numpy(), onehot)
    on = response_table(tiny_task())
    c = make_batch(**{k: None if v is None else torch.tensor(v) for k, v in
                      group_arrays(on, on.prompts[0], np.array([[1, 2]])).items()
                      if k != "rows"}, prompt=0)
    assert c.ref_logp is None and c.ref_logp_all is None
    assert torch.equal(c.sampler_logp, c.old_logp)  # on policy: the sampler is the policy


def test_batch_limit_is_the_brute_force_moments():
    """tokens per response and group, reward mean and std under the sampler."""
    import cases
    from fisher_ref.estimators.batch import batch_limit

    from .brute import _limit
    task = tiny_task(STALE, max_len=3)
    lim = batch_limit(response_table(task), 3)
    want = _limit(task, cases.all_responses(3, 3, True), 3)
    for key, value in want.items():
        assert abs(getattr(lim, key) - value) <= 1e-10 * abs(value), key
    assert lim.group_size == 3


def test_batch_arrays_put_the_groups_one_after_the_other():
    from fisher_ref.estimators.batch import batch_arrays
    table = response_table(tiny_task(STALE))
    pj, idx = np.array([0, 1, 1]), np.array([[0, 1], [2, 3], [4, 4]])  # 3 groups, G = 2
    a = batch_arrays(table, np.array([[0, 2], [1, 1]]), pj, idx)  # 2 batches of K = 2
    assert a["groups"].tolist() == [[0, 0, 1, 1]] * 2
    assert a["prompts"].tolist() == [[0, 0, 1, 1], [1, 1, 1, 1]]
    one = group_arrays(table, table.prompts[1], idx[[2]])
    assert np.array_equal(a["logp_all"][0, 2:], one["logp_all"][0])
    assert np.array_equal(a["rewards"][1], np.tile(table.prompts[1].rewards[[2, 3]], 2))
