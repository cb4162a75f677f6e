r"""Golden files, the export side: a task's exact values written to a versioned ``.npz``.

This module runs the exact engine; reading and checking a file needs only
:mod:`fisher_ref.golden.format` (numpy and the standard library), and
:mod:`fisher_ref.testing` compares your arrays with one. The format is written
out key by key in ``docs/golden_format.md``.

Besides the engine's per-state and per-response arrays, the export makes one
pass of its own over the kept states: each state's logits, its sensitivities
:math:`j` (:func:`fisher_ref.models.sensitivities.sensitivities`) and so every
response's score :math:`h = \sum_t (j_{\cdot,y_t}(s_t) - \bar j(s_t))`, and for
``P <= 2000`` the two matrices of docs/theory.md §2.10:

.. math:: E[h h^\top] = \sum_y P(y)\, h(y) h(y)^\top, \qquad
          \sum_s \pi(s) \sum_a p_a (j_{\cdot,a} - \bar j)(j_{\cdot,a} - \bar j)^\top.

    python -m fisher_ref export --config default --out default.npz
    python -m fisher_ref regenerate          # rewrite the shipped files
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np

from fisher_ref.golden.format import (MATRIX_MAX_PARAMS, OLDEST_READABLE_VERSION, SCHEMA,
                                      SCHEMA_VERSION, Golden, array_sha256, expected_keys,
                                      load_golden, meta_sha256, write_npz)
from fisher_ref.golden.archive import GoldenFileError, differs_from_shipped
from fisher_ref.limits import MAX_GOLDEN_BYTES
from fisher_ref.results import require_all_quantities
from fisher_ref.golden.check import GOLDEN_DIR, compare_golden
from fisher_ref.version import __version__

__all__ = ["SCHEMA", "SCHEMA_VERSION", "OLDEST_READABLE_VERSION", "MATRIX_MAX_PARAMS",
           "GoldenFileError", "Golden", "golden_arrays", "score_pass", "export_golden",
           "load_golden", "compare_golden", "array_sha256", "meta_sha256", "golden_task",
           "regenerate_golden_files", "GOLDEN_CASES", "NO_MATRICES", "MAX_EXPORT_BYTES", "size_table_row",
           "export_size", "write_manifest"]

# The shipped golden files: configs shipped with the package, then task files of
# golden_data/tasks/ (harder cases that need no config of their own).
GOLDEN_CONFIGS = ("default", "no_eos", "offpolicy_temperature", "offpolicy_stale", "tabular",
                  "weighted_prompts", "gpt2_small", "gpt2_offpolicy")
GOLDEN_TASKS = ("v12_count_eos", "t5_rounded", "peaked_temperature", "zero_prob_tabular",
                "zero_prob_mlp", "gpt2_tiny")
GOLDEN_CASES = GOLDEN_CONFIGS + GOLDEN_TASKS
# Shipped files written without the P x P matrices although P <= 2000, to keep the
# shipped set under 20 MB: name -> why.
NO_MATRICES = {"gpt2_small": "P = 1,000: the two P x P matrices would add 16 MB",
               "gpt2_offpolicy": "P = 1,848: the two P x P matrices would add 55 MB"}
MAX_EXPORT_BYTES = MAX_GOLDEN_BYTES  # refuse to write a golden file larger than this
#: Added to the recorded name of a task that carries a shipped golden file's name but is
#: not that file's task (another reward, say): a file that claims a shipped name must be
#: that file (:func:`fisher_ref.golden.archive.check_claimed_name`).
CUSTOM_SUFFIX = "-custom"
_SENS_BYTES = 2 ** 26  # sensitivities held at once by the score pass


def golden_task(name):
    """The task of shipped golden file ``name``: a shipped config or ``golden_data/tasks``."""
    from fisher_ref.tasks import load_config, load_task
    if name in GOLDEN_CONFIGS:
        return load_config(name)
    if name in GOLDEN_TASKS:
        return load_task(GOLDEN_DIR / "tasks" / f"{name}.json")
    raise ValueError(f"no golden case {name!r}; known: {', '.join(GOLDEN_CASES)}")


def _state_rows(task, states):
    """Row of each state by ``(prompt, generated tokens)``."""
    plen = np.array([len(p) for p in task.prompts])[states["prompt"]]  # (N,)
    return {(int(x), tuple(row[n:n + d].tolist())): i for i, (x, row, n, d) in enumerate(
        zip(states["prompt"], states["tokens"], plen, states["depth"]))}


def _response_steps(task, states, seqs):
    """``(state, token)`` of every step of every response: two ``(M, T)`` int arrays,
    ``-1`` after the response ends."""
    rows = _state_rows(task, states)
    M, T = seqs["tokens"].shape
    st, tok = np.full((M, T), -1), np.full((M, T), -1)
    for m, (x, y) in enumerate(zip(seqs["prompt"], seqs["tokens"])):
        y = y[y >= 0].tolist()
        for t, a in enumerate(y):
            st[m, t], tok[m, t] = rows[(int(x), tuple(y[:t]))], a
    return st, tok


def score_pass(task, states, seqs, matrices):
    r"""Logits ``(N, V)``, response scores ``h (M, P)`` and, if ``matrices``, the matrices
    :math:`E[hh^\top]` and :math:`\sum_s \pi(s)\,\mathrm{Cov}_{p(s)}(j)` ``(P, P)``.

    Args:
        task: the task; ``states``, ``seqs``: ``exact(task).states`` / ``.sequences``.
        matrices: whether to form the two ``(P, P)`` matrices (else they are ``None``).
    """
    from fisher_ref.models.sensitivities import sensitivities
    from fisher_ref.numerics import mean_sensitivity
    model, theta = task.model, task.theta
    toks = states["tokens"]  # (N, L), -1 padded on the right
    W = model.windows(toks, (toks >= 0).sum(axis=1))  # (N, k)
    logits = np.asarray(model.logits(theta, W), dtype=np.float64)  # (N, V)
    step_state, step_tok = _response_steps(task, states, seqs)  # (M, T) each
    N, P, V = toks.shape[0], model.num_params, model.vocab_size
    h = np.zeros((seqs["tokens"].shape[0], P))  # (M, P)
    token_matrix = np.zeros((P, P)) if matrices else None
    chunk = max(1, _SENS_BYTES // (8 * P * V))
    for a in range(0, N, chunk):
        b = min(N, a + chunk)
        J = sensitivities(model, theta, W[a:b])  # (B, P, V)
        p = states["probs"][a:b]  # (B, V)
        C = J - mean_sensitivity(p, J)[:, :, None]  # (B, P, V) centered sensitivities
        for t in range(step_state.shape[1]):
            sel = (step_state[:, t] >= a) & (step_state[:, t] < b)  # (M,)
            h[sel] += C[step_state[sel, t] - a, :, step_tok[sel, t]]  # (m, P)
        if matrices:
            wC = C * (states["reach"][a:b, None] * p)[:, None, :]  # (B, P, V)
            token_matrix += np.tensordot(wC, C, axes=([0, 2], [0, 2]))  # (P, P)
    seq_matrix = (h * seqs["prob"][:, None]).T @ h if matrices else None  # (P, P)
    return logits, h, seq_matrix, token_matrix


def export_size(task, matrices):
    """Bytes of the golden file of ``task``, estimated in closed form from the sizes of
    its arrays (docs/golden_format.md): per state its tokens (``L`` = longest prompt plus
    ``max_len``), logits, probabilities and token Fishers; per response its tokens and
    score; the cross terms, the ``P x P`` matrices and the meta (which lists the prompts)."""
    from fisher_ref.engine.plan import estimate_cost
    cost = estimate_cost(task)
    N, M, P, V, T = (cost.n_states, cost.n_responses, task.model.num_params,
                     task.model.vocab_size, task.max_len)
    L = max(len(p) for p in task.prompts) + T
    off = task.sampler is not None
    per_state = L + 3 + 2 * V + 2 * P + ((1 + V + 2 * P) if off else 0)
    per_response = T + 4 + P + (2 if off else 0)
    fixed = (2 + 2 * off) * T * T * P + 30 * P + (2 * P * P if matrices else 0)
    meta = 8 * sum(len(p) + 1 for p in task.prompts) + 100 * len(task.model.layout())
    entries = 300 * 60  # a zip entry and a .npy header per array, the meta's own fields
    return 8 * (N * per_state + M * per_response + fixed) + meta + entries


def _check_export_size(task, matrices):
    from fisher_ref.engine.plan import count_states
    size = export_size(task, matrices)
    if size > MAX_EXPORT_BYTES:
        m = task.model
        N, M = count_states(m.vocab_size, task.max_len, m.eos, len(task.prompts))
        raise ValueError(
            f"the golden file would hold about {size / 2**30:,.1f} GiB ({N:,} states, "
            f"{M:,} responses, P={m.num_params:,}, {len(task.prompts):,} prompts of up to "
            f"{max(len(p) for p in task.prompts):,} tokens), more than "
            f"{MAX_EXPORT_BYTES / 2**30:.0f} GiB; export a smaller task (fewer or shorter "
            "prompts, smaller max_len or vocab_size)")


def _resolve_matrices(task, matrices):
    P = task.model.num_params
    if matrices == "auto":
        return P <= MATRIX_MAX_PARAMS
    if matrices is True and P > MATRIX_MAX_PARAMS:
        raise ValueError(f"matrices=True needs P <= {MATRIX_MAX_PARAMS}, the model has P={P}")
    if not isinstance(matrices, bool):
        raise ValueError(f"matrices must be 'auto', True or False, got {matrices!r}")
    return matrices


def golden_arrays(task, exact_result=None, matrices="auto"):
    """The arrays of a golden file for ``task`` (computing ``exact`` if not given).

    Args:
        task: a :class:`fisher_ref.tasks.Task`.
        exact_result: its :class:`ExactResult` with states and sequences kept.
        matrices: write the ``(P, P)`` matrices: ``"auto"`` (when ``P <= 2000``), or a bool.

    Returns:
        dict key -> ndarray (float64 ``<f8`` or int64 ``<i8``), see ``docs/golden_format.md``.
    """
    from fisher_ref.engine.fast import exact
    from fisher_ref.engine.plan import EngineOptions
    matrices = _resolve_matrices(task, matrices)
    if exact_result is None:
        _check_export_size(task, matrices)
    if exact_result is not None:
        require_all_quantities(exact_result, "a golden file")
    r = exact_result if exact_result is not None else exact(
        task, options=EngineOptions(keep_states=True, keep_sequences=True))
    if r.states is None or r.sequences is None:
        raise ValueError("golden files need the per-state and per-response arrays; "
                         "run exact(..., options=EngineOptions(keep_states=True, "
                         "keep_sequences=True))")
    st, sq = r.states, r.sequences
    logits, h, seq_matrix, token_matrix = score_pass(task, st, sq, matrices)
    a = {"theta": task.theta, "prompt_weights": task.prompt_weights,
         "state_tokens": st["tokens"], "state_prompt": st["prompt"], "state_depth": st["depth"],
         "state_reach": st["reach"], "state_logits": logits, "state_probs": st["probs"],
         "state_token_fisher": st["token_fisher"], "state_uniform_token_fisher": st["uniform"],
         "seq_tokens": sq["tokens"], "seq_prompt": sq["prompt"], "seq_prob": sq["prob"],
         "seq_reward": sq["reward"], "seq_advantage": sq["advantage"], "seq_score": h,
         "gradient_autodiff": r.gradient_autodiff}
    if matrices:
        a.update({"sequence_fisher_matrix": seq_matrix, "token_fisher_matrix_sum": token_matrix})
    for key in ("sequence_fisher", "token_fisher_sum", "score_mean", "gradient", "covariance",
                "bound", "correlation", "cross_terms", "expected_reward", "reward_std",
                "baseline"):
        a[key] = getattr(r, key)
    if task.sampler is not None:
        c, raw = r.streams["centered"], r.streams["raw"]
        a.update({"sampler_theta": task.sampler.params(task.model, task.theta),
                  "sampler_reach": st["sampler_reach"], "sampler_probs": st["sampler_probs"],
                  "sampler_token_fisher": st["sampler_token_fisher"],
                  "sampler_raw_score_mean": st["raw_score_mean"],
                  "seq_sampler_prob": sq["sampler_prob"],
                  "seq_sampler_advantage": sq["sampler_advantage"],
                  "offpolicy_gradient_uncentered": raw.gradient,
                  "offpolicy_score_mean_uncentered": raw.score_mean,
                  "offpolicy_sequence_fisher_uncentered": raw.sequence_fisher,
                  "offpolicy_importance_gradient": raw.importance_gradient})
        for key in ("sequence_fisher", "token_fisher_sum", "score_mean", "gradient",
                    "covariance", "bound", "correlation", "cross_terms", "expected_reward",
                    "reward_std", "baseline"):
            a["offpolicy_" + key] = getattr(c, key)
    spec = expected_keys(task.sampler is not None, matrices)
    return {k: np.array(v, dtype="<" + spec[k][0], order="C") for k, v in a.items()}  # 0-d kept


def _theta_source(task):
    """``"init"`` when ``theta`` is the model's documented initial draw, else ``"given"``."""
    init = getattr(task.model, "init_params", None)
    return "init" if callable(init) and np.array_equal(task.theta, init()) else "given"


