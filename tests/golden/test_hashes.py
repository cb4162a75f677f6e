"""The hashes a golden file records (fisher_ref.golden.hashes): plain hashlib over the
array bytes and the canonical JSON of the meta reproduces them, and the meta hash is of
the content, not of the stored text."""
import hashlib
import json

import numpy as np
import pytest

from fisher_ref.golden.format import load_golden, read_members
from fisher_ref.golden.hashes import array_sha256, canonical_json, meta_sha256
from tests.golden.test_format import SOURCE


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


def test_meta_hash_is_of_the_canonical_json_not_the_stored_text(tmp_path):
    # Same meta, other key order and whitespace: still loads (the hash is of the content).
    members = read_members(SOURCE)
    meta = json.loads(str(members.pop("meta")))
    text = json.dumps(dict(reversed(list(meta.items()))), indent=2)
    path = tmp_path / "pretty.npz"
    np.savez(path, meta=np.array(text), **members)
    assert load_golden(path).meta == meta
    assert meta_sha256(meta) == meta["meta_sha256"]


def test_the_hashes_are_of_c_order_bytes_and_sorted_compact_ascii_json():
    a = np.arange(6.0).reshape(2, 3)
    assert array_sha256(a) == hashlib.sha256(a.tobytes()).hexdigest()
    assert array_sha256(a.T) == array_sha256(np.ascontiguousarray(a.T)) != array_sha256(a)
    assert canonical_json({"b": [1, 2.5], "a": "\u00e9"}) == '{"a":"\\u00e9","b":[1,2.5]}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})
    meta = {"b": 1, "a": [2.5]}
    assert meta_sha256(meta) == meta_sha256({**meta, "meta_sha256": "anything"}) == \
        hashlib.sha256(b'{"a":[2.5],"b":1}').hexdigest()
    assert meta_sha256({"b": 2, "a": [2.5]}) != meta_sha256(meta)
