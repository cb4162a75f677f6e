r"""What each side of ``python -m fisher_ref bench`` runs: a function ``task -> zero-argument
callable`` per measurement (:data:`MEASUREMENTS`), what each computes (:data:`WORK`), and
which of them apply to a task (:func:`measurements`).

- ``fisher_ref`` — :func:`fisher_ref.exact.exact` (numpy, CPU, float64);
- ``torch_cpu_float64`` — :func:`fisher_ref.torch.exact.torch_exact` on the CPU in
  float64: the same enumeration and the same quantities;
- ``torch_cuda_float64`` — the same on CUDA, synchronised, when present;
- ``torch_peer`` — when ``benchmarks/speed/peer.py`` exists in the checkout and the model
  is the MLP: an independent minimal torch implementation of ``F``, ``E[h]`` and the
  token Fisher per state only;
- ``fisher_ref_fisher`` — with the peer: ``exact(task, quantities="fisher")``, the numpy
  engine doing the peer's work (:data:`LIKE_FOR_LIKE`).
"""
from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

__all__ = ["MEASUREMENTS", "WORK", "LIKE_FOR_LIKE", "REFERENCE", "NUMPY_SIDES", "PEER_SCRIPT",
           "measure_fisher_ref", "measure_fisher_only", "measure_peer", "peer_available",
           "measurements"]

#: the side every other is compared with
REFERENCE = "fisher_ref"
#: the independent torch peer of a source checkout (``--peer PATH`` names another)
PEER_SCRIPT = Path(str(resources.files("fisher_ref"))).parent / "benchmarks" / "speed" / "peer.py"
WORK = {
    "fisher_ref": "every quantity: all streams, E[h^4], cross terms and their 4th moments, "
                  "exact variances, autodiff gradient, per-state and per-response arrays",
    "torch_cpu_float64": "the same quantities as fisher_ref",
    "torch_cuda_float64": "the same quantities as fisher_ref",
    "torch_peer": "F, E[h] and the token Fisher per state only (benchmarks/speed/peer.py)",
    "fisher_ref_fisher": "quantities='fisher' on the policy stream (the sampler dropped, as "
                         "the peer ignores it): E[h], E[h^2], token_fisher_sum and by depth, "
                         "the token Fisher per state formed (the uniform Fisher and E[xi|s] "
                         "kept per window)",
}
#: For a measurement that does less than fisher_ref, the fisher_ref measurement doing the
#: same work: ``ratio_like[name] = median(LIKE_FOR_LIKE[name]) / median(name)``.
LIKE_FOR_LIKE = {"torch_peer": "fisher_ref_fisher"}
NUMPY_SIDES = (REFERENCE, "fisher_ref_fisher")


def measure_fisher_ref(task):
    """``exact(task)`` — the numpy engine, CPU float64, with every per-state array formed
    (as the torch engine stores them)."""
    from fisher_ref.parallel.run import exact
    return lambda: exact(task, progress=False, workers=1).gathered()


def measure_fisher_only(task):
    """``exact(task, quantities="fisher")`` on the policy stream with its per-state token
    Fisher formed: the peer's work and output. The peer reads no sampler, so neither does
    this side: an off-policy task is timed without its sampler."""
    from fisher_ref.parallel.run import exact
    task = task.with_(sampler=None) if task.sampler is not None else task
    return lambda: exact(task, progress=False, quantities="fisher", workers=1).states["token_fisher"]


def _measure_torch(device):
    def make(task):
        import torch
        from fisher_ref.torch.exact import torch_exact

        def call():
            out = torch_exact(task, device=device, dtype="float64")
            if device == "cuda":
                torch.cuda.synchronize()
            return out
        return call
    make.__doc__ = f"``torch_exact(task)`` on {device} in float64 (the same quantities)."
    return make


def _load_peer():
    spec = importlib.util.spec_from_file_location("fisher_ref_torch_peer", PEER_SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure_peer(task):
    """``peer_exact(task JSON)`` of ``benchmarks/speed/peer.py`` (F, E[h], token Fisher only)."""
    peer = _load_peer()
    spec = dict(task.to_json(), theta=task.theta.tolist())
    return lambda: peer.peer_exact(spec)


MEASUREMENTS = {
    REFERENCE: measure_fisher_ref,
    "torch_cpu_float64": _measure_torch("cpu"),
    "torch_cuda_float64": _measure_torch("cuda"),
    "torch_peer": measure_peer,
    "fisher_ref_fisher": measure_fisher_only,
}


def peer_available(task=None):
    """Whether the optional peer row applies: the script exists and the model is the MLP."""
    arch = None if task is None else getattr(task.model, "name", None)
    return PEER_SCRIPT.is_file() and arch in (None, "mlp_window")


def measurements(device=None, task=None, peer=True):
    """Names to run: fisher_ref, torch on the CPU, torch on CUDA when ``device`` is
    ``"cuda"`` or (``device=None``) when CUDA is present, and the peer when available
    (with ``fisher_ref_fisher``, its like-for-like side)."""
    import torch
    names = [REFERENCE, "torch_cpu_float64"]
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda asked for, but torch sees no CUDA device")
    if device == "cuda" or (device is None and torch.cuda.is_available()):
        names.append("torch_cuda_float64")
    if peer and peer_available(task):
        names += ["torch_peer", LIKE_FOR_LIKE["torch_peer"]]
    return names

