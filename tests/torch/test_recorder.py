"""The real TRL GRPOTrainer, end to end, held to the exact expected gradient: a tiny stock
Llama in float64 on the CPU (one prompt, T = 3, G = 3, learning rate 0, no clipping, no
KL), its applied gradients recorded by GradientRecorder and judged by
check_applied_gradient at a false-failure rate of 1e-6, for a number of steps chosen by
steps_needed; one pipeline bug (log-probs off by one position), injected in this file
only, is caught. Plus the recorder's refusals."""
import copy
import warnings

import numpy as np
import pytest
import torch

from fisher_ref.estimators import expected_loss_gradient
from fisher_ref.estimators.trainers import trl_advantages, trl_loss
from fisher_ref.testing import check_applied_gradient, steps_needed
from fisher_ref.torch import causal_lm_task
from fisher_ref.torch import GradientRecorder
from fisher_ref.torch.tiny import tiny_llama, tiny_tokenizer

V, T, G = 4, 3, 3
PROMPT = [1]
#: False-failure rate of each trainer check.
ALPHA = 1e-6
#: The scale error the clean runs are powered (90%) to catch: applied = 1.5 x exact.
POWERED_FOR = 0.5
#: Model settings under which steps_needed(POWERED_FOR) is 95 steps (a few seconds of
#: training; hidden 8 with init_std 1 needs 4,341).
MODEL = {"hidden": 4, "intermediate": 8, "init_std": 0.6, "seed": 0}


def reward_ids(ids):
    return float(sum(t == 1 for t in ids)) + 0.25 * float(sum(t == 2 for t in ids))


def reward_func(prompts, completions, completion_ids, **kwargs):
    return [reward_ids(list(c)) for c in completion_ids]


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)


def _args(loss_type, steps, **over):
    from trl import GRPOConfig
    kw = dict(output_dir="unused", loss_type=loss_type, learning_rate=0.0, max_grad_norm=0.0,
              beta=0.0, bf16=False, use_cpu=True, per_device_train_batch_size=G,
              num_generations=G, max_completion_length=T, max_steps=steps, report_to="none",
              logging_steps=10 ** 6, save_strategy="no", gradient_checkpointing=False, seed=0,
              temperature=1.0, top_k=0, top_p=1.0)
    kw.update(over)
    return GRPOConfig(**kw)


def run_grpo(loss_type, steps, seed=0, **over):
    """``(recorder, exact LossGradient)`` of ``steps`` steps of TRL's GRPOTrainer."""
    from datasets import Dataset
    from trl import GRPOTrainer
    model = tiny_llama(V, **MODEL)
    task = causal_lm_task(copy.deepcopy(model), [PROMPT], T, lambda p, r: reward_ids(r),
                          vocab_size=V, eos=True)
    exact = expected_loss_gradient(task, trl_loss(loss_type), G, symmetric=True)
    rec = GradientRecorder()
    trainer = GRPOTrainer(model=model, reward_funcs=reward_func,
                          args=_args(loss_type, steps, seed=seed, **over),
                          train_dataset=Dataset.from_dict({"prompt": ["t1"] * 8}),
                          processing_class=tiny_tokenizer(V), callbacks=[rec])
    trainer.train()
    assert rec.steps == steps
    return rec, exact


@pytest.fixture(scope="module")
def steps():
    model = tiny_llama(V, **MODEL)
    task = causal_lm_task(model, [PROMPT], T, lambda p, r: reward_ids(r), vocab_size=V, eos=True)
    with warnings.catch_warnings():  # GRPOConfig's own FutureWarning
        warnings.simplefilter("ignore", FutureWarning)
        exact = expected_loss_gradient(task, trl_loss("grpo"), G, symmetric=True)
    return steps_needed(exact, POWERED_FOR, alpha=ALPHA, power=0.9)


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo"])
def test_clean_grpo_trainer_applies_the_exact_gradient(loss_type, steps):
    """False failure <= ALPHA (check_applied_gradient's rate)."""
    rec, exact = run_grpo(loss_type, steps)
    v = check_applied_gradient(rec, exact, alpha=ALPHA, layout=rec.layout)
    assert v, f"seed 0, {loss_type}: {v.message}"
    assert rec.names == [n for n, _, _ in rec.layout] and rec.layout[-1][0] == "lm_head.weight"


def test_logprobs_off_by_one_position_are_caught(steps, monkeypatch):
    """The bug: the per-token log-probs misaligned by one position, each completion
    token's slot holding the next token's log-prob (the last slot 0). Caught at the clean
    runs' step count: its bias is far larger than the scale error they are powered for (a
    miss would be a failure of the check, not a false failure)."""
    from trl import GRPOTrainer
    original = GRPOTrainer._get_per_token_logps_and_entropies

    def shifted(self, *args, **kwargs):
        logps, ent, aux = original(self, *args, **kwargs)
        return torch.nn.functional.pad(logps[:, 1:], (0, 1)), ent, aux
    monkeypatch.setattr(GRPOTrainer, "_get_per_token_logps_and_entropies", shifted)
    rec, exact = run_grpo("grpo", steps)
    v = check_applied_gradient(rec, exact, alpha=ALPHA, layout=rec.layout)
    assert not v, v.message


