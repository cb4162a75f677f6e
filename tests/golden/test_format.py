"""The golden-file reader: plain numpy reads a file and its hashes, and every kind of
damage is refused by a GoldenFileError that names what is wrong, in the documented order."""
import hashlib
import io
import json
import re
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fisher_ref.golden.format import (MATRIX_MAX_PARAMS, OLDEST_READABLE_VERSION, SCALE_KINDS,
                                      SCHEMA_VERSION, array_sha256, expected_keys, load_golden,
                                      meta_sha256, read_members, write_npz)
from fisher_ref.golden.archive import GoldenFileError
from fisher_ref.golden.check import compare_to_golden, file_scales, golden_path

SOURCE = golden_path("offpolicy_temperature")


def test_plain_numpy_reads_the_file_and_hashes_match():
    with np.load(SOURCE, allow_pickle=False) as f:
        meta = json.loads(str(f["meta"]))
        claimed = meta.pop("meta_sha256")
        canonical = json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()
        assert hashlib.sha256(canonical).hexdigest() == claimed
        for key in f.files:
            if key != "meta":
                got = hashlib.sha256(f[key].tobytes()).hexdigest()
                assert got == meta["sha256"][key], key
        assert set(f.files) - {"meta"} == set(meta["sha256"])


def rewrite(tmp_path, change, rehash=True, rehash_meta=True, source=SOURCE):
    """Copy ``source`` with ``change(meta, arrays)`` applied; the arrays' hashes recomputed
    if ``rehash``, then the meta's own hash if ``rehash_meta`` (a careful forger's file)."""
    members = read_members(source)
    meta = json.loads(str(members.pop("meta")))
    change(meta, members)
    if rehash:
        meta["sha256"] = {k: array_sha256(v) for k, v in members.items()}
    if rehash_meta and "meta_sha256" in meta:
        meta["meta_sha256"] = meta_sha256(meta)
    return write_npz(tmp_path / "bad.npz", meta, members)


def expect_error(path, *needles):
    with pytest.raises(GoldenFileError) as info:
        load_golden(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))
    assert isinstance(info.value, ValueError)


def test_altered_array_is_caught_by_its_hash(tmp_path):
    def change(meta, arrays):
        arrays["offpolicy_gradient"] = arrays["offpolicy_gradient"] + 1e-12
    expect_error(rewrite(tmp_path, change, rehash=False), "SHA-256 mismatch",
                 "'offpolicy_gradient'")


