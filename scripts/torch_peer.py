r"""An independent torch peer of fisher_ref's exact engine: the benchmark baseline.

It shares no code with fisher_ref. From a task file's JSON (an ``mlp_window``
model, docs/theory.md §4.1) it builds its own parameters, its own windows and
its own MLP forward in torch (float64), and computes, by enumerating every
response:

- ``fisher``: the sequence Fisher :math:`F = E[h^2]` and ``score_mean``
  :math:`E[h]`;
- ``token_fisher``: the token Fisher :math:`f(s) = \sum_a p_a\,\xi_a(s)^2` of
  every open state, with the state's ``prompt``, ``depth`` and generated
  ``tokens``.

It walks the prefix tree level by level. The scores
:math:`\xi_a = \partial\log p_a / \partial\theta` of a window come from
``torch.func.vmap(jacrev(...))`` with respect to each parameter tensor, once per
distinct window of the whole run.
A response ending under parent ``b`` has :math:`h = H_b + \xi_a`, with
:math:`H_b` the parent's running sum. Two ways to sum over the responses:

- ``expand=True`` (the default, the faster): where every token ends a response, per
  parent :math:`\sum_a p_a h^2 = W_b H_b^2 + 2 H_b \odot m_1 + f` and
  :math:`\sum_a p_a h = W_b H_b + m_1` with the window's :math:`W = \sum_a p_a`,
  :math:`m_1 = \sum_a p_a \xi_a` and token Fisher :math:`f` (the binomial theorem on a
  finite sum; no identity such as :math:`m_1 = 0` is used);
- ``expand=False``: each response's own :math:`h` formed explicitly, the method issue 9
  describes for its peer.

Either way responses are summed in chunks of about 2 MiB, so memory holds one level's
running sums, the distinct windows' scores and a chunk.

Timing table (both sides pinned to one thread, interleaved repeats, wall-clock
medians and minima, the ratio of wall and of process-CPU medians, thread counts
and the load average; ``exact`` forms its per-state token Fisher, the peer's one
per-state output, and keeps its other per-state arrays per window; the peer runs both
ways, ``peer`` expanded and ``peer per h`` forming each response's ``h``). ``exact`` runs
twice: with every quantity (the default), and with ``quantities="fisher"``, which
computes what the peer computes (and E[h^2] of every stream, the uniform-reference
Fisher and E[xi|s] per state besides)::

    python scripts/torch_peer.py [--repeats 5] [--tasks medium v16] [--keep-memory]
                                 [--sub-elements N]

Each row is followed by what each side cost the kernel: its minor page faults and system
seconds per run (medians). With glibc's default settings a large freed block goes back to
the system, so every run touches fresh pages again; a page fault costs microseconds on a
virtual machine, and a side that allocates large arrays pays for it on every run.
``--keep-memory`` runs the script again with ``MALLOC_MMAP_THRESHOLD_`` and
``MALLOC_TRIM_THRESHOLD_`` set (``fisher_ref.perf.bench.KEEP_MEMORY``; glibc reads them at
start, other C libraries ignore them), so that freed memory is kept and reused between
runs: the two conditions bracket a run in a fresh process (every page fresh) and a run in
a process that has run before.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # pin every thread pool before numpy and torch load
    for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[_var] = "1"

import numpy as np
import torch
from torch.func import jacrev, vmap
from fisher_ref.engine.plan import EngineOptions

__all__ = ["peer_exact", "peer_theta"]

# Elements of one chunk of complete responses' score sums (about 2 MiB).
CHUNK_ELEMENTS = 2 ** 18
# Distinct windows per vmap(jacrev) call.
WINDOWS_PER_CALL = 256
# Window keys are looked up in a table of every possible key up to this many keys.
DENSE_KEYS = 2 ** 24


def peer_theta(model):
    """The flat parameters of a task-file model: ``init_scale`` times a standard normal
    draw of ``numpy.random.default_rng(init_seed)`` (docs/theory.md §4)."""
    V, k, d, H = (model[key] for key in ("vocab_size", "context", "embed_dim", "hidden"))
    P = (V + 1) * d + k * d * H + H + H * V + V
    rng = np.random.default_rng(model.get("init_seed", 0))
    return model.get("init_scale", 1.0) * rng.standard_normal(P)


def _split(theta, V, k, d, H):
    """The flat parameters as the MLP's tensors (views), in the layout of docs/theory.md
    §4.1: ``E (V+1, d)``, ``W1 (k*d, H)``, ``b1 (H,)``, ``W2 (H, V)``, ``b2 (V,)``, each
    row-major."""
    o1 = (V + 1) * d
    o2 = o1 + k * d * H
    o3, o4 = o2 + H, o2 + H + H * V
    return (theta[:o1].reshape(V + 1, d), theta[o1:o2].reshape(k * d, H), theta[o2:o3],
            theta[o3:o4].reshape(H, V), theta[o4:o4 + V])


def _log_probs(E, W1, b1, W2, b2, window):
    """Log-softmax of the MLP at one window ``(k,)``: ``(V,)``."""
    e = E[window].reshape(-1)  # (k*d,)
    hid = torch.tanh(e @ W1 + b1)  # (H,)
    return torch.log_softmax(hid @ W2 + b2, dim=0)


class _Windows:
    """Scores ``(U, V, P)``, probabilities ``(U, V)`` and token Fisher ``(U, P)`` of every
    distinct window seen so far, each computed once (room for ``capacity`` windows)."""

    def __init__(self, theta, dims, capacity):
        V, k, P = dims[0], dims[1], theta.numel()
        self.parts, self.n = _split(theta, *dims), 0
        # a window's entries lie in 0..V (V pads the start): its key is a base-(V+1) number,
        # looked up in a table of every key when that is small, else in a dict of tuples
        self.dense = (V + 1) ** k <= DENSE_KEYS
        self.base = (V + 1) ** torch.arange(k - 1, -1, -1)  # (k,)
        self.slot = torch.full(((V + 1) ** k,), -1, dtype=torch.long) if self.dense else {}
        # the Jacobian with respect to each tensor, not to slices of the flat vector (whose
        # backward writes every slice's gradient into a zeroed copy of the whole vector)
        self.jac = vmap(jacrev(_log_probs, argnums=(0, 1, 2, 3, 4)), in_dims=(None,) * 5 + (0,))
        self.cuts = np.cumsum([0] + [x.numel() for x in self.parts])  # each tensor's columns
        self.logp_of = vmap(_log_probs, in_dims=(None,) * 5 + (0,))  # (B, k) -> (B, V)
        self.S = torch.empty(capacity, V, P, dtype=torch.float64)
        self.p = torch.empty(capacity, V, dtype=torch.float64)
        self.f = torch.empty(capacity, P, dtype=torch.float64)
        self.m1 = torch.empty(capacity, P, dtype=torch.float64)

    def _slots(self, win):
        """Each window's key and row (-1: not computed yet)."""
        if self.dense:
            keys = win @ self.base  # (n,)
            return keys, self.slot[keys]
        keys = [tuple(r) for r in win.tolist()]
        return keys, torch.tensor([self.slot.get(key, -1) for key in keys], dtype=torch.long)

    def rows(self, win):
        """Row of each window of ``win (n, k)``, computing the new ones."""
        keys, slots = self._slots(win)
        fresh = torch.nonzero(slots < 0)[:, 0]  # (m,) windows not computed yet
        if len(fresh) == 0:
            return slots
        if self.dense:  # one window of each new key
            new, inv = torch.unique(keys[fresh], return_inverse=True)
            at = torch.empty(len(new), dtype=torch.long)
            at[inv] = fresh
        else:
            first = {}
            for i in fresh.tolist():
                first.setdefault(keys[i], i)
            new, at = list(first), torch.tensor(list(first.values()), dtype=torch.long)
        W, n = win[at], self.n  # (U_new, k)
        for lo in range(0, len(W), WINDOWS_PER_CALL):
            w = W[lo:lo + WINDOWS_PER_CALL]
            r = slice(n + lo, n + lo + len(w))
            S = self.S[r]  # (u, V, P): each tensor's Jacobian written into its columns
            for g, lo_c, hi_c in zip(self.jac(*self.parts, w), self.cuts, self.cuts[1:]):
                S[:, :, lo_c:hi_c] = g.reshape(S.shape[0], S.shape[1], -1)
            p = self.p[r] = torch.exp(self.logp_of(*self.parts, w))  # (u, V)
            self.f[r] = torch.einsum("uv,uvp->up", p, S * S)  # (u, P)
            self.m1[r] = torch.einsum("uv,uvp->up", p, S)  # (u, P): sum_a p_a xi_a
        if self.dense:
            self.slot[new] = torch.arange(n, n + len(W))
        else:
            self.slot.update({key: n + i for i, key in enumerate(new)})
        self.n += len(W)
        return self._slots(win)[1]


