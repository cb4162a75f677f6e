"""The checks :func:`fisher_ref.golden.format.load_golden` runs on a file's members, in
order: the meta (schema, version, its own hash, the fields the reader uses), the arrays
(hashes, keys, dtypes, shapes) and cheap identities of the values. Each raises
:class:`~fisher_ref.golden.archive.GoldenFileError` naming the first thing that is wrong.
"""
from __future__ import annotations

import math

import numpy as np

from fisher_ref.fileio import strict_json
from fisher_ref.golden.archive import GoldenFileError
from fisher_ref.golden.hashes import array_sha256, meta_sha256
from fisher_ref.golden.schema import (MATRIX_MAX_PARAMS, OLDEST_READABLE_VERSION, REGENERATE_HINT,
                                      SCHEMA, SCHEMA_VERSION, expected_keys)
from fisher_ref.limits import TOL_FLOAT64


def _check_version(path, meta):
    v = meta.get("schema_version")
    if isinstance(v, bool) or not isinstance(v, int):
        raise GoldenFileError(f"{path}: schema_version must be an integer, got {v!r}")
    if v > SCHEMA_VERSION:
        raise GoldenFileError(
            f"{path}: schema_version {v} is newer than this reader supports ({SCHEMA_VERSION}); "
            "upgrade fisher_ref")
    if v < OLDEST_READABLE_VERSION:
        raise GoldenFileError(
            f"{path}: schema_version {v} is older than the oldest supported "
            f"({OLDEST_READABLE_VERSION}); {REGENERATE_HINT}")


def check_meta(path, members):
    """The meta of ``members`` (popped from them), checked: schema, version, its own hash and
    the fields the reader uses; :class:`GoldenFileError` naming the first thing wrong."""
    if "meta" not in members:
        raise GoldenFileError(f"{path}: no 'meta' key; not a fisher_ref golden file")
    m = members.pop("meta")
    if m.shape != () or m.dtype.kind != "U":
        raise GoldenFileError(f"{path}: 'meta' must be a 0-d unicode string array, "
                              f"got dtype {m.dtype} shape {m.shape}")
    meta = strict_json(str(m), f"{path}: 'meta'", GoldenFileError)
    if not isinstance(meta, dict):
        raise GoldenFileError(f"{path}: 'meta' must be a JSON object")
    if meta.get("schema") != SCHEMA:
        raise GoldenFileError(f"{path}: schema is {meta.get('schema')!r}, expected {SCHEMA!r}")
    _check_version(path, meta)
    claimed = meta.get("meta_sha256")
    if not isinstance(claimed, str):
        raise GoldenFileError(f"{path}: meta has no valid 'meta_sha256' entry (the SHA-256 of "
                              f"the meta itself), got {claimed!r}")
    got = meta_sha256(meta)
    if got != claimed:
        raise GoldenFileError(
            f"{path}: meta was modified: its SHA-256 is {got[:16]}..., but meta_sha256 says "
            f"{claimed[:16]}... (a field of meta, e.g. the model, task, reward, baseline, "
            "layout, sizes or array hashes, was changed or damaged after export; the hash "
            "is unkeyed: it catches accidents, not an edit that also rewrites it)")
    for key, kind in (("sha256", dict), ("sizes", dict), ("model", dict), ("task", dict),
                      ("layout", list), ("offpolicy", bool), ("matrices", bool),
                      ("theta_source", str)):
        if not isinstance(meta.get(key), kind):
            want = {dict: "a JSON object", list: "a JSON array", bool: "true or false",
                    str: "a string"}[kind]
            raise GoldenFileError(f"{path}: meta has no valid {key!r} entry (expected {want})")
    _check_meta_fields(path, meta)
    return meta


def _is_int(x, low=0):
    return isinstance(x, int) and not isinstance(x, bool) and x >= low


