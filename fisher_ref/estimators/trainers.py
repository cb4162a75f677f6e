r"""A trainer's own loss code as a ``loss(batch)``: adapters from
:class:`fisher_ref.estimators.LossBatch` to the names and shapes TRL and verl read.

:func:`trl_loss` calls the installed ``trl.GRPOTrainer._compute_loss`` (the optional extra
``trainers``), the whole method as TRL ships it, on a small host object that holds the
attributes the method reads (built from a real ``trl.GRPOConfig``) and whose
``_get_per_token_logps_and_entropies`` returns the batch's log-probabilities instead of
running a model. The advantages TRL computes inside ``_generate_and_score_completions``
(a method that also samples and scores, so it cannot be called on its own) are
:func:`trl_advantages`, the same statements with TRL's own ``nanstd``.

:func:`verl_loss` calls verl's ``core_algos`` (an advantage estimator, a policy loss and
``agg_loss``) through the module passed in: verl's package does not install beside this
project's test environment (see ``docs/check/trainers.md``), so the glue is the recipe and
its tests pass a stand-in module.

The field names of each trainer (``per_token_logps``, ``log_prob``, ``action_log_probs``,
...) are tabled in ``docs/check/trainers.md``.
"""
from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import torch

__all__ = ["TRL_ADVANTAGE_EPS", "TRL_SCALE_REWARDS", "trl_advantages", "trl_loss",
           "verl_loss", "group_index"]

#: TRL's std epsilon in its GRPO advantage, ``(R - mean) / (std + 1e-4)``.
TRL_ADVANTAGE_EPS = 1e-4
#: TRL's ``scale_rewards`` options.
TRL_SCALE_REWARDS = ("group", "batch", "none")


def group_index(batch):
    """``(K·G,)`` int64 group of each row: the batch's ``groups`` when it has them, else
    one group of all ``B`` rows."""
    groups = getattr(batch, "groups", None)
    if groups is None:
        return torch.zeros(batch.rewards.shape[0], dtype=torch.int64)
    return torch.as_tensor(groups)


def _group_size(batch):
    """``(K, G)``: groups of consecutive rows, as TRL lays out a generation batch. Under
    ``vmap`` the ``groups`` of a :class:`fisher_ref.estimators.LossBatch` cannot be read
    as numbers; its ``groups_per_batch`` says ``K`` (its rows are consecutive by
    construction)."""
    idx = group_index(batch)
    B = idx.shape[0]
    try:
        K = int(idx.max()) + 1 if B else 0
    except RuntimeError:  # a batched tensor under vmap
        K = getattr(batch, "groups_per_batch", None)
        if not isinstance(K, int) or K < 1 or B % K:
            raise
        return K, B // K
    if K < 1 or B % K:
        raise ValueError(f"batch.groups must split the {B} rows into groups of one size, "
                         f"got {K} groups")
    G = B // K
    if not torch.equal(idx, torch.arange(K).repeat_interleave(G)):
        raise ValueError("batch.groups must list each group's rows consecutively "
                         "(0,..,0,1,..,1,..), as TRL's rewards.view(-1, num_generations) reads them")
    return K, G


def trl_advantages(rewards, num_generations, scale_rewards="group"):
    r"""TRL 1.16's GRPO advantage (``GRPOTrainer._generate_and_score_completions``,
    ``multi_objective_aggregation="sum_then_normalize"``, one reward function):

    .. math:: A_i = \frac{R_i - \bar R_{g(i)}}{s + 10^{-4}}

    with :math:`\bar R_g` the mean of row ``i``'s group of ``num_generations`` consecutive
    rows and :math:`s` TRL's ``nanstd`` (Bessel-corrected) of that group
    (``scale_rewards="group"``), of the whole batch (``"batch"``), or no division
    (``"none"``). TRL's ``nanstd`` takes its Bessel factor :math:`n/(n-1)` in float32
    (int64 / int64 in torch), so its std is off by up to ~3e-8 relative when that factor
    is not a float32 (``n = 4``: 4/3; ``n = 2, 3`` are exact); this mirror keeps it.

    Args:
        rewards: ``(K·G,)`` float tensor.
        num_generations: ``G``.
        scale_rewards: ``"group"``, ``"batch"`` or ``"none"``.

    Returns:
        ``(K·G,)`` advantages.
    """
    from trl.trainer.utils import nanstd
    if scale_rewards not in TRL_SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {TRL_SCALE_REWARDS}, got "
                         f"{scale_rewards!r}")
    G = int(num_generations)
    mean = torch.nanmean(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0)
    if scale_rewards in ("group", "none"):
        std = (nanstd(rewards.view(-1, G), dim=1).repeat_interleave(G, dim=0) if G > 1
               else torch.zeros_like(rewards))
    else:
        std = nanstd(rewards).expand_as(rewards) if rewards.numel() > 1 \
            else torch.zeros_like(rewards)
    adv = rewards - mean
    if scale_rewards != "none":
        adv = adv / (std + TRL_ADVANTAGE_EPS)
    return torch.nan_to_num(adv, nan=0.0)


