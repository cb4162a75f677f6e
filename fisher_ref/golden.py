r"""Golden files (DESIGN §4): a task's exact values in a versioned ``.npz``.

One file per task; key ``meta`` holds a JSON string (schema, version, model,
task, parameter layout, sizes, a SHA-256 of every other array, and
``meta_sha256``, the SHA-256 of the canonical JSON of the meta itself without
that field); every other key is a little-endian float64 or int64 array. The format is written out key
by key in ``docs/golden_format.md`` for readers who never run fisher_ref.

Files are byte-for-byte reproducible on one machine: the zip is written by hand
with fixed timestamps, no compression and sorted keys, and the JSON with sorted
keys and ``repr`` floats. (Another CPU class may make BLAS sum in another order
and change floats in the last bits, and so the bytes.)

    python -m fisher_ref export --config default --out default.npz
    python -m fisher_ref.golden --regenerate golden/
"""
from __future__ import annotations

import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

import numpy as np

from .command import task_from_args
from .version import __version__

__all__ = ["SCHEMA", "SCHEMA_VERSION", "GoldenFileError", "Golden", "golden_arrays",
           "export_golden", "load_golden", "compare_golden", "array_sha256", "meta_sha256",
           "regenerate_golden_files", "GOLDEN_CONFIGS", "add_arguments", "run"]

SCHEMA = "fisher_ref.golden"
# Bump on ANY change of keys, dtypes, shapes or meaning. History: 1 first format;
# 2 adds meta["meta_sha256"] (meta was unprotected in 1, so 1 is no longer read).
SCHEMA_VERSION = 2
OLDEST_READABLE_VERSION = 2
GOLDEN_CONFIGS = ("default", "no_eos", "offpolicy_temperature", "offpolicy_stale", "tabular",
                  "weighted_prompts")
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest date a zip entry can hold
RTOL_COMPARE = 1e-10

# key -> (dtype, shape as size symbols). P params, V vocab, T max_len, N states,
# M responses, L state width, X prompts; () is a 0-d array.
_ON = {
    "theta": ("f8", "P"), "prompt_weights": ("f8", "X"),
    "state_tokens": ("i8", "NL"), "state_prompt": ("i8", "N"), "state_depth": ("i8", "N"),
    "state_reach": ("f8", "N"), "state_probs": ("f8", "NV"),
    "state_token_fisher": ("f8", "NP"), "state_uniform_token_fisher": ("f8", "NP"),
    "seq_tokens": ("i8", "MT"), "seq_prompt": ("i8", "M"), "seq_prob": ("f8", "M"),
    "seq_reward": ("f8", "M"), "seq_advantage": ("f8", "M"),
    "sequence_fisher": ("f8", "P"), "token_fisher_sum": ("f8", "P"),
    "score_mean": ("f8", "P"), "gradient": ("f8", "P"), "covariance": ("f8", "P"),
    "gradient_autodiff": ("f8", "P"), "bound": ("f8", "P"), "correlation": ("f8", "P"),
    "cross_terms": ("f8", "TTP"),
    "expected_reward": ("f8", ""), "reward_std": ("f8", ""), "baseline": ("f8", ""),
}
_OFF = {
    "sampler_theta": ("f8", "P"), "sampler_reach": ("f8", "N"), "sampler_probs": ("f8", "NV"),
    "sampler_token_fisher": ("f8", "NP"), "sampler_raw_score_mean": ("f8", "NP"),
    "seq_sampler_prob": ("f8", "M"), "seq_sampler_advantage": ("f8", "M"),
    "offpolicy_sequence_fisher": ("f8", "P"), "offpolicy_token_fisher_sum": ("f8", "P"),
    "offpolicy_score_mean": ("f8", "P"), "offpolicy_gradient": ("f8", "P"),
    "offpolicy_covariance": ("f8", "P"), "offpolicy_bound": ("f8", "P"),
    "offpolicy_correlation": ("f8", "P"), "offpolicy_cross_terms": ("f8", "TTP"),
    "offpolicy_gradient_uncentered": ("f8", "P"),
    "offpolicy_score_mean_uncentered": ("f8", "P"),
    "offpolicy_sequence_fisher_uncentered": ("f8", "P"),
    "offpolicy_importance_gradient": ("f8", "P"),
    "offpolicy_expected_reward": ("f8", ""), "offpolicy_reward_std": ("f8", ""),
    "offpolicy_baseline": ("f8", ""),
}
# Arrays that are 0 in exact arithmetic: compared against the scale of the score
# (sqrt of the matching sequence Fisher), not against their own rounding noise.
_ZERO_SCALE = {"score_mean": "sequence_fisher", "offpolicy_score_mean": "offpolicy_sequence_fisher"}


