"""Lesson 8 (which RL estimator is unbiased?): a proof of every quiz's answer by an exact
computation (``PROOFS_08``, run by ``test_quizzes.test_correct_answer_is_proved``), and the
lesson's quizzes and exercises found through the one registry each.

Each proof establishes a fact with fisher_ref (the exact expected gradient of a loss, the
engine's policy gradient, or the independent autograd brute force of
``tests/estimators/brute.py``) and returns the phrase that states it; exactly one option of
the quiz, the stored answer, holds that phrase.
"""
import itertools
import math

import numpy as np
import pytest
import torch

import fisher_ref.teaching.lesson08 as lesson08
from fisher_ref import exact, load_config
from fisher_ref.estimators import clipped_share, expected_loss_gradient, presets
from fisher_ref.estimators.reduction import difficulty_weight
from fisher_ref.rewards import FunctionReward
from fisher_ref.samplers import make_sampler
from fisher_ref.teaching.exercises import EXERCISES, exercises_for
from fisher_ref.teaching.quizzes import QUIZZES, quizzes_for
from fisher_ref.engine.plan import EngineOptions

from tests.estimators.brute import state_kl_gradient, tiny_task

RTOL = 1e-10        # exact float64 identities
BIASED = 1e-3       # "biased": a relative bias far above rounding
STEM = lesson08.STEM


def _norm_rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def prove_which_ratio():
    """Off policy (stale and tempered), sequence IS has E[grad L] = -G exactly; the token and
    the prefix ratios are biased, and no 'per-token' weight (token, prefix) is exact."""
    for name in ("offpolicy_stale", "offpolicy_temperature"):
        task = load_config(name)
        G = exact(task, progress=False).gradient
        seq = expected_loss_gradient(task, presets.sequence_is(baseline=task.baseline))
        assert _norm_rel(-seq.mean, G) <= RTOL
        for make in (presets.token_is, presets.prefix_is):
            lg = expected_loss_gradient(task, make(baseline=task.baseline), policy_gradient=G)
            assert _norm_rel(-lg.mean, G) > BIASED and lg.relative_bias > BIASED
    return "The product of all the ratios"


def prove_tis_large_cap():
    """With the cap above every ratio, token TIS is token IS exactly, and token IS is biased;
    sequence TIS is then exact (so 'nothing left' describes the sequence level only)."""
    task = load_config("offpolicy_stale")
    G = exact(task, progress=False).gradient
    b0, cap = task.baseline, 1e9
    tis = expected_loss_gradient(task, presets.token_tis(cap, baseline=b0), policy_gradient=G)
    tok = expected_loss_gradient(task, presets.token_is(baseline=b0), policy_gradient=G)
    assert _norm_rel(tis.mean, tok.mean) <= RTOL and _norm_rel(-tok.mean, G) > BIASED
    seq = expected_loss_gradient(task, presets.sequence_tis(cap, baseline=b0), policy_gradient=G)
    assert _norm_rel(-seq.mean, G) <= RTOL
    small = expected_loss_gradient(task, presets.token_tis(2.0, baseline=b0), policy_gradient=G)
    assert _norm_rel(small.mean, tok.mean) > BIASED  # the cap did act below the ratios
    return "The bias of plain token IS"


def _grpo_weight_by_outcomes(gamma, B, eps=1e-6):
    """w_B(gamma) from all 2^B binary outcomes: E[A_1 (R_1 - gamma)] / (gamma (1 - gamma)),
    the advantage as torch computes it (unbiased std)."""
    total = 0.0
    for outcome in itertools.product((0.0, 1.0), repeat=B):
        R = torch.tensor(outcome, dtype=torch.float64)
        A1 = float((R[0] - R.mean()) / (R.std() + eps))
        k = sum(outcome)
        total += gamma ** k * (1 - gamma) ** (B - k) * A1 * (outcome[0] - gamma)
    return total / (gamma * (1 - gamma))


