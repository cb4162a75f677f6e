r"""What a TRL ``GRPOTrainer`` should apply, read from the trainer itself:
:func:`trl_expected` (the task, the loss and the exact expected gradient of one optimizer
step) and :func:`check_trainer_loss` (the trainer's own loss method on fixed groups).

The task is built from what the trainer was given: its model (a copy), its tokenizer,
the ``prompt`` of its training dataset, its reward functions and weights, and from its
``GRPOConfig``: ``num_generations`` (``G``), ``max_completion_length`` (``T``),
``loss_type``, ``scale_rewards``, and the groups of one optimizer step
(``per_device_train_batch_size * gradient_accumulation_steps / num_generations``, ``K``).
Settings fisher_ref cannot mirror are refused by name (:func:`trl_refusals`).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
import torch

from fisher_ref.estimators.batch import group_arrays
from fisher_ref.estimators.enumerated import enumerated_gradients
from fisher_ref.estimators.evaluation import loss_coefficients
from fisher_ref.estimators.gradient import expected_loss_gradient, group_gradients
from fisher_ref.estimators.groups import response_table
from fisher_ref.estimators.trainers import trl_advantages, trl_loss
from fisher_ref.verdict import Verdict

__all__ = ["TrainerTarget", "RunVerdict", "trl_refusals", "trl_task", "trl_expected", "TrainerLossVerdict",
           "check_trainer_loss"]


def _float_settings(args):
    """``[(name, value, need, why)]``: the numeric settings that must have a value."""
    return [
        ("learning_rate", args.learning_rate, 0.0, "the weights would move between steps"),
        ("max_grad_norm", args.max_grad_norm or 0.0, 0.0,
         "clipping rescales the applied gradient by a data-dependent factor"),
        ("top_p", args.top_p, 1.0, "nucleus sampling draws from a truncated policy"),
        ("top_k", args.top_k or 0, 0, "top-k sampling draws from a truncated policy"),
        ("min_p", args.min_p or 0.0, 0.0, "min-p sampling draws from a truncated policy"),
        ("temperature", args.temperature, 1.0,
         "the sampler and the log-probs would be of the tempered policy"),
        ("repetition_penalty", args.repetition_penalty, 1.0,
         "the sampler would not be the model's policy"),
        ("beta", args.beta, 0.0, "the KL term needs a reference model"),
        ("num_iterations", args.num_iterations, 1,
         "steps would reuse one generation: not i.i.d. draws"),
    ]


def trl_refusals(args, model=None):
    """The settings of a ``GRPOConfig`` (and model) fisher_ref cannot mirror, each as
    ``"name=value: why; set name=need"``; empty when the run can be held to the exact
    gradient."""
    out = [f"{name}={value!r}: {why}; set {name}={need!r}"
           for name, value, need, why in _float_settings(args) if value != need]
    flags = [("use_vllm", "vLLM samples outside the model fisher_ref enumerates"),
             ("bf16", "bf16 autocast rounds the log-prob recompute (TRL's default: "
                      "check_trainer_loss measures it)"),
             ("fp16", "fp16 autocast rounds the log-prob recompute"),
             ("mask_truncated_completions", "not mirrored"),
             ("use_liger_kernel", "not mirrored")]
    out += [f"{name}=True: {why}; set {name}=False" for name, why in flags
            if getattr(args, name, False)]
    if args.steps_per_generation != args.gradient_accumulation_steps:
        out.append(f"steps_per_generation={args.steps_per_generation}: one generation would "
                   f"feed several optimizer steps; set it to gradient_accumulation_steps="
                   f"{args.gradient_accumulation_steps}")
    if args.gradient_accumulation_steps > 1 and args.loss_type == "bnpo":
        out.append("loss_type='bnpo' with gradient_accumulation_steps > 1: each micro-batch "
                   "of a shuffled generation batch is normalised by its own tokens; not "
                   "mirrored")
    if args.top_entropy_quantile < 1.0:
        out.append(f"top_entropy_quantile={args.top_entropy_quantile}: not mirrored; set 1.0")
    if args.multi_objective_aggregation != "sum_then_normalize":
        out.append(f"multi_objective_aggregation={args.multi_objective_aggregation!r}: not "
                   f"mirrored; set 'sum_then_normalize'")
    if model is not None:
        low = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float64})
        if low:
            out.append(f"model parameters in {', '.join(low)}: the exact gradient is float64 "
                       f"and the test would measure the rounding; load the model in float64")
    return out


def _prompt(trainer):
    """The training dataset's one distinct text prompt."""
    data = trainer.train_dataset
    if data is None or "prompt" not in getattr(data, "column_names", ()):
        raise ValueError("the trainer's train_dataset needs a 'prompt' column")
    distinct = {repr(p): p for p in data["prompt"]}
    if len(distinct) != 1:
        raise ValueError(f"the train_dataset holds {len(distinct)} distinct prompts: TRL draws "
                         f"them without replacement within an epoch, so its steps are not i.i.d. "
                         f"draws of one expected gradient; use one prompt (repeated)")
    prompt = next(iter(distinct.values()))
    if not isinstance(prompt, str):
        raise ValueError("a conversational prompt is not mirrored: give the prompt as text")
    return prompt


