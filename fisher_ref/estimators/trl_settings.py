r"""The settings of a TRL ``GRPOTrainer`` run that fisher_ref cannot mirror, each named with
the reason and the value it needs: :func:`trl_refusals`."""
from __future__ import annotations

import torch

__all__ = ["trl_refusals"]


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


def trl_refusals(args, model=None, trainer=None):
    """The settings of a ``GRPOConfig`` (and of the model, and of the built trainer: its
    generation config, processes and tools) fisher_ref cannot mirror, each as
    ``"name=value: why; set name=need"``; empty when the run can be held to the exact
    gradient."""
    out = [f"{name}={value!r}: {why}; set {name}={need!r}"
           for name, value, need, why in _float_settings(args) if value != need]
    if getattr(args, "generation_kwargs", None):
        out.append(f"generation_kwargs={args.generation_kwargs!r}: the sampler would not be "
                   f"the model's policy; set generation_kwargs=None")
    if args.delta is not None:
        out.append(f"delta={args.delta!r}: the two-sided clip bounds the ratio; set None")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        out.append(f"entropy_coef={args.entropy_coef!r}: the entropy bonus is not mirrored; "
                   f"set entropy_coef=0.0 (and use_adaptive_entropy=False)")
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
        drop = _dropout(model)
        if drop:
            out.append(f"dropout {drop}: training-mode dropout makes the policy random; use "
                       f"a model without dropout")
        low = sorted({str(p.dtype) for p in model.parameters() if p.dtype != torch.float64})
        if low:
            out.append(f"model parameters in {', '.join(low)}: the exact gradient is float64 "
                       f"and the test would measure the rounding; load the model in float64")
    if trainer is not None:
        out += _trainer_refusals(trainer, args)
    return out


#: Generation settings that leave the sampler the model's policy (with their neutral
#: values where they have one), besides the ids and bookkeeping keys.
_NEUTRAL_GENERATION = {"do_sample": True, "temperature": 1.0, "top_k": (0, None),
                       "top_p": (1.0, None), "min_p": (0.0, None), "repetition_penalty": 1.0}
_BOOKKEEPING = {"max_new_tokens", "pad_token_id", "eos_token_id", "bos_token_id",
                "disable_compile", "transformers_version", "use_cache",
                "cache_implementation", "return_dict_in_generate", "output_scores",
                "output_logits"}


def _dropout(model):
    """``"name=p, ..."`` of the dropout probabilities above 0 (config and modules)."""
    config = getattr(model, "config", None)
    found = {k: v for k, v in (config.to_dict() if config is not None else {}).items()
             if "dropout" in k and isinstance(v, (int, float)) and v > 0}
    found.update({n: m.p for n, m in model.named_modules()
                  if isinstance(m, torch.nn.Dropout) and m.p > 0})
    return ", ".join(f"{k}={v}" for k, v in found.items())


def _trainer_refusals(trainer, args):
    """What the built trainer adds: its generation config, processes and tools."""
    out = []
    config = getattr(trainer, "generation_config", None)
    for key, value in (config.to_diff_dict() if config is not None else {}).items():
        neutral = _NEUTRAL_GENERATION.get(key)
        ok = (key in _BOOKKEEPING or (isinstance(neutral, tuple) and value in neutral)
              or (neutral is not None and value == neutral))
        if key == "max_new_tokens" and value != args.max_completion_length:
            ok = False
        if not ok:
            out.append(f"generation_config.{key}={value!r}: the sampler would not be the "
                       f"model's policy (or not max_completion_length tokens)")
    processes = getattr(getattr(trainer, "accelerator", None), "num_processes", 1)
    if processes != 1:
        out.append(f"num_processes={processes}: one process only (the step's groups would "
                   f"be split and gathered)")
    if getattr(trainer, "tools", None) or getattr(trainer, "environments", None):
        out.append("tools: tool calls insert tokens the policy does not sample; none")
    return out