def prove_grpo_two():
    """w_2(gamma) = 1/sqrt(2) for every gamma, by all 4 outcomes and by the reduction; the
    large-B formula varies with gamma (it is not the B = 2 weight)."""
    for gamma in (0.01, 0.2, 0.5, 0.9):
        by_outcomes = _grpo_weight_by_outcomes(gamma, 2)
        assert abs(by_outcomes - 2 ** -0.5) <= 1e-6
        assert abs(difficulty_weight(gamma, 2) - by_outcomes) <= 1e-12
    assert abs(1 / math.sqrt(0.01 * 0.99) - 1 / math.sqrt(0.25)) > 1
    return "the same for every"


def _length_task(R0):
    """The default model with reward (count of token 2 - R0) / L, L the length EOS included."""
    base = load_config("default")
    return base, base.with_(reward=FunctionReward(
        lambda prompt, y: (float(np.sum(np.asarray(y) == 2)) - R0) / len(y)))


def prove_length_objective():
    """seq-mean-token-mean with A = R - R0 has E[grad L] = -grad E_p[(R - R0)/L] (the engine's
    exact policy gradient of that reward), not parallel to G, and not grad(E[R]/E[L])."""
    R0 = 2.0
    base, per_length = _length_task(R0)
    loss = presets.policy_gradient_loss("constant", aggregation="seq-mean-token-mean",
                                        baseline=R0)
    lg = expected_loss_gradient(base, loss)
    target = exact(per_length, progress=False).gradient
    assert _norm_rel(-lg.mean, target) <= RTOL
    assert lg.relative_bias > BIASED  # not -omega G for any omega
    lengths = base.with_(reward=FunctionReward(lambda prompt, y: float(len(y))))
    rR, rL = exact(base, progress=False), exact(lengths, progress=False)
    ER = rR.sequences["prob"] @ rR.sequences["reward"]
    EL = rL.sequences["prob"] @ rL.sequences["reward"]
    ratio_grad = (rR.gradient * EL - ER * rL.gradient) / EL ** 2
    assert _norm_rel(-lg.mean, ratio_grad) > BIASED
    return "$E_p[(R - R_0)/L]$"


def prove_k3_direction():
    """k3 in the loss, on policy: E[grad L] is the states-held-fixed gradient of the forward
    KL, by the independent autograd brute force; not the reverse one, not zero, not the
    sequence KL."""
    for ref in ({"kind": "perturbed", "scale": 0.5, "seed": 5},
                {"kind": "temperature", "temperature": 2.0}):
        task = tiny_task(reference=ref)                              # on policy
        lg = expected_loss_gradient(task, presets.kl_loss("k3"))
        assert _norm_rel(lg.mean, state_kl_gradient(task, "forward")) <= RTOL
        assert _norm_rel(lg.mean, state_kl_gradient(task, "reverse")) > BIASED
        assert _norm_rel(lg.mean, lg.kl_gradient) > BIASED and np.abs(lg.mean).max() > BIASED
    return "the forward KL"


def prove_centering_or_is():
    """On the temperature sampler sequence IS has no bias and the smaller relative variance,
    so its relative MSE b^2 + v/n is the smaller at every n; its ratios are below 1.6. On the
    stale sampler centering wins at n = 1 (the crossover the option 'small n' describes)."""
    def parts(lg):
        scale = (lg.scale * np.linalg.norm(lg.policy_gradient)) ** 2
        return lg.relative_bias ** 2, lg.variance_trace / scale

    out = {}
    for name in ("offpolicy_temperature", "offpolicy_stale"):
        task = load_config(name)
        out[name] = [parts(expected_loss_gradient(task, make)) for make in (
            presets.centered(task.baseline), presets.sequence_is(baseline=task.baseline))]
    (bc, vc), (bs, vs) = out["offpolicy_temperature"]
    assert bs <= RTOL < BIASED < bc and vs < vc
    s = exact(load_config("offpolicy_temperature"), progress=False,
              options=EngineOptions(keep_sequences=True)).sequences
    assert (s["prob"] / s["sampler_prob"]).max() < 1.6
    (bc, vc), (bs, vs) = out["offpolicy_stale"]
    assert bc + vc < bs + vs and bs < bc  # centering at n = 1, IS for large n
    return "Sequence IS at every"


