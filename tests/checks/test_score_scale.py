"""The state-level score scale (fisher_ref.checks.score_scale): a centering error of 1e-6
of it still fails verify, it is the same whether the states were kept or the windows are
recomputed, and the distinct windows are those of every state."""
import numpy as np
import pytest

from fisher_ref import exact, load_config
from fisher_ref.checks.identities import exact_checks
from fisher_ref.checks.score_scale import distinct_windows, state_score_scale
from fisher_ref.engine.plan import EngineOptions


def test_zero_mean_row_still_catches_a_centering_error(monkeypatch):
    """The state-level scale is no excuse: E[xi|s] off by 1e-6 of it fails."""
    r = exact(load_config("default"), progress=False)
    pol = r.streams["policy"]
    pol.cond_score_max = pol.cond_score_max + 1e-6 * np.sqrt(state_score_scale(r))
    row = next(x for x in exact_checks(r) if x.check.startswith("max_s |E[xi|s]|"))
    assert not row.passed and row.value > 1e-7


def test_the_score_scale_does_not_depend_on_what_is_kept():
    for name in ("default", "offpolicy_temperature", "gpt2_small", "no_eos"):
        t = load_config(name)
        kept = exact(t, progress=False, options=EngineOptions(keep_states=True))
        bare = exact(t, progress=False,
                     options=EngineOptions(keep_states=False, keep_sequences=False))
        assert state_score_scale(bare) == pytest.approx(state_score_scale(kept), rel=1e-12)
        assert all(r.passed for r in exact_checks(bare)), name


@pytest.mark.parametrize("name", ["default", "weighted_prompts", "no_eos", "gpt2_small"])
def test_distinct_windows_are_the_windows_of_every_state(name):
    task = load_config(name)
    st = exact(task, progress=False, options=EngineOptions(keep_states=True)).states
    tokens = st["tokens"]  # (N, L) -1 padded
    W = task.model.windows(tokens, (tokens >= 0).sum(axis=1))
    assert np.array_equal(distinct_windows(task), np.unique(W, axis=0))
