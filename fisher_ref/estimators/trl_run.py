r"""What a TRL ``GRPOTrainer`` should apply, read from the trainer itself:
:func:`trl_expected` (the task, the loss and the exact expected gradient of one optimizer
step) and :func:`check_trainer_loss` (the trainer's own loss method on fixed groups).

The task is built from what the trainer was given: its model (a copy), its tokenizer,
the ``prompt`` of its training dataset, its reward functions and weights, and from its
``GRPOConfig``: ``num_generations`` (``G``), ``max_completion_length`` (``T``),
``loss_type``, ``scale_rewards``, and the groups of one optimizer step
(``per_device_train_batch_size * gradient_accumulation_steps / num_generations``, ``K``).
Settings fisher_ref cannot mirror are refused by name
(:func:`fisher_ref.estimators.trl_settings.trl_refusals`).
"""
from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import numpy as np
import torch

from fisher_ref.estimators.batch import group_arrays
from fisher_ref.estimators.enumerated import enumerated_gradients
from fisher_ref.estimators.evaluation import loss_coefficients
from fisher_ref.estimators.gradient import expected_loss_gradient, group_gradients
from fisher_ref.estimators.groups import response_table
from fisher_ref.estimators.trainers import trl_advantages, trl_loss
from fisher_ref.estimators.trl_reference import reference_refusal, trl_reference_loss
from fisher_ref.estimators.trl_settings import trl_refusals
from fisher_ref.verdict import Verdict

__all__ = ["TrainerTarget", "RunVerdict", "trl_task", "trl_expected", "TrainerLossVerdict",
           "check_trainer_loss"]


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
        values = [f(prompts=[prompt], completions=text, completion_ids=[ids],
                    trainer_state=trainer.state, log_extra=lambda *a, **k: None,
                    log_metric=lambda *a, **k: None, **extra)[0] for f in funcs]
        per = torch.tensor([math.nan if v is None else float(v) for v in values],
                           dtype=torch.float32)  # None: NaN, as TRL reads it
        return float((per * weights).nansum())
    return reward


@dataclass
class TrainerTarget:
    """What one optimizer step of a trainer should apply.

    Attributes:
        task: the :class:`fisher_ref.tasks.Task` (a copy of the trainer's model, its prompt,
            its rewards).
        loss: ``loss(batch)`` of one step: TRL's formula as fisher_ref writes it
            (:func:`fisher_ref.estimators.trl_reference.trl_reference_loss`), or TRL's own
            ``_compute_loss`` (:func:`fisher_ref.estimators.trainers.trl_loss`) for a
            loss type not written there.
        group_size, groups_per_batch: ``G`` and ``K`` of one optimizer step.
        exact: the :class:`fisher_ref.estimators.LossGradient` of one step.
        distribution: ``(gradients (N, P), probabilities (N,))`` of one step, or ``None``.
        names: the trained parameters in the trainer's order (a recorder's ``names``).
        reference: which code states the loss: fisher_ref's (a bug inside the trainer's
            loss method then shows) or TRL's own (it then cannot).
    """

    task: object
    loss: object
    group_size: int
    groups_per_batch: int
    exact: object = None
    distribution: tuple | None = None
    names: list | None = None
    reference: str = ""

    def check(self, samples, *, alpha=1e-6):
        """Judge the applied gradients ``samples`` (a recorder, or ``(steps, P)``): the
        per-parameter test and, with the ``distribution``, the covariance test, each at
        ``alpha / 2`` (Bennett's bound: a correct run fails with probability at most
        ``alpha``). Returns a :class:`RunVerdict`."""
        from fisher_ref.testing import check_applied_covariance, check_applied_gradient
        layout = getattr(samples, "layout", None) or self.task.model.layout()
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
    """The :class:`TrainerTarget` of a ``trl.GRPOTrainer`` without its exact gradient (task,
    loss, ``G``, ``K``, names), refusing what it cannot mirror. The loss is
    :func:`fisher_ref.estimators.trl_reference.trl_reference_loss` (TRL's formula, no TRL
    code) where the settings are within it, else TRL's own ``_compute_loss``
    (:func:`fisher_ref.estimators.trainers.trl_loss`); ``reference`` says which.

    Raises:
        ValueError: the refusals of
            :func:`fisher_ref.estimators.trl_settings.trl_refusals`, joined; a dataset of several
            distinct prompts or of conversational ones; a reward model.
    """
    from fisher_ref.torch import causal_lm_task
    args, model = trainer.args, trainer.model
    bad = trl_refusals(args, model, trainer)
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
    outside = reference_refusal(args)
    if outside is None:
        loss = trl_reference_loss(args.loss_type, args.scale_rewards, args.max_completion_length)
        reference = "fisher_ref (TRL's formula, written without TRL's code)"
    else:
        loss_args = copy.copy(args)  # the step's K groups as one batch (see the module)
        loss_args.gradient_accumulation_steps = loss_args.steps_per_generation = 1
        loss = trl_loss(config=loss_args)
        reference = f"TRL's own _compute_loss ({outside} is not written in fisher_ref)"
    return TrainerTarget(task=task, loss=loss, group_size=G, groups_per_batch=K, names=names,
                         reference=reference)


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
    target = trl_task(trainer)
    task, loss, G = target.task, target.loss, target.group_size
    opts = dict(symmetric=True, groups_per_batch=target.groups_per_batch, pad="longest",
                **kwargs)
    target.exact = expected_loss_gradient(task, loss, G, covariance=covariance or distribution,
                                          **opts)
    target.distribution = enumerated_gradients(task, loss, G, **opts) if distribution else None
    return target


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


