"""The golden file as written and read (fisher_ref.golden.format): writes are atomic,
damage anywhere is refused or harmless, and the documented examples run. The reader's
checks in their order are tested in tests/golden/test_validation.py, the hashes in
test_hashes.py, the keys in test_schema.py."""
import io
import json
import re
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from fisher_ref.golden.format import (array_sha256, expected_keys, load_golden, meta_sha256,
                                      read_members, write_npz)
from fisher_ref.golden.archive import GoldenFileError
from fisher_ref.golden.check import compare_to_golden, file_scales, golden_path

SOURCE = golden_path("offpolicy_temperature")


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