def test_recorder_refuses_moving_weights_and_clipping():
    with pytest.raises(ValueError, match="learning_rate"):
        run_grpo("grpo", 2, learning_rate=1e-3)
    with pytest.raises(ValueError, match="max_grad_norm"):
        run_grpo("grpo", 2, max_grad_norm=1.0)


def test_recorder_refuses_a_model_with_no_trained_parameter():
    model = tiny_llama(V, **MODEL)
    for p in model.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="no trained parameter"):
        GradientRecorder().on_train_begin(_args("grpo", 1), None, None, model=model)


def test_recorder_sees_weights_that_moved_and_caps_memory():
    model = tiny_llama(V, **MODEL)
    rec = GradientRecorder(max_bytes=2 * 8 * sum(p.numel() for p in model.parameters()))
    args = _args("grpo", 1)
    rec.on_train_begin(args, None, None, model=model)
    for _ in range(2):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    with pytest.raises(MemoryError, match="keep_samples=False"):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    s, s2, n = rec.running_sums()
    assert n == 2 and rec.samples().shape == (2, s.size) and not s.any()
    with torch.no_grad():
        model.lm_head.weight[0, 0] += 1.0
    with pytest.raises(ValueError, match="moved"):
        rec.on_pre_optimizer_step(args, None, None, model=model)
    sums_only = GradientRecorder(keep_samples=False)
    sums_only.on_train_begin(args, None, None, model=model)
    sums_only.on_pre_optimizer_step(args, None, None, model=model)
    assert sums_only.samples() is None and sums_only.running_sums()[2] == 1


def test_trainer_loss_method_on_fixed_groups_is_the_adapters():
    """The deterministic per-group check: TRL's own ``_compute_loss`` with the real model's
    forward on fixed enumerated groups gives fisher_ref's exact per-group gradient
    (``trl_loss`` on the enumerated log-probs): to 1e-10 when the stock Llama runs in
    float64 throughout (``run_dtype``), and only to float32 rounding as it ships (RMSNorm
    and rotary casts)."""
    from datasets import Dataset
    from trl import GRPOTrainer

    from fisher_ref.estimators.batch import group_arrays
    from fisher_ref.estimators.gradient import _group_gradients, loss_coefficients
    from fisher_ref.estimators.groups import response_table
    from fisher_ref.torch.precision import run_dtype
    model = tiny_llama(V, **MODEL)
    task = causal_lm_task(copy.deepcopy(model), [PROMPT], T, lambda p, r: reward_ids(r),
                          vocab_size=V, eos=True)
    table = response_table(task)
    pr = table.prompts[0]
    idx = np.array([[0, 5, 9], [3, 3, 11], [1, 20, 39]])  # (3 groups, G)
    a = group_arrays(table, pr, idx)
    exact = _group_gradients(table, a, loss_coefficients(trl_loss("grpo"), a, pr.prompt))
    # after trl_loss: a GRPOConfig built later would reset the trainer's accelerator state
    trainer = GRPOTrainer(model=model, reward_funcs=reward_func, args=_args("grpo", 1),
                          train_dataset=Dataset.from_dict({"prompt": ["t1"] * 8}),
                          processing_class=tiny_tokenizer(V))
    trainer.current_gradient_accumulation_steps = 1  # set by train() for each step
    worst = {}
    for exact64 in (True, False):
        errs = []
        for k in range(len(idx)):
            tokens, mask = torch.tensor(a["tokens"][k]), torch.tensor(a["mask"][k])
            rewards = torch.tensor(a["rewards"][k])
            inputs = {"prompt_ids": torch.tensor([PROMPT] * G),
                      "prompt_mask": torch.ones((G, len(PROMPT)), dtype=torch.long),
                      "completion_ids": tokens.clamp(min=0),
                      "completion_mask": mask.to(torch.long),
                      "advantages": trl_advantages(rewards, G, "group"),
                      "num_items_in_batch": mask.sum()}
            model.zero_grad()
            if exact64:
                with run_dtype(model, torch.float64):
                    trainer._compute_loss(model, inputs).backward()
            else:
                trainer._compute_loss(model, inputs).backward()
            g = np.concatenate([p.grad.reshape(-1).numpy() for p in model.parameters()])
            errs.append(np.abs(g - exact[k]).max() / np.abs(exact[k]).max())
        worst[exact64] = max(errs)
    assert worst[True] <= 1e-10, worst
    assert 1e-10 < worst[False] <= 1e-5, worst