def prove_token_mean_batches():
    """REINFORCE (G = 1) with token-mean on tabular: relative bias 0.19 per group, K times
    the bias at K = 2..5 within 20 % of the bias at K = 1 (about 1/K), a 1/sqrt(K) law
    ruled out (bias(1)/bias(4) > 3 > 2), decreasing in K, and zero at the large-batch
    limit."""
    task = load_config("tabular")
    G = exact(task, progress=False).gradient

    def bias(aggregation, K=1):
        loss = presets.policy_gradient_loss("constant", aggregation=aggregation)
        return expected_loss_gradient(task, loss, 1, symmetric=True, groups_per_batch=K,
                                      policy_gradient=G).relative_bias
    b = {K: bias("token-mean", K) for K in range(1, 6)}
    assert round(b[1], 2) == 0.19
    assert all(b[K + 1] < b[K] for K in range(1, 5))
    assert all(abs(K * b[K] / b[1] - 1) < 0.2 for K in range(2, 6))
    assert b[1] / b[4] > 3
    assert bias("token-mean-limit") <= RTOL
    return "about like $1/K$"


def _ppo_later(clip, scale=0.5):
    task = load_config("tabular")
    task = task.with_(sampler=make_sampler({"kind": "perturbed", "scale": scale, "seed": 1}),
                      old_policy="sampler")
    loss = presets.ppo_clip(advantage="rloo", aggregation="token-mean-limit", clip=clip)
    return expected_loss_gradient(task, loss, 2, symmetric=True)


def prove_ppo_clip_later():
    """At scale 0.5 the clipped PPO loss's relative bias is over ten times the unclipped
    one's (0.18 against 0.015, as the feedback says), so it is not a rescaling and it removes
    no bias; the clipped share is far from 0; at scale 0 (the first step) the clip changes
    nothing and the loss is unbiased up to scale."""
    clipped, free = _ppo_later(True), _ppo_later(False)
    assert clipped.relative_bias > 10 * free.relative_bias > 10 * BIASED
    assert round(free.relative_bias, 3) == 0.015 and round(clipped.relative_bias, 2) == 0.18
    assert abs(clipped_share(clipped, free)) > 0.1
    first_c, first_u = _ppo_later(True, 0.0), _ppo_later(False, 0.0)
    assert _norm_rel(first_c.mean, first_u.mean) <= RTOL and first_c.relative_bias <= RTOL
    return "relative bias grows more than tenfold"


PROOFS_08 = {
    "which-ratio": prove_which_ratio,
    "tis-large-cap": prove_tis_large_cap,
    "grpo-two": prove_grpo_two,
    "length-objective": prove_length_objective,
    "k3-direction": prove_k3_direction,
    "centering-or-is": prove_centering_or_is,
    "token-mean-batches": prove_token_mean_batches,
    "ppo-clip-later": prove_ppo_clip_later,
}


def test_lesson_8_quizzes_are_registered_in_order():
    ids = [row[0] for row in lesson08.QUIZ_ROWS]
    assert [q.id for q in quizzes_for(STEM)] == ids == list(PROOFS_08)
    assert all(QUIZZES[i].lesson == STEM for i in ids)


def test_lesson_8_exercises_are_registered_in_order():
    ids = [e.id for e in lesson08.EXERCISES]
    assert len(ids) >= 2 and [e.id for e in exercises_for(STEM)] == ids
    assert all(EXERCISES[i] is e for i, e in zip(ids, lesson08.EXERCISES))


@pytest.mark.parametrize("ex_id", [e.id for e in lesson08.EXERCISES])
def test_lesson_8_checkers_are_tight(ex_id):
    """The solution passes; the same answer off by one part in a million does not (each
    reference is exact, by its own route: all 2^B outcomes, J (p - ref), two values of mse)."""
    ex = EXERCISES[ex_id]
    ns = {}
    exec(compile(ex.setup + "\n" + ex.solution, "<exercise>", "exec"), ns)
    value = np.asarray(ns[ex.answer], dtype=float)
    assert ex.judge(value, ns)[0] is True
    assert ex.judge(value * (1 + 1e-6), ns)[0] is False


def test_lesson_8_module_stays_light():
    """Registering lesson 8 in the quiz registry imports neither torch nor the estimators."""
    import subprocess
    import sys
    code = ("import sys, fisher_ref.teaching.quizzes, fisher_ref.teaching.lesson08; "
            "print('torch' in sys.modules, 'fisher_ref.estimators' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["False", "False"]