class GoldenFileError(ValueError):
    """A golden file is unreadable or inconsistent; the message names what is wrong."""


def array_sha256(a):
    """SHA-256 (hex) of an array's raw bytes in C order, as stored (little-endian).

    Example:
        >>> array_sha256(np.zeros(2))[:16]
        '374708fff7719dd5'
    """
    return hashlib.sha256(np.asarray(a).tobytes(order="C")).hexdigest()


def meta_sha256(meta):
    """SHA-256 (hex) of the canonical JSON of ``meta`` without its ``meta_sha256`` field.

    Canonical JSON: ``json.dumps(meta, sort_keys=True, separators=(",", ":"),
    ensure_ascii=True)`` (Python's defaults otherwise), encoded as ASCII.

    Example:
        >>> meta_sha256({"b": 1, "a": [2.5], "meta_sha256": "ignored"})[:16]
        '11cf70519f8728b2'
    """
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    return hashlib.sha256(_json(body).encode("ascii")).hexdigest()


def golden_arrays(task, exact_result=None):
    """The arrays of a golden file for ``task`` (computing ``exact`` if not given).

    Returns:
        dict key -> ndarray (float64 ``<f8`` or int64 ``<i8``), see ``docs/golden_format.md``.
    """
    from .exact import exact
    r = exact_result if exact_result is not None else exact(task)  # bar after 2 s
    if r.states is None or r.sequences is None:
        raise ValueError("golden files need the per-state and per-response arrays; "
                         "run exact(..., keep_states=True, keep_sequences=True)")
    st, sq = r.states, r.sequences
    a = {"theta": task.theta, "prompt_weights": task.prompt_weights,
         "state_tokens": st["tokens"], "state_prompt": st["prompt"], "state_depth": st["depth"],
         "state_reach": st["reach"], "state_probs": st["probs"],
         "state_token_fisher": st["token_fisher"], "state_uniform_token_fisher": st["uniform"],
         "seq_tokens": sq["tokens"], "seq_prompt": sq["prompt"], "seq_prob": sq["prob"],
         "seq_reward": sq["reward"], "seq_advantage": sq["advantage"],
         "gradient_autodiff": r.gradient_autodiff}
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
    spec = _expected_keys(task.sampler is not None)
    return {k: np.array(v, dtype="<" + spec[k][0], order="C") for k, v in a.items()}  # 0-d kept


def _expected_keys(offpolicy):
    return {**_ON, **_OFF} if offpolicy else dict(_ON)


def _meta(task, arrays):
    from .rewards import Reward, make_reward
    if not isinstance(task.reward, Reward):  # a bare callable: record it by name
        task = task.with_(reward=make_reward(task.reward))
    st, sq = arrays["state_tokens"], arrays["seq_tokens"]
    meta = {"schema": SCHEMA, "schema_version": SCHEMA_VERSION,
            "generator": f"fisher_ref {__version__}", "name": task.name,
            "model": task.model.describe(), "task": task.to_json(),
            "offpolicy": task.sampler is not None,
            "layout": [{"name": n, "shape": list(s), "offset": int(o)}
                       for n, s, o in task.model.layout()],
            "sizes": {"P": int(task.model.num_params), "V": int(task.model.vocab_size),
                      "T": int(task.max_len), "N": int(st.shape[0]), "M": int(sq.shape[0]),
                      "L": int(st.shape[1]), "X": len(task.prompts)},
            "sha256": {k: array_sha256(v) for k, v in sorted(arrays.items())}}
    meta["meta_sha256"] = meta_sha256(meta)
    return meta