def _meta(task, arrays):
    from fisher_ref.rewards import Reward, make_reward
    if not isinstance(task.reward, Reward):  # a bare callable: record it by name
        task = task.with_(reward=make_reward(task.reward))
    st, sq = arrays["state_tokens"], arrays["seq_tokens"]
    meta = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "generator": f"fisher_ref {__version__}", "name": task.name,
            "model": task.model.describe(), "task": task.to_json(),
            "offpolicy": task.sampler is not None,
            "matrices": "sequence_fisher_matrix" in arrays, "theta_source": _theta_source(task),
            "layout": [{"name": n, "shape": list(s), "offset": int(o)}
                       for n, s, o in task.model.layout()],
            "sizes": {"P": int(task.model.num_params), "V": int(task.model.vocab_size),
                      "T": int(task.max_len), "N": int(st.shape[0]), "M": int(sq.shape[0]),
                      "L": int(st.shape[1]), "X": len(task.prompts)},
            "sha256": {k: array_sha256(v) for k, v in sorted(arrays.items())}}
    if differs_from_shipped(meta, arrays):  # a shipped name, another task: not that file
        meta["name"] = f"{task.name}{CUSTOM_SUFFIX}"
    meta["meta_sha256"] = meta_sha256(meta)
    return meta


def export_golden(task, path, exact_result=None, matrices="auto"):
    """Write the golden file of ``task`` to ``path`` atomically; returns ``path``.

    Args:
        task: a :class:`fisher_ref.tasks.Task` (a custom reward is recorded by name). A
            task named like a shipped golden file (``"default"``) whose file would not be
            a regeneration of the shipped one (another reward, say) is recorded as
            ``"default-custom"`` (:data:`CUSTOM_SUFFIX`): only the shipped file may claim
            the shipped name.
        path: destination ``.npz``; on any failure no file (and no partial file) is left,
            and an existing file is left as it was.
        exact_result: an :class:`ExactResult` of ``task`` with states and sequences
            kept (computed if ``None``).
        matrices: ``"auto"`` (the ``(P, P)`` matrices when ``P <= 2000``), True or False.

    Raises:
        ValueError: the file would be too large (before anything runs), or
            :class:`fisher_ref.fileio.FileProblem` naming the path when it cannot be written.

    Example:
        >>> import tempfile
        >>> from fisher_ref import load_config
        >>> path = Path(tempfile.mkdtemp()) / "tabular.npz"
        >>> g = load_golden(export_golden(load_config("tabular"), path))
        >>> g["sequence_fisher_matrix"].shape, g.meta["schema_version"]
        ((12, 12), 3)
    """
    arrays = golden_arrays(task, exact_result, matrices)
    return write_npz(path, _meta(task, arrays), arrays)