def _add_complete(table, rows, Hs, reach, term, last, F, Eh):
    """Add to ``F``, ``Eh`` the responses ending at tokens ``term`` of a level's states
    (window rows ``rows``, running sums ``Hs``, reach ``reach``), chunk by chunk."""
    P, K = Hs.shape[1], len(term)
    if K == 0:
        return
    step = max(1, CHUNK_ELEMENTS // (K * P))
    buf = torch.empty(min(step, len(rows)) * K * P, dtype=Hs.dtype)  # reused chunk to chunk
    for lo in range(0, len(rows), step):
        r = rows[lo:lo + step]
        h = buf[:len(r) * K * P].view(len(r), K, P)
        if last:  # every token ends a response
            torch.index_select(table.S, 0, r, out=h)
            p = table.p.index_select(0, r)  # (c, V)
        else:  # only the tokens ``term``: gather just those rows
            h.copy_(table.S[r[:, None], term[None, :]])
            p = table.p[r[:, None], term[None, :]]  # (c, K)
        h += Hs[lo:lo + step, None]  # (c, K, P): each response's own h
        h = h.view(-1, P)
        w = (reach[lo:lo + step, None] * p).reshape(-1)  # (c*K,)
        Eh += w @ h
        F += w @ h.square_()


def _add_expanded(table, rows, Hs, reach, F, Eh):
    """Add to ``F``, ``Eh`` the responses of a level where every token ends one, expanded
    per parent (module docstring), chunk by chunk."""
    P = Hs.shape[1]
    step = max(1, CHUNK_ELEMENTS // P)
    for lo in range(0, len(rows), step):
        r, H, rc = rows[lo:lo + step], Hs[lo:lo + step], reach[lo:lo + step]
        m1 = table.m1.index_select(0, r)  # (c, P)
        w = rc * table.p.index_select(0, r).sum(1)  # (c,) the parents' responses' weight
        Eh += w @ H + rc @ m1
        F += w @ H.square() + 2 * torch.einsum("c,cp,cp->p", rc, H, m1) \
            + rc @ table.f.index_select(0, r)


def peer_exact(task, expand=True):
    """``F = E[h^2]``, ``E[h]`` and the token Fisher of every state of a task-file dict.

    Args:
        task: the JSON of a task file with an ``mlp_window`` model (``prompts``,
            ``prompt_weights`` (default uniform), ``max_len``, optional ``theta``).
        expand: sum the last level's responses per parent (module docstring); else form
            each response's ``h``.

    Returns:
        dict: ``fisher``, ``score_mean`` ``(P,)``; ``token_fisher`` ``(N, P)`` with
        ``prompt``, ``depth`` ``(N,)`` and ``tokens`` (a tuple per state: the generated
        tokens), states level by level.
    """
    model = task["model"]
    if model.get("arch", "mlp_window") != "mlp_window":
        raise ValueError(f"the torch peer knows the mlp_window model only, not {model['arch']!r}")
    V, k, d, H = (model[key] for key in ("vocab_size", "context", "embed_dim", "hidden"))
    eos, T = bool(model.get("eos", True)), task["max_len"]
    theta = torch.tensor(task["theta"] if "theta" in task else peer_theta(model),
                         dtype=torch.float64)
    prompts = [list(x) for x in task["prompts"]]
    n = len(prompts)
    beta = V - 1 if eos else V
    table = _Windows(theta, (V, k, d, H), min(n * sum(beta ** t for t in range(T)),
                                             (V + 1) ** k))
    win = torch.tensor([([V] * k + x)[-k:] for x in prompts], dtype=torch.long)  # (n, k)
    reach = torch.tensor(task.get("prompt_weights") or [1.0 / n] * n, dtype=torch.float64)
    Hs = torch.zeros(n, theta.numel(), dtype=torch.float64)  # (n, P) running score sums
    prompt, gen = torch.arange(n), torch.zeros(n, 0, dtype=torch.long)
    F, Eh = torch.zeros_like(theta), torch.zeros_like(theta)
    N = n * sum(beta ** t for t in range(T))  # open states
    out = {"token_fisher": torch.empty(N, theta.numel(), dtype=torch.float64), "prompt": [],
           "depth": [], "tokens": []}
    at = 0  # states written so far
    keep = torch.arange(1 if eos else 0, V)  # tokens that leave a state open
    for depth in range(T):
        rows = table.rows(win)  # (n,)
        torch.index_select(table.f, 0, rows, out=out["token_fisher"][at:at + len(rows)])
        at += len(rows)
        out["prompt"].append(prompt)
        out["depth"].append(torch.full_like(prompt, depth))
        out["tokens"] += [tuple(t) for t in gen.tolist()]
        last = depth == T - 1
        term = torch.arange(V) if last else torch.tensor([0] if eos else [], dtype=torch.long)
        if last and expand:
            _add_expanded(table, rows, Hs, reach, F, Eh)
        else:
            _add_complete(table, rows, Hs, reach, term, last, F, Eh)
        if not last:  # the next level: every open child
            par = torch.arange(len(rows)).repeat_interleave(len(keep))  # (C,)
            tok = keep.repeat(len(rows))  # (C,)
            Hs = Hs[par] + table.S[rows[par], tok]  # (C, P)
            reach = reach[par] * table.p[rows[par], tok]
            win = torch.cat([win[par, 1:], tok[:, None]], dim=1)
            prompt, gen = prompt[par], torch.cat([gen[par], tok[:, None]], dim=1)
    return {"fisher": F.numpy(), "score_mean": Eh.numpy(),
            "token_fisher": out["token_fisher"].numpy(),
            "prompt": torch.cat(out["prompt"]).numpy(), "depth": torch.cat(out["depth"]).numpy(),
            "tokens": out["tokens"]}


# ---------------------------------------------------------------- the timing table

def _threads():
    blas = {v: os.environ.get(v, "unset") for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                                                   "MKL_NUM_THREADS")}
    return f"torch threads {torch.get_num_threads()}, " + ", ".join(
        f"{k}={v}" for k, v in blas.items())


def _memory_kept(keep):
    """Whether this process started with every variable of ``keep`` set to its value."""
    return all(os.environ.get(k) == v for k, v in keep.items())


def _memory_condition(keep):
    return ("freed memory kept and reused between runs (" +
            ", ".join(f"{k}={v}" for k, v in keep.items()) + ")") if _memory_kept(keep) else \
        "the C library's default (glibc hands large freed blocks back to the system)"


def main(argv=None):
    import argparse
    import json
    import time
    from pathlib import Path

    ap = argparse.ArgumentParser(description="fisher_ref exact against the torch peer")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tasks", nargs="+", default=["medium", "v16"])
    ap.add_argument("--keep-memory", action="store_true",
                    help="rerun with glibc told to keep freed memory (module docstring)")
    ap.add_argument("--sub-elements", type=int, default=None, metavar="N",
                    help="exact's Budgets.sub_elements (default: the engine's own, "
                    "which depends on the memory condition)")
    ap.add_argument("--json", default=None, metavar="FILE",
                    help="also write every timing, the medians and ratios, the commit, the "
                         "machine and the memory condition to FILE (not overwritten)")
    args = ap.parse_args(argv)
    if args.json and Path(args.json).exists():
        ap.error(f"--json {args.json} exists; it is not overwritten")
    if args.json and not Path(args.json).resolve().parent.is_dir():
        ap.error(f"--json {args.json}: the directory does not exist")
    if args.repeats < 1:
        ap.error(f"--repeats must be a positive integer, got {args.repeats}")
    if args.sub_elements is not None and args.sub_elements < 1:
        ap.error(f"--sub-elements must be a positive integer, got {args.sub_elements}")
    root = Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    from fisher_ref.perf.bench import KEEP_MEMORY, condition_env  # the harness's
    if args.keep_memory and not _memory_kept(KEEP_MEMORY):
        import subprocess  # glibc reads the variables at start: run again with them set
        return subprocess.call([sys.executable, __file__] + list(sys.argv[1:] if argv is None
                                                                 else argv),
                               env=condition_env(True, threads=0))
    import resource
    from fisher_ref.perf.memory import (MEMORY_LABELS, MemoryConditionError,
                                        check_memory_condition, probe_process,
                                        startup_environ)
    reused = probe_process()  # a process started as this one was: this one's peak untouched
    try:
        check_memory_condition(_memory_kept(KEEP_MEMORY), reused, "torch_peer.py",
                               startup_environ())
    except MemoryConditionError as exc:
        sys.exit(str(exc))
    torch.set_num_threads(1)
    from fisher_ref import exact, task_from_json
    from fisher_ref.engine.plan import DEFAULT_BUDGETS, Budgets
    from fisher_ref.engine.keep_memory import memory_kept
    budgets = DEFAULT_BUDGETS if args.sub_elements is None else \
        Budgets(sub_elements=args.sub_elements)
    sub = budgets.sub_block_elements(factored=True, kept=memory_kept())  # an MLP's last level
    from fisher_ref.perf.scaling import git_commit, machine
    # the code this process runs is the checkout's now, whatever changes during the runs
    record = {"commit": git_commit(root), "machine": None, "threads": _threads(),
              "memory": _memory_condition(KEEP_MEMORY), "memory_kept": _memory_kept(KEEP_MEMORY),
              "freed_memory_reused": reused, "sub_elements": sub,
              "sub_elements_given": args.sub_elements,
              "repeats": args.repeats, "loadavg": [list(os.getloadavg())], "tasks": {}}
    print(f"threads: {_threads()}; load average before: {os.getloadavg()}")
    print(f"memory: {_memory_condition(KEEP_MEMORY)}; a freed 64 MiB block "
          f"{MEMORY_LABELS[reused]} in a process started alike; "
          f"exact's sub-block budget at the last level: {sub:,} elements"
          + (" (the engine's own in this memory)" if args.sub_elements is None else ""))
    cols = ["exact", "exact fisher", "peer", "peer per h"]
    print("| task | P | " + " | ".join(f"{c} median (min) s" for c in cols) +
          " | exact / peer, wall | exact / peer, CPU | exact fisher / peer, wall | "
          "exact fisher / peer, CPU | exact fisher / peer per h, wall |")
    print("|---|---|" + "---|" * len(cols) + "---|---|---|---|---|")
    for name in args.tasks:
        spec = json.loads((root / "fisher_ref/configs/scale" / f"{name}.json").read_text())
        # the same outputs formed: the peer returns its token Fisher per state, exact
        # keeps its per-state arrays per window until read (ExactResult.gathered)
        options = EngineOptions(budgets=budgets)
        runs = {"exact": lambda: exact(task_from_json(spec), progress=False, workers=1,
                                       options=options).states["token_fisher"],
                # the peer's work: F, E[h], token Fisher sums and per-state arrays only
                "exact fisher": lambda: exact(task_from_json(spec), progress=False, workers=1,
                                              quantities="fisher",
                                              options=options).states["token_fisher"],
                "peer": lambda: peer_exact(spec),  # expanded per parent: the faster
                "peer per h": lambda: peer_exact(spec, expand=False)}  # issue 9's method
        wall, cpu = {c: [] for c in cols}, {c: [] for c in cols}
        faults, sys_s = {c: [] for c in cols}, {c: [] for c in cols}
        for c in cols:  # warm-up, not timed: imports, torch.func's first trace, allocator
            runs[c]()
        for _ in range(args.repeats):  # interleaved: each repeat runs every side once
            for c in cols:
                r0 = resource.getrusage(resource.RUSAGE_SELF)
                t0, c0 = time.perf_counter(), time.process_time()
                runs[c]()
                wall[c].append(time.perf_counter() - t0)
                cpu[c].append(time.process_time() - c0)
                r1 = resource.getrusage(resource.RUSAGE_SELF)
                faults[c].append(r1.ru_minflt - r0.ru_minflt)
                sys_s[c].append(r1.ru_stime - r0.ru_stime)
        med = {c: float(np.median(v)) for c, v in wall.items()}
        cmed = {c: float(np.median(v)) for c, v in cpu.items()}
        P = peer_theta(spec["model"]).size
        print(f"| {name} | {P:,} | " + " | ".join(
            f"{med[c]:.3f} ({min(wall[c]):.3f})" for c in cols) +
            f" | {med['exact'] / med['peer']:.2f} | {cmed['exact'] / cmed['peer']:.2f}"
            f" | {med['exact fisher'] / med['peer']:.2f}"
            f" | {cmed['exact fisher'] / cmed['peer']:.2f}"
            f" | {med['exact fisher'] / med['peer per h']:.2f} |", flush=True)
        print(f"  {name}, per run (medians): " + "; ".join(
            f"{c} {np.median(faults[c]):,.0f} page faults, {np.median(sys_s[c]):.3f} s in the "
            "kernel" for c in cols), flush=True)
        record["tasks"][name] = {
            "num_params": int(P), "wall": wall, "cpu": cpu, "page_faults": faults,
            "kernel_s": sys_s, "median": med,
            "ratio": {"exact / peer": med["exact"] / med["peer"],
                      "exact fisher / peer": med["exact fisher"] / med["peer"],
                      "exact / peer, CPU": cmed["exact"] / cmed["peer"],
                      "exact fisher / peer, CPU": cmed["exact fisher"] / cmed["peer"]}}
    print(f"load average after: {os.getloadavg()}")
    if args.json:
        import datetime
        record["loadavg"].append(list(os.getloadavg()))
        record.update(machine=f"{machine()}, torch {torch.__version__}", date=datetime.datetime.now(
                          datetime.timezone.utc).isoformat(timespec="seconds"))
        with open(args.json, "x") as fh:
            json.dump(record, fh, indent=1)
            fh.write("\n")


if __name__ == "__main__":
    sys.exit(main())