def _json(obj):
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=True)


def _write_npz(path, meta, arrays):
    """Write a deterministic ``.npz``: sorted entries, fixed date, stored (no compression)."""
    entries = dict(arrays)
    entries["meta"] = np.array(_json(meta))
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as zf:
        for key in sorted(entries):
            info = zipfile.ZipInfo(key + ".npy", date_time=_ZIP_DATE)
            info.compress_type = zipfile.ZIP_STORED
            info.create_system = 3
            info.external_attr = 0o644 << 16
            data = io.BytesIO()
            np.lib.format.write_array(data, np.asarray(entries[key]), version=(1, 0),
                                      allow_pickle=False)
            zf.writestr(info, data.getvalue())
    Path(path).write_bytes(buf.getvalue())


def export_golden(task, path, exact_result=None):
    """Write the golden file of ``task`` to ``path`` (DESIGN §4); returns ``path``.

    Args:
        task: a :class:`fisher_ref.tasks.Task` (a custom reward is recorded by name).
        path: destination ``.npz``.
        exact_result: an :class:`ExactResult` of ``task`` with states and sequences
            kept (computed if ``None``).
    """
    arrays = golden_arrays(task, exact_result)
    _write_npz(path, _meta(task, arrays), arrays)
    return Path(path)


class Golden:
    """A loaded golden file: ``meta`` (dict) and ``arrays`` (dict); ``g[key]`` reads an array."""

    def __init__(self, meta, arrays, path=None):
        self.meta, self.arrays, self.path = meta, arrays, path

    def __getitem__(self, key):
        return self.arrays[key]

    def __contains__(self, key):
        return key in self.arrays

    def keys(self):
        return self.arrays.keys()

    @property
    def sizes(self):
        return self.meta["sizes"]

    def __repr__(self):
        return f"Golden({self.meta.get('name')!r}, {len(self.arrays)} arrays, sizes={self.sizes})"


def _read_members(path):
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise GoldenFileError(f"cannot read golden file {path}: {exc}") from None
    if not zipfile.is_zipfile(io.BytesIO(raw)):
        raise GoldenFileError(
            f"{path} is not a golden file: not a valid .npz (zip) archive ({len(raw)} bytes; "
            "truncated or not an .npz)")
    out = {}
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as zf:
            for name in zf.namelist():
                key = name[:-4] if name.endswith(".npy") else name
                try:
                    data = zf.read(name)
                except zipfile.BadZipFile as exc:
                    raise GoldenFileError(f"{path}: array {key!r} is corrupted: {exc}") from None
                try:
                    out[key] = np.lib.format.read_array(io.BytesIO(data), allow_pickle=False)
                except (ValueError, OSError, EOFError) as exc:
                    raise GoldenFileError(
                        f"{path}: array {key!r} is not a readable .npy array: {exc}") from None
    except (zipfile.BadZipFile, zipfile.LargeZipFile, EOFError, OSError) as exc:
        raise GoldenFileError(f"{path}: broken .npz (zip) archive, truncated?: {exc}") from None
    return out