def _reward(trainer, prompt, example):
    """fisher_ref's ``reward(prompt_ids, response_ids)``: the trainer's reward functions on
    one completion, as TRL calls them (float32, weighted sum)."""
    funcs = list(trainer.reward_funcs)
    for f in funcs:
        if isinstance(f, torch.nn.Module) or not callable(f):
            raise ValueError(f"reward function {f!r:.60}: only plain callables are mirrored")
    weights = torch.as_tensor(trainer.reward_weights, dtype=torch.float32)
    tok = trainer.processing_class
    extra = {k: [v] for k, v in example.items() if k not in ("prompt", "completion",
                                                             "completion_ids")}

    def reward(prompt_ids, response):
        ids = [int(t) for t in response]
        text = tok.batch_decode([ids], skip_special_tokens=True)
        per = torch.tensor([float(f(prompts=[prompt], completions=text, completion_ids=[ids],
                                    trainer_state=trainer.state, log_extra=lambda *a, **k: None,
                                    log_metric=lambda *a, **k: None, **extra)[0])
                            for f in funcs], dtype=torch.float32)
        return float((per * weights).nansum())
    return reward


@dataclass
class TrainerTarget:
    """What one optimizer step of a trainer should apply.

    Attributes:
        task: the :class:`fisher_ref.tasks.Task` (a copy of the trainer's model, its prompt,
            its rewards).
        loss: ``loss(batch)``, the trainer's own loss method (:func:`trl_loss`).
        group_size, groups_per_batch: ``G`` and ``K`` of one optimizer step.
        exact: the :class:`fisher_ref.estimators.LossGradient` of one step.
        distribution: ``(gradients (N, P), probabilities (N,))`` of one step, or ``None``.
        names: the trained parameters in the trainer's order (a recorder's ``names``).
    """

    task: object
    loss: object
    group_size: int
    groups_per_batch: int
    exact: object = None
    distribution: tuple | None = None
    names: list | None = None

    def check(self, samples, *, alpha=1e-6):
        """Judge the applied gradients ``samples`` (a recorder, or ``(steps, P)``): the
        per-parameter test and, with the ``distribution``, the covariance test, each at
        ``alpha / 2`` (Bennett's bound: a correct run fails with probability at most
        ``alpha``). Returns a :class:`RunVerdict`."""
        from fisher_ref.testing import check_applied_covariance, check_applied_gradient
        layout = getattr(samples, "layout", None) or self.names
        share = alpha / 2 if self.distribution is not None else alpha
        if self.distribution is not None and getattr(self.exact, "covariance", None) is None:
            raise ValueError("the target has a distribution but no covariance")
        per = check_applied_gradient(samples, self.exact, alpha=share, layout=layout)
        cov = None if self.distribution is None else check_applied_covariance(
            samples, self.exact, alpha=share, distribution=self.distribution)
        return RunVerdict(passed=bool(per) and (cov is None or bool(cov)),
                          per_parameter=per, covariance=cov, alpha=float(alpha))


@dataclass
class RunVerdict(Verdict):
    """What :meth:`TrainerTarget.check` found: true when both tests passed.

    Attributes:
        passed: both passed.
        per_parameter: the :class:`fisher_ref.testing.AppliedGradientVerdict`.
        covariance: the :class:`fisher_ref.testing.CovarianceVerdict`, or ``None``.
        alpha: the false-failure rate of the two together.
    """

    passed: bool
    per_parameter: object
    covariance: object
    alpha: float

    @property
    def message(self):
        """Both verdicts, one per line."""
        lines = [self.per_parameter.message]
        if self.covariance is not None:
            lines.append(self.covariance.message)
        return "\n".join(lines)


