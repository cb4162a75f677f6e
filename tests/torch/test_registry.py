"""The torch twin of a model (fisher_ref.torch.registry): a model with no twin (an
autograd function) is refused naming its arch, by torch_model and by the torch engine."""
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref.models.base import ModelSpec  # noqa: E402
from fisher_ref.models.function import FunctionModel  # noqa: E402
from fisher_ref.models.mlp import MLPModel  # noqa: E402
from fisher_ref.rewards import CountReward  # noqa: E402
from fisher_ref.tasks import Task  # noqa: E402
from fisher_ref.torch.exact import torch_exact  # noqa: E402
from fisher_ref.torch.registry import torch_model  # noqa: E402

pytestmark = pytest.mark.torch


def test_autograd_function_model_has_no_torch_twin():
    m = FunctionModel(lambda th, w: th[:3] + 0 * w[:, :1], 3, 3, 1, name="my_fn")
    with pytest.raises(NotImplementedError, match="arch 'my_fn'"):
        torch_model(m)


def test_autograd_function_model_is_not_implemented_and_named():
    base = MLPModel(ModelSpec(vocab_size=3))
    model = FunctionModel(base.logits, base.num_params, 3, base.context, name="my_fn")
    task = Task(model=model, theta=base.init_params(), prompts=[(1,)], prompt_weights=[1.0],
                max_len=2, reward=CountReward(1))
    with pytest.raises(NotImplementedError, match="arch 'my_fn'"):
        torch_exact(task)