class _Accelerator:
    """One process: TRL's collectives are the identity."""

    num_processes, process_index = 1, 0

    @staticmethod
    def gather(x):
        return x

    @staticmethod
    def gather_for_metrics(x):
        return x

    @staticmethod
    def reduce(x, reduction="sum"):
        return x

    @staticmethod
    def pad_across_processes(x, dim=0, pad_index=0):
        return x


class _MetricsSink(_Accelerator):
    """One process whose collectives return zeros of the per-row shape: in TRL 1.16's
    ``_compute_loss`` they feed only the logged metrics (which then call ``.item()``), so the
    loss is the same and ``torch.func.vmap`` can evaluate many groups at once."""

    @staticmethod
    def gather(x):
        return torch.zeros(x.shape, dtype=x.dtype)

    @staticmethod
    def reduce(x, reduction="sum"):
        return torch.zeros(x.shape, dtype=x.dtype)


def _trl_host(args, metrics):
    """An object with the attributes ``GRPOTrainer._compute_loss`` reads, set from ``args``
    as ``GRPOTrainer.__init__`` sets them, and TRL's own methods it calls."""
    from trl import GRPOTrainer
    ns = {name: GRPOTrainer.__dict__[name] for name in
          ("_compute_loss", "get_off_policy_mask", "get_high_entropy_mask", "get_gamma_weights")}

    def logps(self, model, input_ids, attention_mask, logits_to_keep, **kwargs):
        b = self._batch
        ent = -(torch.exp(b.logp_all) * b.logp_all).sum(-1)  # (B, T)
        return b.logp, ent, None
    ns["_get_per_token_logps_and_entropies"] = logps
    host = type("TRLLossHost", (), ns)()
    host.args = args
    for name in ("loss_type", "beta", "scale_rewards", "importance_sampling_level",
                 "off_policy_mask_threshold", "top_entropy_quantile", "max_completion_length",
                 "use_vllm", "vllm_importance_sampling_correction", "entropy_coef",
                 "use_adaptive_entropy", "num_generations"):
        setattr(host, name, getattr(args, name))
    host.epsilon_low = args.epsilon
    host.epsilon_high = args.epsilon_high if args.epsilon_high is not None else args.epsilon
    host._entropy_bonus_enabled = host.entropy_coef != 0.0 or host.use_adaptive_entropy
    host._last_world_entropy = float("inf")
    host._entropy_window_stats = None
    host.aux_loss_enabled = False
    host.current_gradient_accumulation_steps = 1
    host.model = SimpleNamespace(training=True)
    host.accelerator = _Accelerator() if metrics else _MetricsSink()
    host._metrics = {"train": defaultdict(list), "eval": defaultdict(list)}
    return host


#: GRPOConfig settings the adapter cannot mirror, with the value it needs.
_TRL_REFUSED = {"use_vllm": False, "gradient_accumulation_steps": 1,
                "steps_per_generation": 1, "use_adaptive_entropy": False,
                "multi_objective_aggregation": "sum_then_normalize"}


