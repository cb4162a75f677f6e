"""The prefix tree in torch (fisher_ref.torch.tree): depth-first blocks of at most
``chunk`` states, every state exactly once."""
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.torch.tree import depth_first, root_block  # noqa: E402

pytestmark = pytest.mark.torch


def test_depth_first_visits_every_state_once_in_blocks_of_at_most_chunk():
    """The walk's memory unit: no block above ``chunk`` rows, every state exactly once."""
    from fisher_ref.engine.plan import count_states
    from fisher_ref.torch.tree import ending_tokens, open_children
    task = load_config("weighted_prompts")
    V, chunk, seen = task.model.vocab_size, 3, []
    stack = [root_block(task, 1, "cpu", torch.float64)]
    for block in depth_first(stack, chunk):
        assert block.size <= chunk
        seen += [(pi, tuple(r[:n])) for pi, r, n in zip(block.prompt.tolist(),
                                                        block.tokens.tolist(),
                                                        block.length.tolist())]
        _, opening = ending_tokens(task, block.depth, "cpu")
        if len(opening):
            p = torch.full((block.size, V), 1.0 / V, dtype=torch.float64)
            x = torch.zeros((1, block.size, len(opening), task.model.num_params),
                            dtype=torch.float64)
            stack.append(open_children(block, opening, p, p, x, block.G))
        assert len(stack) <= task.max_len
    assert len(seen) == len(set(seen)) == count_states(V, task.max_len, task.model.eos,
                                                        len(task.prompts))[0]