def regenerate_golden_files(directory=None, names=GOLDEN_CASES):
    """Write ``<name>.npz`` for each golden case into ``directory`` (default: the shipped
    ``fisher_ref/golden_data``, whose manifest :func:`write_manifest` then records the
    new files' SHA-256); returns the paths."""
    shipped = directory is None or Path(directory).resolve() == GOLDEN_DIR.resolve()
    directory = GOLDEN_DIR if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    paths = [export_golden(golden_task(name), directory / f"{name}.npz",
                           matrices="auto" if name not in NO_MATRICES else False)
             for name in names]
    if shipped:
        write_manifest()
    return paths


def write_manifest(directory=None, out=None):
    """Rewrite the manifest ``fisher_ref/golden/manifest.py`` (or ``out``): the SHA-256 of
    every ``.npz`` in the shipped ``golden_data`` (or ``directory``), by name; the loaded
    manifest follows when the package's own file is rewritten. Returns the table."""
    import fisher_ref.golden.manifest as manifest
    directory = GOLDEN_DIR if directory is None else Path(directory)
    table = {p.stem: hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(directory.glob("*.npz"))}
    text = Path(manifest.__file__).read_text()
    rows = "".join(f"    {k!r}: {v!r},\n" for k, v in table.items())
    dest = Path(manifest.__file__) if out is None else Path(out)
    dest.write_text(text[:text.index("SHA256 = {")] + "SHA256 = {\n" + rows + "}\n")
    if out is None:
        manifest.SHA256.clear()
        manifest.SHA256.update(table)
    return table


def size_table_row(path):
    """The row of ``path`` in the size table of ``docs/golden_format.md``."""
    g = load_golden(path)
    s, m = g.sizes, g.meta
    sampler = (m["task"]["sampler"] or {}).get("kind", "-")
    return (f"| `{Path(path).name}` | {m['model']['arch']} | {s['P']} | {s['V']} | {s['T']} | "
            f"{s['N']} | {s['M']} | {sampler} | {'yes' if m['matrices'] else 'no'} | "
            f"{Path(path).stat().st_size / 1024:,.0f} KiB |")