def _check_meta(path, members):
    if "meta" not in members:
        raise GoldenFileError(f"{path}: no 'meta' key; not a fisher_ref golden file")
    m = members.pop("meta")
    if m.shape != () or m.dtype.kind != "U":
        raise GoldenFileError(f"{path}: 'meta' must be a 0-d unicode string array, "
                              f"got dtype {m.dtype} shape {m.shape}")
    try:
        meta = json.loads(str(m))
    except json.JSONDecodeError as exc:
        raise GoldenFileError(f"{path}: 'meta' is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise GoldenFileError(f"{path}: 'meta' must be a JSON object")
    if meta.get("schema") != SCHEMA:
        raise GoldenFileError(f"{path}: schema is {meta.get('schema')!r}, expected {SCHEMA!r}")
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
            f"({OLDEST_READABLE_VERSION}); regenerate the file")
    claimed = meta.get("meta_sha256")
    if not isinstance(claimed, str):
        raise GoldenFileError(f"{path}: meta has no valid 'meta_sha256' entry (the SHA-256 of "
                              f"the meta itself, required from schema_version 2), got {claimed!r}")
    got = meta_sha256(meta)
    if got != claimed:
        raise GoldenFileError(
            f"{path}: meta was modified: its SHA-256 is {got[:16]}..., but meta_sha256 says "
            f"{claimed[:16]}... (a field of meta, e.g. the model, task, reward, baseline, "
            "layout, sizes or array hashes, was edited or corrupted after export)")
    for key, kind in (("sha256", dict), ("sizes", dict), ("model", dict), ("task", dict),
                      ("layout", list)):
        if not isinstance(meta.get(key), kind):
            raise GoldenFileError(f"{path}: meta has no valid {key!r} entry "
                                  f"(expected a JSON {'object' if kind is dict else 'array'})")
    return meta


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
    expected = _expected_keys(bool(meta.get("offpolicy")))
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
                              f"{SCHEMA_VERSION}{note}")
    unhashed = sorted(present - hashed)
    if unhashed:
        raise GoldenFileError(f"{path}: array(s) {unhashed} have no SHA-256 in meta "
                              "(key(s) missing from meta.sha256)")
    orphans = sorted(hashed - present)
    if orphans:
        raise GoldenFileError(f"{path}: meta.sha256 lists unexpected key(s) {orphans}: "
                              "no such array is in the file")
    return expected


def _check_arrays(path, meta, arrays):
    _check_hashes(path, meta, arrays)
    expected = _check_keys(path, meta, arrays)
    for key, (dt, _) in expected.items():
        if arrays[key].dtype != np.dtype("<" + dt):
            raise GoldenFileError(f"{path}: array {key!r} has dtype {arrays[key].dtype.str}, "
                                  f"expected {np.dtype('<' + dt).str}")
    sizes = dict(meta["sizes"])
    for sym in "PVTNMLX":
        if isinstance(sizes.get(sym), bool) or not isinstance(sizes.get(sym), int):
            raise GoldenFileError(f"{path}: meta sizes lack an integer {sym!r} (got {sizes})")
    P = int(np.sum([np.prod(e["shape"]) for e in meta["layout"]]))
    checks = [("P", P, "the parameter layout"), ("P", arrays["theta"].shape[0], "theta"),
              ("V", meta["model"].get("vocab_size"), "model.vocab_size"),
              ("T", meta["task"].get("max_len"), "task.max_len"),
              ("X", len(meta["task"].get("prompts", [])), "task.prompts")]
    for sym, value, what in checks:
        if sizes.get(sym) != value:
            raise GoldenFileError(f"{path}: meta sizes give {sym}={sizes.get(sym)} but "
                                  f"{what} gives {value}")
    for key, (_, dims) in expected.items():
        want = tuple(int(sizes[c]) for c in dims)
        if arrays[key].shape != want:
            raise GoldenFileError(
                f"{path}: array {key!r} has shape {arrays[key].shape}, expected {want} "
                f"({', '.join(f'{c}={sizes[c]}' for c in dims) or 'a 0-d array'})")