def trl_task(trainer):
    """``(task, loss, G, K, names)`` of a ``trl.GRPOTrainer``, refusing what it cannot mirror.

    Raises:
        ValueError: the refusals of :func:`trl_refusals`, joined; a dataset of several
            distinct prompts or of conversational ones; a reward model.
    """
    from fisher_ref.torch import causal_lm_task
    args, model = trainer.args, trainer.model
    bad = trl_refusals(args, model)
    if bad:
        raise ValueError("fisher_ref cannot mirror this GRPOTrainer run: " + "; ".join(bad))
    prompt = _prompt(trainer)
    tok = trainer.processing_class
    prompt_ids = [int(t) for t in tok(text=[prompt])["input_ids"][0]]
    V = int(model.config.get_text_config().vocab_size)
    eos = trainer.eos_token_ids
    if list(eos) != [0]:
        raise ValueError(f"the trainer ends completions at ids {list(eos)}: fisher_ref's EOS is "
                         f"id 0 only (fisher_ref.torch.tiny_tokenizer and tiny_llama set it)")
    G = int(args.num_generations)
    K, rem = divmod(args.per_device_train_batch_size * args.gradient_accumulation_steps, G)
    if rem:
        raise ValueError("per_device_train_batch_size * gradient_accumulation_steps must be a "
                         "multiple of num_generations")
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    example = dict(trainer.train_dataset[0])
    stock = copy.deepcopy(model)
    stock.__dict__.pop("forward", None)  # TRL's fused-LM-head forward: back to the model's own
    task = causal_lm_task(stock, [prompt_ids], int(args.max_completion_length),
                          _reward(trainer, prompt, example), vocab_size=V, eos=True,
                          params=names, name="trl_grpo")
    loss_args = copy.copy(args)  # the step's K groups as one batch (see the module)
    loss_args.gradient_accumulation_steps = loss_args.steps_per_generation = 1
    return task, trl_loss(config=loss_args), G, K, names


def trl_expected(trainer, *, covariance=False, distribution=False, **kwargs):
    r"""The exact expected gradient of one optimizer step of a ``trl.GRPOTrainer``.

    One step draws ``K`` groups of ``G`` completions (``K = per_device_train_batch_size *
    gradient_accumulation_steps / num_generations``: several prompts per step, or
    accumulation) and applies the gradient of TRL's loss over all of them: per-sequence
    means over the ``K G`` rows (``grpo``), a sum over ``K G T`` (``dr_grpo``), a sum over
    the step's tokens (``dapo``), each accumulated micro-batch scaled as TRL scales it,
    which adds up to the loss of one batch of ``K`` groups (``groups_per_batch=K``).

    Args:
        trainer: a ``trl.GRPOTrainer`` (built, not yet trained).
        covariance: also the exact covariance (``exact.covariance``).
        distribution: also every step's gradient and probability (``distribution``, and
            the covariance with it), for :func:`fisher_ref.testing.check_applied_covariance`.
        kwargs: more arguments of :func:`fisher_ref.estimators.expected_loss_gradient`
            (``max_groups``, ``max_bytes``).

    Returns:
        :class:`TrainerTarget`.

    Raises:
        ValueError: what :func:`trl_task` refuses.
    """
    task, loss, G, K, names = trl_task(trainer)
    opts = dict(symmetric=True, groups_per_batch=K, pad="longest", **kwargs)
    exact = expected_loss_gradient(task, loss, G, covariance=covariance or distribution,
                                   **opts)
    dist = enumerated_gradients(task, loss, G, **opts) if distribution else None
    return TrainerTarget(task=task, loss=loss, group_size=G, groups_per_batch=K, exact=exact,
                         distribution=dist, names=names)


@dataclass
class TrainerLossVerdict(Verdict):
    """What :func:`check_trainer_loss` found; true when the trainer's loss method gives the
    exact per-group gradients within ``rtol``.

    Attributes:
        passed: ``as_run <= rtol``.
        as_run: the largest relative error of a group's gradient, run as the trainer runs
            it (its autocast included).
        float64: the same with autocast off and the model in float64 throughout.
        groups: the groups compared.
        rtol: the tolerance.
        cause: ``""`` when passing; else what the two runs point to.
    """

    passed: bool
    as_run: float
    float64: float
    groups: int
    rtol: float
    cause: str = ""

    @property
    def message(self):
        """The verdict and its numbers, on one line."""
        head = "PASS" if self.passed else "FAIL"
        out = (f"{head} trainer loss on {self.groups} fixed groups: largest relative error "
               f"{self.as_run:.3g} as run, {self.float64:.3g} in float64 (rtol {self.rtol:g})")
        return out + (f": {self.cause}" if self.cause else "")


