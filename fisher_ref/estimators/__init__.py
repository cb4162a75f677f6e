r"""Ground truth for RL losses: the exact expected gradient of a trainer's torch loss.

``expected_loss_gradient(task, loss, group_size, groups_per_batch=K)`` enumerates every
batch of ``K`` groups of responses and sums the loss gradient exactly (:mod:`.gradient`;
:mod:`.batch` is what the loss reads, :mod:`.audit` what the user is told); the losses trainers
ship are presets over it (:mod:`.presets`); ``check_loss`` turns the numbers into a
verdict (:mod:`.check`); :mod:`.reduction` sums group estimators over reward classes;
``enumerated_gradients`` lists every batch's gradient and probability (:mod:`.enumerated`);
``trl_expected`` and ``check_trainer_loss`` read the target of one optimizer step and a
check of the loss method from a built ``trl.GRPOTrainer`` (:mod:`.trl_run`, TRL needed only
there). Needs torch.
"""
from . import presets, reduction
from .audit import VmapFallbackWarning
from .batch import BatchLimit, LossBatch
from .check import LossVerdict, check_loss
from .enumerated import enumerated_gradients
from .gradient import LossGradient, clipped_share, expected_loss_gradient
from .trl_run import TrainerLossVerdict, TrainerTarget, check_trainer_loss, trl_expected
from .trl_settings import trl_refusals

__all__ = ["BatchLimit", "LossBatch", "LossGradient", "LossVerdict", "VmapFallbackWarning",
           "check_loss", "clipped_share", "enumerated_gradients", "expected_loss_gradient", "presets",
           "reduction", "TrainerLossVerdict", "TrainerTarget", "check_trainer_loss",
           "trl_expected", "trl_refusals"]