def _check_meta_fields(path, meta):
    """The meta fields the reader and the checkers use, each of the documented kind."""
    def bad(what, value):
        raise GoldenFileError(f"{path}: meta {what}, got {value!r:.80}")
    for sym, value in meta["sizes"].items():
        if not _is_int(value):
            bad(f"sizes[{sym!r}] must be a non-negative integer", value)
    for i, e in enumerate(meta["layout"]):
        if not (isinstance(e, dict) and isinstance(e.get("shape"), list)
                and all(_is_int(n) for n in e["shape"])):
            bad(f"layout[{i}] must be an object with a 'shape' list of non-negative integers", e)
    model, task = meta["model"], meta["task"]
    if not _is_int(model.get("vocab_size"), 1):
        bad("model.vocab_size must be a positive integer", model.get("vocab_size"))
    if not isinstance(model.get("eos", True), bool):
        bad("model.eos must be true or false", model.get("eos"))
    if not _is_int(task.get("max_len"), 1):
        bad("task.max_len must be a positive integer", task.get("max_len"))
    prompts = task.get("prompts", [])
    if not (isinstance(prompts, list) and all(
            isinstance(p, list) and all(_is_int(t) for t in p) for p in prompts)):
        bad("task.prompts must be a list of token lists", prompts)
    if meta["theta_source"] not in ("init", "given"):
        bad("theta_source must be 'init' or 'given'", meta["theta_source"])
    if meta["theta_source"] == "init":
        for key in ("init_seed", "init_scale"):
            value = model.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                    key == "init_seed" and not _is_int(value)) or not math.isfinite(value):
                bad(f"model.{key} must be a number (an integer >= 0 for the seed)", value)


def _check_hashes(path, meta, arrays):
    """Hash stage: every array that has a recorded SHA-256 must match it."""
    hashes = meta["sha256"]
    for key in sorted(set(arrays) & set(hashes)):
        got = array_sha256(arrays[key])
        if got != hashes[key]:
            raise GoldenFileError(
                f"{path}: SHA-256 mismatch for array {key!r}: meta says {str(hashes[key])[:16]}"
                f"..., the data hashes to {got[:16]}... (the array was altered or corrupted)")


def _check_keys(path, meta, arrays):
    """Keys stage: exactly the expected arrays, each with exactly one recorded SHA-256."""
    expected = expected_keys(meta["offpolicy"], meta["matrices"])
    present, hashed = set(arrays), set(meta["sha256"])
    missing = sorted(set(expected) - present)
    if missing:
        listed = [k for k in missing if k in hashed]
        note = f" ({listed} still listed in meta.sha256)" if listed else ""
        raise GoldenFileError(f"{path}: required key(s) missing: {missing}{note}")
    extra = sorted(present - set(expected))
    if extra:
        unhashed = [k for k in extra if k not in hashed]
        note = f"; {unhashed} also have no SHA-256 in meta" if unhashed else ""
        raise GoldenFileError(f"{path}: unexpected key(s) {extra} for schema_version "
                              f"{SCHEMA_VERSION} (offpolicy={meta['offpolicy']}, "
                              f"matrices={meta['matrices']}){note}")
    unhashed = sorted(present - hashed)
    if unhashed:
        raise GoldenFileError(f"{path}: array(s) {unhashed} have no SHA-256 in meta "
                              "(key(s) missing from meta.sha256)")
    orphans = sorted(hashed - present)
    if orphans:
        raise GoldenFileError(f"{path}: meta.sha256 lists unexpected key(s) {orphans}: "
                              "no such array is in the file")
    return expected


def _check_sizes(path, meta, arrays):
    sizes = dict(meta["sizes"])
    for sym in "PVTNMLX":
        if isinstance(sizes.get(sym), bool) or not isinstance(sizes.get(sym), int):
            raise GoldenFileError(f"{path}: meta sizes lack an integer {sym!r} (got {sizes})")
    try:
        P = int(sum(int(np.prod(e["shape"])) for e in meta["layout"]))
    except (TypeError, KeyError, ValueError):
        raise GoldenFileError(f"{path}: meta layout entries need a 'shape' list") from None
    theta = arrays["theta"]
    checks = [("P", P, "the parameter layout"),
              ("P", theta.shape[0] if theta.ndim == 1 else theta.shape, "theta"),
              ("V", meta["model"].get("vocab_size"), "model.vocab_size"),
              ("T", meta["task"].get("max_len"), "task.max_len"),
              ("X", len(meta["task"].get("prompts", [])), "task.prompts")]
    for sym, value, what in checks:
        if sizes.get(sym) != value:
            raise GoldenFileError(f"{path}: meta sizes give {sym}={sizes.get(sym)} but "
                                  f"{what} gives {value}")
    if meta["matrices"] and P > MATRIX_MAX_PARAMS:
        raise GoldenFileError(f"{path}: meta says matrices=true but P={P} exceeds "
                              f"{MATRIX_MAX_PARAMS}, the largest P a file holds P x P matrices for")
    return sizes


