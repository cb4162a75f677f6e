"""The reader's checks (fisher_ref.golden.validation), each refusing with a GoldenFileError
that names what is wrong, in the documented order: the meta (schema, version, its own
hash, the fields the reader uses), then the arrays (hashes, keys, dtypes, shapes, sizes).
Hostile edits a forger would make are in tests/golden/test_hostile.py."""
import json

import numpy as np
import pytest

from fisher_ref.golden.format import read_members
from fisher_ref.golden.hashes import array_sha256
from fisher_ref.golden.schema import MATRIX_MAX_PARAMS, OLDEST_READABLE_VERSION, SCHEMA_VERSION
from tests.golden.test_format import SOURCE, expect_error, rewrite


def test_altered_array_is_caught_by_its_hash(tmp_path):
    def change(meta, arrays):
        arrays["offpolicy_gradient"] = arrays["offpolicy_gradient"] + 1e-12
    expect_error(rewrite(tmp_path, change, rehash=False), "SHA-256 mismatch",
                 "'offpolicy_gradient'")


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
