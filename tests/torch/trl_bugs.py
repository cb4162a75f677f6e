r"""Known pipeline bugs, monkeypatched into the installed ``trl.GRPOTrainer`` for as long as
a ``with`` block lasts, in the tests only (TRL itself is never changed): a check of a
trainer's applied gradient should catch each of them (``test_trl_end_to_end.py`` holds
fisher_ref's checks to that, and ``benchmarks/estimators/trainer_power.py`` measures how
many steps each takes). None of them can be written as a loss over
:class:`fisher_ref.estimators.LossBatch`: they live in the pipeline around the loss.

Example (not run here)::

    with inject_trl_bug("token_after_eos_in_mask"):
        trainer.train()
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["TRL_BUGS", "inject_trl_bug"]


def _logprobs_one_position_early(cls):
    original = cls._get_per_token_logps_and_entropies

    def shifted(self, *args, **kwargs):
        logps, ent, aux = original(self, *args, **kwargs)
        return torch.nn.functional.pad(logps[:, 1:], (0, 1)), ent, aux
    return "_get_per_token_logps_and_entropies", shifted


def _token_after_eos_in_mask(cls):
    original = cls._generate_and_score_completions

    def leaky(self, *args, **kwargs):
        out = original(self, *args, **kwargs)
        m = out["completion_mask"]  # (B, T)
        out["completion_mask"] = torch.maximum(m, torch.nn.functional.pad(m[:, :-1], (1, 0)))
        return out
    return "_generate_and_score_completions", leaky


def _advantages_not_divided_by_std(cls):
    original = cls._generate_and_score_completions

    def undivided(self, *args, **kwargs):
        saved = self.scale_rewards
        self.scale_rewards = "none"
        try:
            return original(self, *args, **kwargs)
        finally:
            self.scale_rewards = saved
    return "_generate_and_score_completions", undivided


#: The bugs by name: what each does to the step's gradient.
TRL_BUGS = {
    "logprobs_one_position_early": (
        "the per-token log-probs misaligned by one position: each completion token's slot "
        "holds the next token's log-prob, the last slot 0", _logprobs_one_position_early),
    "token_after_eos_in_mask": (
        "the completion mask keeps one more position after the first EOS (the padding "
        "token's log-prob enters the loss)", _token_after_eos_in_mask),
    "advantages_not_divided_by_std": (
        "the advantages centred but not divided by their group's std (TRL's own "
        "scale_rewards='none' branch, taken while the config says 'group')",
        _advantages_not_divided_by_std),
}


@contextlib.contextmanager
def inject_trl_bug(name):
    """Patch ``trl.GRPOTrainer`` with the bug ``name`` (a key of :data:`TRL_BUGS`) inside
    the block; the original method is restored on exit, error or not.

    Raises:
        ValueError: an unknown name.
    """
    from trl import GRPOTrainer
    if name not in TRL_BUGS:
        raise ValueError(f"unknown bug {name!r}; known: {', '.join(TRL_BUGS)}")
    attr, patched = TRL_BUGS[name][1](GRPOTrainer)
    original = GRPOTrainer.__dict__[attr]
    setattr(GRPOTrainer, attr, patched)
    try:
        yield
    finally:
        setattr(GRPOTrainer, attr, original)