def check_trainer_loss(trainer, *, groups=4, seed=0, rtol=1e-6):
    r"""The trainer's own ``_compute_loss`` with its own model's forward on fixed groups of
    enumerated completions, against fisher_ref's exact gradient of each group. Seconds, no
    sampling: it separates a loss bug or a precision loss from a pipeline bug before any
    statistical test.

    Each group is fed as a whole step (``current_gradient_accumulation_steps = 1``,
    ``num_items_in_batch`` its tokens) twice: as the trainer runs it, under its
    accelerator's autocast (bf16 when ``GRPOConfig.bf16``, TRL's default), and in float64
    with autocast off (:func:`fisher_ref.torch.precision.run_dtype`). When only the first
    misses ``rtol``, the cause named is the precision (bf16 autocast, or the model's float32
    casts); when both do, the loss method itself.

    Args:
        trainer: a ``trl.GRPOTrainer``; its settings need not pass :func:`trl_refusals`
            except that the task must be buildable (one prompt, EOS id 0).
        groups: how many groups of ``num_generations`` completions, drawn uniformly from the
            enumerated completions with ``seed``.
        rtol: the largest relative error (max-norm) accepted.

    Returns:
        :class:`TrainerLossVerdict`.
    """
    from fisher_ref.torch.precision import run_dtype
    args = trainer.args
    precision = [f"bf16={args.bf16}"] if getattr(args, "bf16", False) else []
    shadow = copy.copy(args)  # build the task from the settings the check can mirror
    for name in ("bf16", "fp16"):
        setattr(shadow, name, False)
    shadow.learning_rate, shadow.max_grad_norm = 0.0, 0.0
    real = trainer.args
    trainer.args = shadow
    try:
        task, loss, G, _, names = trl_task(trainer)
    finally:
        trainer.args = real
    table = response_table(task)
    pr, prompt_ids = table.prompts[0], [int(t) for t in task.prompts[0]]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(pr), size=(int(groups), G))  # (groups, G)
    a = group_arrays(table, pr, idx)
    exact = group_gradients(table, a, loss_coefficients(loss, a, pr.prompt))  # (groups, P)
    model = trainer.model
    params = dict(model.named_parameters())
    saved_steps = trainer.args.steps_per_generation
    worst = {}
    try:
        trainer.args.steps_per_generation = 1
        trainer.current_gradient_accumulation_steps = 1
        for mode in ("as_run", "float64"):
            errs = []
            for k in range(len(idx)):
                mask = torch.tensor(a["mask"][k]).to(torch.long)
                inputs = {"prompt_ids": torch.tensor([prompt_ids] * G),
                          "prompt_mask": torch.ones((G, len(prompt_ids)), dtype=torch.long),
                          "completion_ids": torch.tensor(a["tokens"][k]).clamp(min=0),
                          "completion_mask": mask,
                          "advantages": trl_advantages(torch.tensor(a["rewards"][k]), G,
                                                       args.scale_rewards),
                          "num_items_in_batch": mask.sum()}
                model.zero_grad()
                if mode == "as_run":
                    with trainer.accelerator.autocast():
                        trainer._compute_loss(model, inputs).backward()
                else:
                    with run_dtype(model, torch.float64):
                        trainer._compute_loss(model, inputs).backward()
                g = np.concatenate([params[n].grad.reshape(-1).to(torch.float64).numpy()
                                    for n in names])
                errs.append(np.abs(g - exact[k]).max() / max(np.abs(exact[k]).max(), 1e-300))
            worst[mode] = float(max(errs))
    finally:
        trainer.args.steps_per_generation = saved_steps
        model.zero_grad()
    passed = worst["as_run"] <= rtol
    cause = ""
    if not passed:
        if worst["float64"] <= rtol:
            cause = ("precision: " + (", ".join(precision) + " autocast" if precision else
                     "the model's casts below float64") +
                     " rounds the log-prob recompute; in float64 the loss method is exact"
                     + ("; set GRPOConfig(bf16=False)" if precision else ""))
        else:
            cause = "the loss method itself: it is off in float64 too"
    return TrainerLossVerdict(passed=passed, as_run=worst["as_run"], float64=worst["float64"],
                              groups=len(idx), rtol=float(rtol), cause=cause)
