r"""Ground truth for RL losses: the exact expected gradient of a trainer's torch loss.

``expected_loss_gradient(task, loss, group_size)`` enumerates every group of
responses and sums the loss gradient exactly (:mod:`.gradient`); the losses trainers
ship are presets over it (:mod:`.presets`); ``check_loss`` turns the numbers into a
verdict (:mod:`.check`); :mod:`.reduction` sums group estimators over reward classes.
Needs torch.
"""
from . import presets, reduction
from .batch import LossBatch
from .check import LossVerdict, check_loss
from .gradient import LossGradient, expected_loss_gradient

__all__ = ["LossBatch", "LossGradient", "LossVerdict", "check_loss", "expected_loss_gradient",
           "presets", "reduction"]
