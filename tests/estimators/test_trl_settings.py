"""fisher_ref.estimators.trl_settings: every setting of a GRPOTrainer run fisher_ref cannot
mirror is refused by name, from the config, the built trainer and the model."""
import warnings

import pytest
import torch

from fisher_ref.estimators import trl_expected, trl_refusals
from fisher_ref.torch.tiny import tiny_llama

from ..torch.test_trl_end_to_end import MODEL, V, grpo_args, make_trainer


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("over, name", [
    ({"top_k": 2}, "top_k"), ({"top_p": 0.9}, "top_p"), ({"temperature": 0.7}, "temperature"),
    ({"learning_rate": 1e-3}, "learning_rate"), ({"max_grad_norm": 1.0}, "max_grad_norm"),
    ({"bf16": True}, "bf16"), ({"beta": 0.04}, "beta"), ({"num_iterations": 2}, "num_iterations"),
    ({"use_vllm": True}, "use_vllm"),
    ({"loss_type": "bnpo", "gradient_accumulation_steps": 2}, "loss_type"),
    ({"gradient_accumulation_steps": 2, "steps_per_generation": 4}, "steps_per_generation"),
    ({"mask_truncated_completions": True}, "mask_truncated_completions"),
    ({"top_entropy_quantile": 0.5}, "top_entropy_quantile"),
    ({"generation_kwargs": {"top_k": 2}}, "generation_kwargs"),
    ({"delta": 0.9}, "delta"), ({"entropy_coef": 0.01}, "entropy_coef"),
])
def test_settings_that_cannot_be_mirrored_are_refused_by_name(over, name):
    if name == "use_vllm":  # GRPOConfig itself refuses vLLM without the package
        args = grpo_args()
        args.use_vllm = True
    else:
        args = grpo_args(**over)
    assert any(r.startswith(f"{name}=") for r in trl_refusals(args)), trl_refusals(args)
    # a trainer with vLLM or a KL term cannot be built here (no vLLM, no model hub)
    if name not in ("use_vllm", "beta"):
        with pytest.raises(ValueError, match=name):
            trl_expected(make_trainer(args))


def test_the_built_trainers_sampler_and_the_models_dropout_are_read():
    """What the config does not say: a generation config changed after the trainer was
    built, and dropout in the model."""
    trainer = make_trainer(grpo_args())
    trainer.generation_config.top_k = 2
    trainer.generation_config.min_new_tokens = 1
    bad = trl_refusals(trainer.args, trainer.model, trainer)
    assert any(r.startswith("generation_config.top_k=2") for r in bad), bad
    assert any(r.startswith("generation_config.min_new_tokens=1") for r in bad), bad
    with pytest.raises(ValueError, match="generation_config.top_k"):
        trl_expected(trainer)
    model = tiny_llama(V, **MODEL)
    model.config.attention_dropout = 0.1
    assert any("attention_dropout=0.1" in r for r in trl_refusals(grpo_args(), model))


def test_builder_refuses_what_it_cannot_read():
    with pytest.raises(ValueError, match="2 distinct prompts"):
        trl_expected(make_trainer(grpo_args(), prompts=("t1", "t2")))
    model = tiny_llama(V, **MODEL).to(torch.float32)
    assert any("float32" in r for r in trl_refusals(grpo_args(), model))
    trainer = make_trainer(grpo_args())
    trainer.reward_funcs = [torch.nn.Linear(2, 1)]  # a reward model (TRL loads it by name)
    with pytest.raises(ValueError, match="plain callables"):
        trl_expected(trainer)