def check_arrays(path, meta, arrays):
    """The arrays checked against ``meta``: hashes, keys, dtypes and shapes;
    :class:`GoldenFileError` naming the first thing wrong."""
    _check_hashes(path, meta, arrays)
    expected = _check_keys(path, meta, arrays)
    for key, (dt, _, _) in expected.items():
        if arrays[key].dtype != np.dtype("<" + dt):
            raise GoldenFileError(f"{path}: array {key!r} has dtype {arrays[key].dtype.str}, "
                                  f"expected {np.dtype('<' + dt).str}")
    sizes = _check_sizes(path, meta, arrays)
    for key, (_, dims, _) in expected.items():
        want = tuple(int(sizes[c]) for c in dims)
        if arrays[key].shape != want:
            raise GoldenFileError(
                f"{path}: array {key!r} has shape {arrays[key].shape}, expected {want} "
                f"({', '.join(f'{c}={sizes[c]}' for c in dims) or 'a 0-d array'})")


VALUE_RTOL = TOL_FLOAT64  # the identities check_values holds the arrays to


def _inconsistent(path, what):
    return GoldenFileError(f"{path}: inconsistent golden file: {what}; every export satisfies "
                           "this, so the file was changed after export")


def check_values(path, meta, a):
    r"""Cheap identities every exported file satisfies: the enumeration's counts per depth
    and per response length (``b = V - 1`` open children under EOS, else ``V``), rows of
    ``p`` (and ``mu``) summing to 1, the response probabilities summing to 1, ``theta``
    the documented initial draw when ``theta_source`` is ``"init"``, and
    :math:`F = \sum_s \pi(s) f(s)` per stream."""
    sizes, model = meta["sizes"], meta["model"]
    V, T, X, eos = sizes["V"], sizes["T"], sizes["X"], model.get("eos", True)
    b = V - 1 if eos else V
    depth = a["state_depth"]
    if depth.size and (depth.min() < 0 or depth.max() >= T):
        raise _inconsistent(path, f"state_depth outside 0..{T - 1}")
    want = [X * b ** t for t in range(T)]
    if np.bincount(depth, minlength=T).tolist() != want:
        raise _inconsistent(path, f"states per depth {np.bincount(depth, minlength=T).tolist()}"
                                  f", the enumeration has {want}")
    lengths = (a["seq_tokens"] >= 0).sum(axis=1)  # (M,)
    want = ([X * b ** (n - 1) for n in range(1, T)] + [X * b ** (T - 1) * V] if eos
            else [0] * (T - 1) + [X * V ** T])
    got = np.bincount(lengths, minlength=T + 1)[1:].tolist()
    if got != want:
        raise _inconsistent(path, f"responses per length {got}, the enumeration has {want}")
    for key in ("state_probs", "sampler_probs"):
        if key in a and a[key].size and np.max(np.abs(a[key].sum(axis=1) - 1)) > VALUE_RTOL:
            raise _inconsistent(path, f"rows of {key!r} do not sum to 1")
    if abs(float(a["seq_prob"].sum()) - 1) > VALUE_RTOL:
        raise _inconsistent(path, f"seq_prob sums to {float(a['seq_prob'].sum())!r}, not 1")
    if meta["theta_source"] == "init":
        rng = np.random.default_rng(model.get("init_seed", 0))
        init = model.get("init_scale", 1.0) * rng.standard_normal(sizes["P"])
        if not np.array_equal(a["theta"], init):
            raise _inconsistent(path, "theta_source is 'init' but theta is not init_scale * "
                                      "default_rng(init_seed).standard_normal(P)")
    for p in ("", "offpolicy_"):
        if p + "sequence_fisher" in a:
            F, Ft = a[p + "sequence_fisher"], a[p + "token_fisher_sum"]
            scale = max(float(np.max(np.abs(F), initial=0)), float(np.max(np.abs(Ft), initial=0)))
            if float(np.max(np.abs(F - Ft), initial=0)) > VALUE_RTOL * scale:
                raise _inconsistent(path, f"{p}sequence_fisher differs from {p}token_fisher_sum "
                                          f"(identity 3: F = sum_s pi(s) f(s))")

