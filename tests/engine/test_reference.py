"""The plain (reference) engine, the judge of the fast one (fisher_ref.engine.reference),
held to the brute force of tests/cases.py; tests/engine/test_fast.py holds the fast engine
to it quantity by quantity."""
import numpy as np

from cases import RTOL, brute_force, rel
from fisher_ref import exact, load_config
from tests.engine.test_fast import natural_scale


def test_reference_flag_runs_the_plain_engine():
    """``exact(reference=True)`` is the plain engine: held to the brute force of
    tests/cases.py (the fast engine is held to it above)."""
    task = load_config("no_eos")
    r, b = exact(task, reference=True, progress=False), brute_force(task)
    h = b["xi"].sum(axis=1)  # (M, P)
    assert rel(r.sequence_fisher, b["P"] @ h ** 2) <= RTOL
    assert rel(r.cross_terms, np.einsum("m,mup,mtp->utp", b["P"], b["xi"], b["xi"])) <= RTOL
    assert rel(r.gradient, b["P"] @ ((b["R"] - r.baseline)[:, None] * h),
               natural_scale(r.streams["policy"])) <= RTOL