def trl_loss(loss_type="grpo", *, config=None, metrics=False, **config_kwargs):
    r"""TRL's GRPO loss as a ``loss(batch)``: the installed
    ``trl.GRPOTrainer._compute_loss`` on the batch, its advantages :func:`trl_advantages`.

    The batch's rows are TRL's generation batch of one optimizer step (no accumulation):
    ``num_generations`` is the group size (``B``, or ``B / K`` with the batch's
    ``groups``), ``num_items_in_batch = mask.sum()``, ``old_per_token_logps =
    old_logp`` (equal to ``logp.detach()`` at the first step, which is what TRL uses when it
    skips the recompute), ``ref_per_token_logps = ref_logp`` when ``beta != 0``, and
    ``max_completion_length`` defaults to the batch's ``T``.

    Args:
        loss_type: TRL's ``loss_type`` (``"grpo"``, ``"bnpo"``, ``"dr_grpo"``, ``"dapo"``,
            ``"cispo"``, ``"sapo"``, ...), when ``config`` is not given.
        config: a ``trl.GRPOConfig``; else one is built from ``loss_type`` and
            ``config_kwargs`` (``scale_rewards``, ``beta``, ``epsilon``, ...).
        metrics: run TRL's metric logging as written (its ``.item()`` calls make the
            groups go one at a time); by default its collectives return zeros, so that the
            loss, which does not read them, vectorises. Needs ``metrics=True``:
            ``top_entropy_quantile < 1`` (the entropy mask gathers entropies).

    Returns:
        ``loss(batch) -> torch scalar``; ``loss.config`` is the ``GRPOConfig`` used.

    Raises:
        ValueError: a setting the adapter does not mirror (vLLM, accumulation, a
            ``max_completion_length`` shorter than the batch's ``T``), naming it.
    """
    from trl import GRPOConfig
    auto_length = config is None and "max_completion_length" not in config_kwargs
    if config is None:
        config_kwargs.setdefault("report_to", "none")
        config_kwargs.setdefault("use_cpu", True)
        config_kwargs.setdefault("bf16", False)
        config = GRPOConfig(loss_type=loss_type, **config_kwargs)
    elif config_kwargs:
        raise TypeError(f"pass either config or its settings, not both: got "
                        f"{sorted(config_kwargs)} besides config")
    for name, need in _TRL_REFUSED.items():
        if getattr(config, name) != need:
            raise ValueError(f"trl_loss does not mirror GRPOConfig.{name}="
                             f"{getattr(config, name)!r}; set {name}={need!r}")
    if config.scale_rewards not in TRL_SCALE_REWARDS:
        raise ValueError(f"GRPOConfig.scale_rewards must be one of {TRL_SCALE_REWARDS}, got "
                         f"{config.scale_rewards!r}")
    if not metrics and config.top_entropy_quantile < 1.0:
        raise ValueError("GRPOConfig.top_entropy_quantile < 1 gathers the batch's entropies: "
                         "pass metrics=True")
    host = _trl_host(config, metrics)

    def loss(batch):
        K, G = _group_size(batch)
        T = batch.logp.shape[1]
        length = config.max_completion_length
        host.max_completion_length = T if auto_length else length
        if host.max_completion_length < T:
            raise ValueError(f"GRPOConfig.max_completion_length={length} is shorter than the "
                             f"batch's T={T}")
        if host.beta != 0.0 and batch.ref_logp is None:
            raise ValueError("GRPOConfig.beta != 0 needs a reference policy: add a "
                             "'reference' to the task")
        host.num_generations = G
        mask = batch.mask.to(torch.long)  # TRL's completion_mask is int64
        B = mask.shape[0]
        inputs = {"prompt_ids": torch.zeros((B, 0), dtype=torch.long),
                  "prompt_mask": torch.zeros((B, 0), dtype=torch.long),
                  "completion_ids": batch.tokens.clamp(min=0), "completion_mask": mask,
                  "advantages": trl_advantages(batch.rewards, G, config.scale_rewards).detach(),
                  "old_per_token_logps": batch.old_logp.detach(),
                  "sampling_per_token_logps": batch.sampler_logp.detach(),
                  "num_items_in_batch": mask.sum()}
        if host.beta != 0.0:
            inputs["ref_per_token_logps"] = batch.ref_logp.detach()
        host._batch = batch
        try:
            return host._compute_loss(host.model, inputs)
        finally:
            host._batch = None
    loss.__name__ = f"trl_{config.loss_type}"
    loss.config = config
    return loss


def verl_loss(core_algos, *, adv_estimator="grpo", policy_loss="vanilla",
              loss_agg_mode="token-mean", actor_config=None, **adv_kwargs):
    r"""verl's loss as a ``loss(batch)``, through its ``core_algos`` module (passed in:
    ``verl.trainer.ppo.core_algos``, or a stand-in with the same functions).

    The rewards go in as verl's ``token_level_rewards (B, T)``, the reward on the last
    token of each response; ``index`` is the batch's group of each row (verl's ``uid``);
    the advantage comes from ``core_algos.get_adv_estimator_fn(adv_estimator)``, the loss
    from ``core_algos.get_policy_loss_fn(policy_loss)`` with ``old_log_prob = old_logp``,
    ``log_prob = logp``, ``response_mask = mask`` and ``loss_agg_mode``.

    Args:
        core_algos: the module.
        adv_estimator, policy_loss, loss_agg_mode: verl's names.
        actor_config: what verl's policy loss reads as ``config`` (``clip_ratio``,
            ``global_batch_info``, ...), e.g. ``verl.workers.config.ActorConfig``.
        adv_kwargs: more arguments of the advantage estimator (``epsilon``,
            ``norm_adv_by_std_in_grpo``).

    Returns:
        ``loss(batch) -> torch scalar``.
    """
    adv_fn = core_algos.get_adv_estimator_fn(adv_estimator)
    pl_fn = core_algos.get_policy_loss_fn(policy_loss)

    def loss(batch):
        m = batch.mask.to(batch.logp.dtype)
        last = torch.nn.functional.one_hot(batch.lengths - 1, m.shape[1]).to(m.dtype)  # (B, T)
        token_level_rewards = batch.rewards[:, None] * last
        index = group_index(batch).numpy().astype(str).astype(object)
        adv, _ = adv_fn(token_level_rewards=token_level_rewards, response_mask=m, index=index,
                        **adv_kwargs)
        out, _ = pl_fn(old_log_prob=batch.old_logp.detach(), log_prob=batch.logp,
                       advantages=adv.detach(), response_mask=m, loss_agg_mode=loss_agg_mode,
                       config=actor_config)
        return out
    loss.__name__ = f"verl_{adv_estimator}_{policy_loss}_{loss_agg_mode}"
    return loss