def test_flipped_bytes_in_the_archive_name_the_array(tmp_path):
    raw = bytearray(SOURCE.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as zf:
        info = zf.getinfo("state_probs.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 200
    raw[start] ^= 0xFF
    path = tmp_path / "flipped.npz"
    path.write_bytes(bytes(raw))
    expect_error(path, "'state_probs'", "corrupted")


def test_random_damage_is_refused_or_harmless(tmp_path):
    """Flipped bytes anywhere and truncation at any length: the reader either refuses the
    file with a GoldenFileError or loads arrays and meta equal to the original's (the
    damage hit bytes no array depends on, such as a zip date)."""
    source = golden_path("tabular")
    raw, good = source.read_bytes(), load_golden(source)
    rng = np.random.default_rng(20240611)
    path, refused = tmp_path / "damaged.npz", 0
    for i in range(300):
        b = bytearray(raw)
        if i % 2:
            b = b[:rng.integers(len(b))]
        else:
            for _ in range(rng.integers(1, 4)):
                b[rng.integers(len(b))] ^= int(rng.integers(1, 256))
        path.write_bytes(bytes(b))
        try:
            g = load_golden(path)
        except GoldenFileError:
            refused += 1
            continue
        assert g.meta == good.meta and all(np.array_equal(g[k], good[k]) for k in good.keys())
    assert refused > 250, refused


def test_truncated_file(tmp_path):
    path = tmp_path / "short.npz"
    path.write_bytes(SOURCE.read_bytes()[: SOURCE.stat().st_size // 2])
    expect_error(path, "not a valid .npz", "truncated")


def test_missing_meta(tmp_path):
    path = tmp_path / "plain.npz"
    np.savez(path, theta=np.zeros(3))
    expect_error(path, "no 'meta' key")


def test_meta_not_json(tmp_path):
    path = tmp_path / "badmeta.npz"
    np.savez(path, meta=np.array("{not json"), theta=np.zeros(3))
    expect_error(path, "'meta' is not valid JSON")


def test_wrong_schema(tmp_path):
    def change(meta, arrays):
        meta["schema"] = "something.else"
    expect_error(rewrite(tmp_path, change), "schema is 'something.else'", "fisher_ref.golden")


@pytest.mark.parametrize("version,needle", [(SCHEMA_VERSION + 1, "newer than this reader"),
                                            (0, "older than the oldest"),
                                            (OLDEST_READABLE_VERSION - 1, "older than the oldest"),
                                            ("1", "must be an integer")])
def test_wrong_version(tmp_path, version, needle):
    def change(meta, arrays):
        meta["schema_version"] = version
    expect_error(rewrite(tmp_path, change), needle)


@pytest.mark.parametrize("old", [1, 2])
def test_old_version_is_refused_with_how_to_regenerate(tmp_path, old):
    # A file as schema_version 1 or 2 wrote it: no state_logits, seq_score or matrices
    # (and no meta_sha256 in version 1).
    def change(meta, arrays):
        meta["schema_version"] = old
        for key in ("matrices", "theta_source"):
            meta.pop(key)
        for key in ("state_logits", "seq_score", "sequence_fisher_matrix",
                    "token_fisher_matrix_sum"):
            arrays.pop(key)
        if old == 1:
            del meta["meta_sha256"]
    expect_error(rewrite(tmp_path, change), f"schema_version {old} is older than the oldest "
                 f"supported ({OLDEST_READABLE_VERSION})",
                 "python -m fisher_ref export --config NAME --out FILE",
                 "python -m fisher_ref regenerate")


def test_version_is_checked_before_the_meta_hash(tmp_path):
    def change(meta, arrays):
        meta["schema_version"] = SCHEMA_VERSION + 1
        meta["task"]["baseline"] = 123.0
    expect_error(rewrite(tmp_path, change, rehash_meta=False), "newer than this reader")


def _set_init_seed(meta):
    meta["model"]["init_seed"] += 1
    meta["task"]["model"]["init_seed"] += 1


def _set_baseline(meta):
    meta["task"]["baseline"] = 0.25


def _set_reward(meta):
    meta["task"]["reward"] = {"name": "length"}


def _set_array_hash(meta):  # an array and its hash both altered, meta_sha256 left alone
    meta["sha256"]["theta"] = "0" * 64


def _set_matrices(meta):
    meta["matrices"] = False


@pytest.mark.parametrize("edit", [_set_init_seed, _set_baseline, _set_reward, _set_array_hash,
                                  _set_matrices],
                         ids=["init_seed", "baseline", "reward", "array_hash", "matrices"])
def test_modified_meta_field_is_caught_by_the_meta_hash(tmp_path, edit):
    before = json.loads(str(read_members(SOURCE)["meta"]))
    def change(meta, arrays):
        edit(meta)
        assert meta != before  # the edit really changed a field
    expect_error(rewrite(tmp_path, change, rehash=False, rehash_meta=False),
                 "meta was modified: its SHA-256 is", "meta_sha256 says",
                 before["meta_sha256"][:16])


def test_meta_hash_is_checked_before_array_hashes(tmp_path):
    def change(meta, arrays):
        meta["task"]["baseline"] = 0.25
        arrays["theta"] = arrays["theta"] * 2
    expect_error(rewrite(tmp_path, change, rehash=False, rehash_meta=False),
                 "meta was modified")


def test_missing_meta_hash(tmp_path):
    def change(meta, arrays):
        del meta["meta_sha256"]
    expect_error(rewrite(tmp_path, change), "no valid 'meta_sha256' entry")


@pytest.mark.parametrize("field", ["matrices", "offpolicy", "theta_source", "layout"])
def test_missing_meta_field(tmp_path, field):
    def change(meta, arrays):
        del meta[field]
    expect_error(rewrite(tmp_path, change), f"no valid {field!r} entry")


def test_meta_hash_is_of_the_canonical_json_not_the_stored_text(tmp_path):
    # Same meta, other key order and whitespace: still loads (the hash is of the content).
    members = read_members(SOURCE)
    meta = json.loads(str(members.pop("meta")))
    text = json.dumps(dict(reversed(list(meta.items()))), indent=2)
    path = tmp_path / "pretty.npz"
    np.savez(path, meta=np.array(text), **members)
    assert load_golden(path).meta == meta
    assert meta_sha256(meta) == meta["meta_sha256"]


def test_schema_is_checked_before_hashes(tmp_path):
    def change(meta, arrays):
        meta["schema"] = "other"
        arrays["theta"] = arrays["theta"] * 2
    expect_error(rewrite(tmp_path, change, rehash=False), "schema is 'other'")


def test_missing_key(tmp_path):
    def change(meta, arrays):
        del arrays["offpolicy_cross_terms"]
    expect_error(rewrite(tmp_path, change), "missing", "offpolicy_cross_terms")


def test_missing_matrix_key(tmp_path):
    def change(meta, arrays):
        del arrays["token_fisher_matrix_sum"]
    expect_error(rewrite(tmp_path, change), "required key(s) missing: ['token_fisher_matrix_sum']")


def test_matrix_keys_in_a_file_that_says_it_has_none(tmp_path):
    def change(meta, arrays):
        meta["matrices"] = False
    expect_error(rewrite(tmp_path, change), "unexpected key(s) ['sequence_fisher_matrix', "
                 "'token_fisher_matrix_sum']", "matrices=False")


def test_missing_key_with_its_hash_left_in_meta(tmp_path):
    def change(meta, arrays):
        del arrays["offpolicy_cross_terms"]
    expect_error(rewrite(tmp_path, change, rehash=False),
                 "required key(s) missing: ['offpolicy_cross_terms']", "still listed in meta.sha256")


def test_unexpected_key(tmp_path):
    def change(meta, arrays):
        arrays["my_extra"] = np.zeros(2)
    expect_error(rewrite(tmp_path, change), "unexpected key(s) ['my_extra'] for schema_version")


def test_stray_array_without_hash_is_an_unexpected_key(tmp_path):
    # Reported by the keys stage (after every recorded hash was verified), not the hash stage.
    def change(meta, arrays):
        arrays["my_extra"] = np.zeros(2)
    expect_error(rewrite(tmp_path, change, rehash=False),
                 "unexpected key(s) ['my_extra'] for schema_version",
                 "['my_extra'] also have no SHA-256 in meta")


def test_altered_array_is_reported_before_a_stray_array(tmp_path):
    def change(meta, arrays):
        arrays["my_extra"] = np.zeros(2)
        arrays["gradient"] = arrays["gradient"] * 2
    expect_error(rewrite(tmp_path, change, rehash=False), "SHA-256 mismatch", "'gradient'")


def test_expected_array_without_hash(tmp_path):
    def change(meta, arrays):
        del meta["sha256"]["bound"]
    expect_error(rewrite(tmp_path, change, rehash=False),
                 "array(s) ['bound'] have no SHA-256 in meta", "missing from meta.sha256")


def test_hash_for_an_array_that_is_not_there(tmp_path):
    def change(meta, arrays):
        meta["sha256"]["my_extra"] = array_sha256(np.zeros(2))
    expect_error(rewrite(tmp_path, change, rehash=False),
                 "meta.sha256 lists unexpected key(s) ['my_extra']", "no such array")


def test_wrong_dtype(tmp_path):
    def change(meta, arrays):
        arrays["state_reach"] = arrays["state_reach"].astype(np.float32)
    expect_error(rewrite(tmp_path, change), "'state_reach'", "dtype <f4", "expected <f8")


def test_wrong_integer_dtype(tmp_path):
    def change(meta, arrays):
        arrays["seq_tokens"] = arrays["seq_tokens"].astype(np.int32)
    expect_error(rewrite(tmp_path, change), "'seq_tokens'", "dtype <i4")


def test_wrong_shape(tmp_path):
    def change(meta, arrays):
        arrays["state_token_fisher"] = arrays["state_token_fisher"][:, :-1]
    expect_error(rewrite(tmp_path, change), "'state_token_fisher'", "shape (42, 118)",
                 "expected (42, 119)")


def test_wrong_matrix_shape(tmp_path):
    def change(meta, arrays):
        arrays["sequence_fisher_matrix"] = arrays["sequence_fisher_matrix"][:-1]
    expect_error(rewrite(tmp_path, change), "'sequence_fisher_matrix'", "shape (118, 119)",
                 "expected (119, 119)")


def test_sizes_inconsistent_with_theta(tmp_path):
    def change(meta, arrays):
        arrays["theta"] = arrays["theta"][:-1]
    expect_error(rewrite(tmp_path, change), "P=119", "theta gives 118")


def test_meta_sizes_incomplete(tmp_path):
    def change(meta, arrays):
        del meta["sizes"]["N"]
    expect_error(rewrite(tmp_path, change), "meta sizes lack an integer 'N'")


def test_matrices_beyond_the_parameter_limit_are_refused(tmp_path):
    P = MATRIX_MAX_PARAMS + 1
    def change(meta, arrays):
        meta["layout"] = [{"name": "theta", "shape": [P], "offset": 0}]
        meta["sizes"]["P"] = P
        arrays["theta"] = np.zeros(P)
    expect_error(rewrite(tmp_path, change), f"P={P} exceeds {MATRIX_MAX_PARAMS}")


def test_written_file_is_atomic_and_leaves_nothing_on_failure(tmp_path, monkeypatch):
    members = read_members(SOURCE)
    meta = json.loads(str(members.pop("meta")))
    target = tmp_path / "out.npz"
    target.write_bytes(b"previous content")
    def full_disk(self, data):
        with open(self, "wb") as f:
            f.write(data[: len(data) // 3])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(ValueError, match="No space left on device") as info:
        write_npz(target, meta, members)
    assert str(target) in str(info.value)
    assert target.read_bytes() == b"previous content"  # the old file is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.npz"]  # no temporary left


def test_doctests():
    import doctest
    import fisher_ref.golden.format
    assert doctest.testmod(fisher_ref.golden.format).failed == 0


# --- docs/golden_format.md ------------------------------------------------------------------

DOC = Path(__file__).resolve().parents[2] / "docs" / "golden_format.md"


def doc_blocks():
    return re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)


def test_docs_list_every_key_with_dtype_shape_and_scale():
    text = DOC.read_text()
    for key, (dt, dims, kind) in expected_keys(True, True).items():
        shape = "`()`" if not dims else "`(" + ", ".join(dims) + (",)`" if len(dims) == 1 else ")`")
        assert f"| `{key}` | {dt} | {shape} | {kind} |" in text, key
    for kind in SCALE_KINDS:
        assert f"\n| {kind} |" in text, kind


def test_docs_examples_run_and_agree_with_compare_to_golden(capsys):
    first, numpy_only = (textwrap.dedent(b) for b in doc_blocks())
    exec(first, {})
    ns = {}
    exec(numpy_only, ns)
    meta, gold = ns["read_golden"](golden_path("default"))
    g = load_golden(golden_path("default"))
    assert meta == g.meta and set(gold) == set(g.keys())
    S, Rs = file_scales(g.arrays)
    floors = {"value": 0.0, "score": S, "fisher": S * S, "gradient": Rs * S}
    rng = np.random.default_rng(1)
    for key in ("state_probs", "score_mean", "state_token_fisher", "gradient"):
        mine = gold[key] * (1 + 1e-9 * rng.standard_normal(gold[key].shape))
        kind = expected_keys(False, True)[key][2]
        assert ns["relative_error"](mine, gold[key], floors[kind]) == pytest.approx(
            compare_to_golden({key: mine}, g)[key].rel, rel=1e-12)
    assert ns["relative_error"](np.zeros(3), np.zeros(3)) == 0.0


def test_numpy_only_reader_refuses_a_modified_meta(tmp_path):
    ns = {}
    exec(textwrap.dedent(doc_blocks()[1]), ns)
    members = read_members(golden_path("default"))
    meta = json.loads(str(members.pop("meta")))
    meta["task"]["baseline"] = 0.25
    path = write_npz(tmp_path / "edited.npz", meta, members)
    with pytest.raises(AssertionError, match="meta was modified"):
        ns["read_golden"](path)