def _informative_groups(table, pr, G, groups, seed):
    """``(groups, G)`` response indices of groups whose rewards are not all equal (a group
    of equal rewards has advantages 0 and a zero gradient: it tests nothing), drawn
    uniformly among such groups with ``seed``."""
    rng = np.random.default_rng(seed)
    found = []
    for _ in range(1000):
        idx = rng.integers(0, len(pr), size=(64, G))  # (64, G)
        r = group_arrays(table, pr, idx)["rewards"]  # (64, G)
        keep = idx[np.ptp(r, axis=1) > 0]
        found.extend(keep.tolist())
        if len(found) >= groups:
            return np.array(found[:groups])
    raise ValueError(f"no group of {G} completions with unequal rewards among 64,000 drawn: "
                     f"every group's gradient is 0, so the loss method cannot be checked")


def check_trainer_loss(trainer, *, groups=4, seed=0, rtol=1e-6):
    r"""The trainer's own loss computation (its ``_compute_loss``, its log-prob recompute and
    its model's forward) on fixed groups of enumerated completions, against the exact
    gradient of each group under TRL's formula as fisher_ref writes it
    (:func:`fisher_ref.estimators.trl_reference.trl_reference_loss`, no TRL code). Seconds,
    no sampling: it separates a bug or a precision loss in the loss computation from a bug in
    the pipeline around it (sampling, masks, advantages, accumulation) before any
    statistical test.

    Each group is fed as a whole step (``current_gradient_accumulation_steps = 1``,
    ``steps_per_generation = 1``, ``num_items_in_batch`` its tokens, the advantages of
    :func:`fisher_ref.estimators.trainers.trl_advantages`) twice: as the trainer runs it,
    under its accelerator's autocast (bf16 when ``GRPOConfig.bf16``, TRL's default), and in
    float64 with autocast off (:func:`fisher_ref.torch.precision.run_dtype`). When only the
    first misses ``rtol``, the cause named is the precision (the bf16 or fp16 autocast, or
    the model's casts below float64); when both do, the loss computation itself.

    Args:
        trainer: a ``trl.GRPOTrainer`` whose settings pass
            :func:`fisher_ref.estimators.trl_settings.trl_refusals` once its
            ``bf16``, ``fp16``, ``learning_rate`` and ``max_grad_norm`` are set aside (the
            check runs no optimizer step), with a loss type fisher_ref writes
            (:data:`fisher_ref.estimators.trl_reference.REFERENCE_LOSS_TYPES`).
        groups: how many groups of ``num_generations`` completions with unequal rewards,
            drawn uniformly among those with ``seed``.
        rtol: the largest relative error (max-norm, per group) accepted.

    Returns:
        :class:`TrainerLossVerdict`.

    Raises:
        ValueError: a setting refused, a loss type not written in fisher_ref, or no group
            with unequal rewards (every gradient 0: nothing to check).
    """
    from fisher_ref.torch.precision import run_dtype
    args = trainer.args
    precision = [f"{n}=True" for n in ("bf16", "fp16") if getattr(args, n, False)]
    shadow = copy.copy(args)  # build the task from the settings the check can mirror
    shadow.bf16, shadow.fp16, shadow.learning_rate, shadow.max_grad_norm = False, False, 0.0, 0.0
    outside = reference_refusal(args)
    if outside is not None:
        raise ValueError(f"check_trainer_loss compares with fisher_ref's own statement of "
                         f"TRL's loss, which does not cover {outside}")
    real = trainer.args
    trainer.args = shadow
    try:
        target = trl_task(trainer)
    finally:
        trainer.args = real
    task, loss, G, names = target.task, target.loss, target.group_size, target.names
    table = response_table(task)
    pr, prompt_ids = table.prompts[0], [int(t) for t in task.prompts[0]]
    idx = _informative_groups(table, pr, G, int(groups), seed)  # (groups, G)
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
                errs.append(np.abs(g - exact[k]).max() / np.abs(exact[k]).max())
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
                     " rounds the log-prob recompute; in float64 the loss computation is exact"
                     + (f"; set GRPOConfig({precision[0].split('=')[0]}=False)"
                        if precision else ""))
        else:
            cause = ("the loss computation itself (the loss method, the log-prob recompute or "
                     "the model's forward): it is off in float64 too")
    return TrainerLossVerdict(passed=passed, as_run=worst["as_run"], float64=worst["float64"],
                              groups=len(idx), rtol=float(rtol), cause=cause)
