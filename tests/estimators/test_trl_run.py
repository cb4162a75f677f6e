"""fisher_ref.estimators.trl_run on a real TRL GRPOTrainer: check_trainer_loss (passes in
float64, sees a bug inside the loss computation, refuses groups that test nothing), the
target read from the trainer (the hand-built one, TRL's own code for a loss type fisher_ref
does not write, a reward of None), and TrainerTarget.check on an array. The end-to-end
runs are in tests/torch/test_trl_end_to_end.py, whose helpers these use."""
import warnings

import numpy as np
import pytest

from fisher_ref.estimators import check_trainer_loss, trl_expected, trl_refusals
from fisher_ref.torch import GradientRecorder
from fisher_ref.torch.tiny import tiny_llama

from ..torch.test_trl_end_to_end import G, MODEL, T, V, grpo_args, make_trainer, reward_func
from ..torch.trl_bugs import inject_trl_bug


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.mark.parametrize("loss_type", ["grpo", "dr_grpo", "dapo", "bnpo"])
def test_trainer_loss_check_passes_in_float64(loss_type):
    v = check_trainer_loss(make_trainer(grpo_args(loss_type)))
    assert v and v.as_run <= 1e-6 and v.float64 <= 1e-10, v.message
    assert "PASS" in v.message and v.groups == 4


def test_trainer_loss_check_sees_a_bug_inside_the_loss_computation(monkeypatch):
    """A bug inside TRL's own _compute_loss (half the loss) and one in its log-prob
    recompute are both named as the loss computation's: the reference shares no TRL code."""
    from trl import GRPOTrainer
    original = GRPOTrainer._compute_loss
    monkeypatch.setattr(GRPOTrainer, "_compute_loss",
                        lambda self, *a, **k: 0.5 * original(self, *a, **k))
    v = check_trainer_loss(make_trainer(grpo_args("grpo")))
    assert not v and abs(v.float64 - 0.5) < 1e-6 and "loss computation itself" in v.cause
    monkeypatch.undo()
    with inject_trl_bug("logprobs_one_position_early"):
        v = check_trainer_loss(make_trainer(grpo_args("grpo")))
    assert not v and "log-prob recompute" in v.cause, v.message


def test_trainer_loss_check_refuses_what_tests_nothing():
    """A reward that never differs within a group gives every group a zero gradient: the
    check refuses rather than pass on zeros; a loss type fisher_ref does not write is
    refused too."""
    with pytest.raises(ValueError, match="unequal rewards"):
        check_trainer_loss(make_trainer(grpo_args(), reward=lambda completion_ids, **k:
                                        [1.0] * len(completion_ids)))
    with pytest.raises(ValueError, match="sapo"):
        check_trainer_loss(make_trainer(grpo_args("sapo")))


def test_a_loss_type_fisher_ref_does_not_write_is_held_to_trls_own_code():
    target = trl_expected(make_trainer(grpo_args("sapo")))
    assert target.reference.startswith("TRL's own") and "sapo" in target.reference


def test_a_clean_config_has_no_refusal_and_the_target_is_the_hand_built_one():
    from fisher_ref.estimators import expected_loss_gradient
    from fisher_ref.estimators.trainers import trl_loss
    from fisher_ref.torch import causal_lm_task
    trainer = make_trainer(grpo_args("dr_grpo"))
    assert trl_refusals(trainer.args, trainer.model) == []
    target = trl_expected(trainer)

    def reward(p, r):
        return reward_func(None, None, [list(r)])[0]
    task = causal_lm_task(tiny_llama(V, **MODEL), [[1]], T, reward, vocab_size=V, eos=True)
    hand = expected_loss_gradient(task, trl_loss("dr_grpo"), G, symmetric=True)
    assert np.abs(target.exact.mean - hand.mean).max() <= 1e-12 * np.abs(hand.mean).max()


def test_a_reward_of_none_is_read_as_trl_reads_it():
    """TRL reads None as NaN and sums the reward functions with nansum: a completion whose
    only reward is None scores 0."""
    def sparse(completion_ids, **kwargs):
        return [None if 2 in c else float(sum(t == 1 for t in c)) for c in completion_ids]
    target = trl_expected(make_trainer(grpo_args(), reward=sparse))
    assert target.task.reward((1,), (2, 0)) == 0.0 and target.task.reward((1,), (1, 0)) == 1.0


def test_target_check_takes_an_array_and_names_its_parameters():
    trainer = make_trainer(grpo_args("grpo", 40), callbacks=[rec := GradientRecorder()])
    target = trl_expected(trainer)
    trainer.train()
    v = target.check(rec.samples())
    assert v.per_parameter.worst[0][0].split("[")[0] in rec.names, v.message