def load_golden(path):
    """Load and check a golden file: zip, meta, schema, version, hashes (meta's own, then
    the arrays'), keys, dtypes, shapes.

    Raises:
        GoldenFileError: naming the first thing that is wrong, in that order.

    Example:
        >>> import tempfile
        >>> from fisher_ref import load_config
        >>> path = Path(tempfile.mkdtemp()) / "tabular.npz"
        >>> g = load_golden(export_golden(load_config("tabular"), path))
        >>> g["sequence_fisher"].shape, g.meta["schema_version"]
        ((12,), 2)

    Returns:
        :class:`Golden` with ``meta`` and ``arrays``.
    """
    members = _read_members(path)
    meta = _check_meta(path, members)
    _check_arrays(path, meta, members)
    return Golden(meta, members, path)


def _as_arrays(x):
    if isinstance(x, Golden):
        return x.arrays
    if isinstance(x, (str, Path)):
        return load_golden(x).arrays
    return dict(x)


def compare_golden(a, b, rtol=RTOL_COMPARE):
    r"""Compare arrays ``b`` (another implementation) with the golden ``a``, key by key.

    Error of a key: :math:`\max|a-b|`, relative to :math:`\max(\max|a|, \max|b|)`
    (for ``score_mean``, which is 0 exactly, relative to :math:`\max\sqrt{F}`).
    Keys of ``a`` missing from ``b`` fail with ``nan`` errors.

    Args:
        a, b: :class:`Golden`, a path, or a dict of arrays.

    Returns:
        list of ``(key, max_abs_err, max_rel_err, passed)`` for every key of ``a``.

    Example:
        >>> compare_golden({"theta": np.array([1.0, 2.0])}, {"theta": np.array([1.0, 2.5])})
        [('theta', 0.5, 0.2, False)]
    """
    A, B = _as_arrays(a), _as_arrays(b)
    out = []
    for key in sorted(A):
        x = np.asarray(A[key], dtype=float)
        if key not in B:
            out.append((key, float("nan"), float("nan"), False))
            continue
        y = np.asarray(B[key], dtype=float)
        if x.shape != y.shape:
            out.append((key, float("inf"), float("inf"), False))
            continue
        err = float(np.max(np.abs(x - y))) if x.size else 0.0
        if key in _ZERO_SCALE and _ZERO_SCALE[key] in A:
            scale = float(np.sqrt(np.max(A[_ZERO_SCALE[key]])))
        else:
            scale = float(max(np.max(np.abs(x)), np.max(np.abs(y)))) if x.size else 0.0
        rel = err / scale if scale > 0 else (0.0 if err == 0 else float("inf"))
        out.append((key, err, rel, bool(np.isfinite(rel) and rel <= rtol)))
    return out


def regenerate_golden_files(directory, configs=GOLDEN_CONFIGS):
    """Write ``<config>.npz`` for each named config into ``directory``; returns the paths."""
    from .tasks import load_config
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    return [export_golden(load_config(name), directory / f"{name}.npz") for name in configs]


def add_arguments(parser):
    """``export`` options: ``--out FILE.npz`` (required)."""
    parser.add_argument("--out", required=True, metavar="FILE.npz",
                        help="where to write the golden file")


def run(args):
    """``python -m fisher_ref export``: write the golden file and say what was written."""
    task = task_from_args(args)
    path = export_golden(task, args.out)
    data = path.read_bytes()
    g = load_golden(path)
    print(f"wrote {path}: {len(data):,} bytes, {len(g.arrays)} arrays "
          f"(task {task.name!r}, P={g.sizes['P']}, N={g.sizes['N']} states, "
          f"M={g.sizes['M']} responses), sha256 {hashlib.sha256(data).hexdigest()}")
    return 0


def main(argv=None):
    """``python -m fisher_ref.golden --regenerate DIR``: rewrite the committed golden files."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m fisher_ref.golden")
    parser.add_argument("--regenerate", required=True, metavar="DIR")
    args = parser.parse_args(argv)
    for path in regenerate_golden_files(args.regenerate):
        print(f"{path}: {path.stat().st_size:,} bytes, "
              f"sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
