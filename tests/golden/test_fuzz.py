"""Fuzzing the two files a user hands fisher_ref: task-file JSON and golden-file bytes.

Whatever the bytes, loading ends in a result or in the documented error: ``ValueError``
or ``TypeError`` naming the problem (``FileProblem`` is a ``ValueError``) for a task file,
:class:`GoldenFileError` for a golden file; never another exception, never a hang, and a
golden file that loads equals the original in every array and in meta. Derandomized
(``derandomize=True, database=None, deadline=None``), so a failure reproduces.
"""
import json
import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fisher_ref.golden.check import golden_path
from fisher_ref.golden.archive import GoldenFileError
from fisher_ref.golden.format import array_sha256, load_golden, meta_sha256
from fisher_ref.golden.format import read_members, write_npz
from fisher_ref.tasks import Task, load_task

SETTINGS = dict(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture,
                                       HealthCheck.too_slow])
BASE = {"model": {"vocab_size": 4, "context": 2, "embed_dim": 2, "hidden": 3},
        "prompts": [[1, 2], [3]], "max_len": 2}
SOURCE = golden_path("tabular")
GOOD = load_golden(SOURCE)

# JSON values of every kind, the edge numbers of float64 and of Python's int included
numbers = st.one_of(st.integers(-10 ** 30, 10 ** 30), st.sampled_from(
    [0, -1, 1, 2, 10 ** 400, -(10 ** 400), 2 ** 63, 2 ** 64, 1e308, 5e-324, 1e-160, -0.0, 0.5,
     1e300]), st.floats(allow_nan=False, allow_infinity=False))
scalars = st.one_of(st.none(), st.booleans(), numbers,
                    st.text(max_size=8), st.sampled_from(["mean", "count", "\ud800", "\x1b[2J"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=6), inner, max_size=4)),
    max_leaves=12)
KEYS = ["model", "prompts", "prompt_weights", "max_len", "reward", "baseline", "sampler",
        "theta", "name", "vocab_size", "context", "embed_dim", "hidden", "eos", "bos",
        "init_seed", "init_scale", "arch", "kind", "temperature", "scale", "seed",
        "decimals", "token", "target", "n_positions", "n_layer", "n_head"]


@st.composite
def task_texts(draw):
    """BASE with a few fields (top level or model) replaced by arbitrary JSON, then perhaps
    a raw-text edit: a duplicated key, NaN, deep nesting, truncation."""
    d = json.loads(json.dumps(BASE))
    for _ in range(draw(st.integers(1, 3))):
        where = d if draw(st.booleans()) or not isinstance(d.get("model"), dict) else d["model"]
        where[draw(st.sampled_from(KEYS))] = draw(values)
    text = json.dumps(d, allow_nan=False) if draw(st.booleans()) else json.dumps(d)
    edit = draw(st.sampled_from(["none", "duplicate", "nan", "deep", "truncate", "bigint"]))
    if edit == "duplicate":
        text = text[:-1] + ', "max_len": 2}'
    elif edit == "nan":
        text = text.replace('"max_len": 2', '"max_len": NaN')
    elif edit == "deep":
        text = text[:-1] + ', "theta": ' + "[" * 5000 + "]" * 5000 + "}"
    elif edit == "truncate":
        text = text[:draw(st.integers(0, len(text)))]
    elif edit == "bigint":
        text = text.replace('"max_len": 2', '"max_len": ' + "9" * 5000)
    return text


def _ok_task_error(exc):
    return isinstance(exc, (ValueError, TypeError))


@settings(max_examples=300, **SETTINGS)
@given(text=task_texts())
def test_any_task_file_loads_or_is_refused_by_name(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("fuzz") / "task.json"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        task = load_task(path)
    except Exception as exc:  # noqa: BLE001 - the test is about which exception
        assert _ok_task_error(exc), f"{type(exc).__name__}: {exc}"
        assert str(exc), type(exc)
        return
    assert isinstance(task, Task)
    assert task.name.encode("utf-8") and task.theta.dtype == np.float64
    assert np.all(np.isfinite(task.theta)) and math.isclose(task.prompt_weights.sum(), 1.0)


RAW = SOURCE.read_bytes()


@st.composite
def damaged(draw):
    """The tabular golden file with bytes flipped, inserted, deleted or cut off."""
    b = bytearray(RAW)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "insert", "delete", "cut", "zero"]))
        i = draw(st.integers(0, max(len(b) - 1, 0)))
        if op == "flip" and b:
            b[i] ^= draw(st.integers(1, 255))
        elif op == "insert":
            b[i:i] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del b[i:i + draw(st.integers(1, 64))]
        elif op == "cut":
            b = b[:i]
        elif op == "zero":
            b[i:i + 8] = bytes(len(b[i:i + 8]))
    return bytes(b)


def _loads_as_the_original_or_refuses(path):
    try:
        g = load_golden(path)
    except GoldenFileError as exc:
        assert str(path) in str(exc)
        return False
    assert g.meta == GOOD.meta
    assert set(g.keys()) == set(GOOD.keys())
    assert all(np.array_equal(g[k], GOOD[k]) for k in GOOD.keys())
    return True


@settings(max_examples=300, **SETTINGS)
@given(data=damaged())
def test_any_damaged_golden_file_loads_unchanged_or_is_a_golden_file_error(tmp_path_factory,
                                                                           data):
    path = tmp_path_factory.mktemp("fuzz") / "damaged.npz"
    path.write_bytes(data)
    _loads_as_the_original_or_refuses(path)


MEMBERS = read_members(SOURCE)
META = json.loads(str(MEMBERS["meta"]))
META_PATHS = [(k,) for k in META if k not in ("meta_sha256",)] + \
    [("model", k) for k in META["model"]] + [("task", k) for k in META["task"]] + \
    [("sizes", k) for k in META["sizes"]]


@settings(max_examples=200, **SETTINGS)
@given(where=st.sampled_from(META_PATHS), value=values, rehash=st.booleans())
def test_any_meta_field_edited_and_rehashed_is_refused_or_harmless(tmp_path_factory, where,
                                                                   value, rehash):
    """A forger's file: one meta field set to arbitrary JSON, the meta hash recomputed."""
    meta = json.loads(json.dumps(META))
    d = meta
    for k in where[:-1]:
        d = d[k]
    d[where[-1]] = value
    arrays = {k: v for k, v in MEMBERS.items() if k != "meta"}
    if rehash:
        meta["sha256"] = {k: array_sha256(v) for k, v in arrays.items()} \
            if where != ("sha256",) else meta["sha256"]
    try:
        meta["meta_sha256"] = meta_sha256(meta)
    except (ValueError, RecursionError):  # NaN or too deep: not even writable as JSON
        return
    path = write_npz(tmp_path_factory.mktemp("fuzz") / "forged.npz", meta, arrays)
    try:
        g = load_golden(path)
    except GoldenFileError:
        return
    assert all(np.array_equal(g[k], GOOD[k]) for k in GOOD.keys())  # arrays never change
