"""Per-window arrays of the torch engine (fisher_ref.torch.window_cache): a cache that
holds one window at a time changes no result."""
import pytest

torch = pytest.importorskip("torch", reason="the torch engine needs torch (the torch extra)")

from fisher_ref import load_config  # noqa: E402
from fisher_ref.torch.exact import torch_exact  # noqa: E402
from tests.torch.test_exact import RTOL, _ref  # noqa: E402
from torch_checks import mismatches  # noqa: E402

pytestmark = pytest.mark.torch


def test_results_do_not_depend_on_the_window_cache(monkeypatch):
    import fisher_ref.torch.window_cache as tw
    monkeypatch.setattr(tw, "WINDOW_CACHE_BYTES", 1)  # one window at a time
    task = load_config("weighted_prompts")
    bad = mismatches(task, _ref(task), torch_exact(task, chunk=5), RTOL)
    assert not bad, bad
