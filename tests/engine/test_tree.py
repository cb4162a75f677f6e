"""The walk over the prefix tree (fisher_ref.engine.tree): blocks of at most ``chunk``
states, every response reached once with the product of its token probabilities, and a
Block that refuses a field it does not have."""
import numpy as np
import pytest

from cases import all_responses
from fisher_ref import load_config
from fisher_ref.engine.plan import count_states
from fisher_ref.engine.tree import Block, depth_first, expand, root_block, take_rows, terminal


def walk(task, p_tok, q_tok, chunk):
    """Walk the tree with next-token probabilities that depend on the token only; returns
    the number of open states visited, the largest block, and every complete response as
    ``{(prompt, response): (rp, rq)}``."""
    stack, done, visited, largest = [root_block(task, 1, ())], {}, 0, 0
    for block in depth_first(stack, chunk):
        visited += block.size
        largest = max(largest, block.size)
        p, q = np.tile(p_tok, (block.size, 1)), np.tile(q_tok, (block.size, 1))  # (B, V)
        ends = terminal(task, block)  # (B*V,)
        _, _, complete = expand(task, block, np.flatnonzero(ends), p, q)
        if (~ends).any():
            stack.append(expand(task, block, np.flatnonzero(~ends), p, q)[2])
        for pi, row, n, rp, rq in zip(complete.prompt, complete.tokens, complete.length,
                                      complete.rp, complete.rq):
            key = (int(pi), tuple(int(a) for a in row[len(task.prompts[pi]):n]))
            assert key not in done, key
            done[key] = (rp, rq)
    return visited, largest, done


@pytest.mark.parametrize("name, chunk", [("weighted_prompts", 1), ("weighted_prompts", 4),
                                         ("no_eos", 3), ("default", 1000)])
def test_every_response_is_reached_once_with_its_probability(name, chunk):
    task = load_config(name)
    V, T, eos = task.model.vocab_size, task.max_len, task.model.eos
    rng = np.random.default_rng(7)
    p_tok, q_tok = rng.dirichlet(np.ones(V)), rng.dirichlet(np.ones(V))  # (V,) each
    visited, largest, done = walk(task, p_tok, q_tok, chunk)
    n_states, n_responses = count_states(V, T, eos, len(task.prompts))
    assert largest <= chunk and visited == n_states and len(done) == n_responses
    ys = all_responses(V, T, eos)
    assert set(done) == {(i, y) for i in range(len(task.prompts)) for y in ys}
    w = task.prompt_weights
    for (i, y), (rp, rq) in done.items():
        assert rp == pytest.approx(w[i] * np.prod(p_tok[list(y)]), rel=1e-12, abs=0)
        assert rq == pytest.approx(w[i] * np.prod(q_tok[list(y)]), rel=1e-12, abs=0)
    for k in (0, 1):  # the reach of the complete responses adds up to the prompt weights
        total = np.zeros(len(w))
        for (i, _), v in done.items():
            total[i] += v[k]
        np.testing.assert_allclose(total, w, rtol=1e-12, atol=0)


def test_root_block_take_rows_and_update():
    task = load_config("weighted_prompts")
    P = task.model.num_params
    root = root_block(task, 2, ("H", "G"))
    assert root.size == 3 and root.depth == 0
    assert root.H.shape == root.G.shape == (2, 3, P) and not root.H.any()
    assert root.tokens[0].tolist() == [1, 2, 3] + [-1] * 4  # longest prompt 3 + T 3, + 1
    assert root.tokens[2].tolist() == [-1] * 7 and root.length.tolist() == [3, 1, 0]
    np.testing.assert_array_equal(root.reach("p"), task.prompt_weights)
    assert root.reach("q") is root.rq
    root.H[1, 2] = 5.0
    two = take_rows(root, np.array([False, True, True]))
    assert two.size == 2 and two.prompt.tolist() == [1, 2] and two.H.shape == (2, 2, P)
    assert two.H[1, 1].tolist() == [5.0] * P and two.length.tolist() == [1, 0]
    assert two.update(silent=True) is two and two.silent
    with pytest.raises(AttributeError, match="Block has no field 'Hh'"):
        two.update(Hh=None)
    with pytest.raises(TypeError):
        Block(prompt=np.arange(1), depth=0, rp=np.ones(1))  # rq is required


def test_blocks_of_the_last_level_take_their_own_size():
    """``depth_first(stack, chunk, last_chunk)``: a block that carries ``src`` (the last
    level's) is cut at ``last_chunk`` states, every other one at ``chunk``; every row is
    yielded once, in order."""
    task = load_config("default")
    other = take_rows(root_block(task, 1, ()), np.zeros(10, dtype=np.int64))  # 10 rows
    last = take_rows(root_block(task, 1, ()), np.zeros(25, dtype=np.int64))
    last.update(src=np.arange(25))
    stack, sizes, srcs = [other, last], [], []
    for block in depth_first(stack, 3, last_chunk=8):
        sizes.append((block.src is not None, block.size))
        if block.src is not None:
            srcs.extend(block.src.tolist())
    assert [n for is_last, n in sizes if is_last] == [8, 8, 8, 1]
    assert [n for is_last, n in sizes if not is_last] == [3, 3, 3, 1]
    assert sorted(srcs) == list(range(25))
    assert [b.size for b in depth_first([take_rows(last, np.arange(25))], 3)] == [3] * 8 + [1]
