"""The .npz container of a golden file (fisher_ref.golden.archive), read without trusting
it: sizes are checked before anything is allocated, the zip and each .npy header must be
sound, and a shipped name must hold the bytes the manifest records."""
import io
import os
import zipfile

import numpy as np
import pytest

import fisher_ref.golden.archive as archive
from fisher_ref.golden import manifest
from fisher_ref.golden.check import GOLDEN_DIR, golden_path
from fisher_ref.golden.format import load_golden, read_members
from tests.golden.test_format import expect_error, rewrite

SOURCE = golden_path("tabular")


def zip_of(tmp_path, entries, name="hostile.npz", compression=zipfile.ZIP_STORED):
    """A zip of ``{entry name: bytes}``."""
    path = tmp_path / name
    with zipfile.ZipFile(path, "w", compression=compression) as zf:
        for key, data in entries.items():
            zf.writestr(key, data)
    return path


def npy(array):
    buf = io.BytesIO()
    np.lib.format.write_array(buf, array, allow_pickle=False)
    return buf.getvalue()


def meta_entry(text):
    return npy(np.array(text))


def test_npy_header_claiming_1e12_floats_is_refused_before_allocation(tmp_path):
    head = npy(np.zeros(1))
    fake = head.replace(b"(1,)", b"(1000000000000,)")  # the header now claims 8 TB
    fake = fake[:len(head) - 8]  # same header length, no data
    path = zip_of(tmp_path, {"meta.npy": meta_entry("{}"), "theta.npy": fake})
    assert path.stat().st_size < 1000
    expect_error(path, "'theta'", "claims shape (1000000000000,)", "holds")


def test_zip_entries_declaring_more_than_the_limit_are_refused(tmp_path, monkeypatch):
    """A zip bomb: 8 MB of zeros deflate to a few KB; its declared size is checked first."""
    monkeypatch.setattr(archive, "MAX_GOLDEN_BYTES", 2 ** 20)
    path = zip_of(tmp_path, {"meta.npy": meta_entry("{}"), "theta.npy": npy(np.zeros(2 ** 20))},
                  compression=zipfile.ZIP_DEFLATED)
    assert path.stat().st_size < 2 ** 16
    expect_error(path, "declare", "more than the limit", "zip bomb")


def test_file_larger_than_the_limit_is_refused_unread(tmp_path, monkeypatch):
    monkeypatch.setattr(archive, "MAX_GOLDEN_BYTES", 1000)
    expect_error(SOURCE, "more than the limit of 1,000 bytes")


def test_non_regular_files_are_refused_without_reading(tmp_path):
    expect_error("/dev/zero", "not a regular file")
    fifo = tmp_path / "pipe.npz"
    os.mkfifo(fifo)  # no writer: opening it would block forever
    expect_error(fifo, "FIFO")


def test_repeated_entry_names_are_refused(tmp_path):
    path = tmp_path / "twice.npz"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("meta.npy", meta_entry("{}"))
        with pytest.warns(UserWarning):
            zf.writestr("meta.npy", meta_entry("{}"))
    expect_error(path, "appear more than once")


def test_a_shipped_name_whose_bytes_differ_is_flagged(tmp_path, monkeypatch):
    """A re-hashed edit of a shipped file, in the shipped directory: the manifest catches it
    (the directory is stood in for by tmp_path)."""
    monkeypatch.setattr(archive, "SHIPPED_DIR", tmp_path)
    edited = rewrite(tmp_path, lambda m, a: m.__setitem__("generator", "me"), source=SOURCE)
    shipped = tmp_path / "tabular.npz"
    edited.rename(shipped)
    expect_error(shipped, "changed after release", manifest.SHA256["tabular"][:16])
    (tmp_path / "mine.npz").write_bytes(SOURCE.read_bytes())  # not a shipped name: loads
    assert load_golden(tmp_path / "mine.npz").name == "tabular"
    shipped.write_bytes(SOURCE.read_bytes())
    assert load_golden(shipped).name == "tabular"  # the released bytes load


def test_the_same_bytes_outside_the_package_load():
    assert archive.SHIPPED_DIR.resolve() == GOLDEN_DIR.resolve()
    assert load_golden(SOURCE).name == "tabular"


def test_corrupted_compressed_entry_is_a_golden_file_error(tmp_path):
    # np.savez_compressed deflates each entry: damage inside the deflate stream makes
    # zipfile raise zlib.error or BadZipFile, which must surface as GoldenFileError.
    path = tmp_path / "compressed.npz"
    np.savez_compressed(path, meta=np.array("{}"), theta=np.arange(4000.0))
    raw = bytearray(path.read_bytes())
    with zipfile.ZipFile(io.BytesIO(bytes(raw))) as zf:
        info = zf.getinfo("theta.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra)
    for i in range(start + 10, start + 40):
        raw[i] ^= 0x5A
    path.write_bytes(bytes(raw))
    expect_error(path, "'theta'", "corrupted")


def test_unsupported_zip_version_is_a_golden_file_error(tmp_path):
    raw = bytearray(golden_path("tabular").read_bytes())
    at = raw.index(b"PK\x01\x02")  # first central directory entry
    raw[at + 6:at + 8] = b"\xff\x00"  # "version needed to extract" 25.5
    path = tmp_path / "version.npz"
    path.write_bytes(bytes(raw))
    expect_error(path, "broken .npz", "zip file version")


def test_garbage_file(tmp_path):
    path = tmp_path / "garbage.npz"
    path.write_bytes(b"this is not an npz file\n" * 10)
    expect_error(path, "not a valid .npz")


def test_missing_file(tmp_path):
    expect_error(tmp_path / "absent.npz", "cannot read")


def test_an_edited_copy_claiming_a_shipped_name_is_refused(tmp_path):
    """issue 46 item 4: a copy of the shipped ``default`` with its reward token changed and
    every hash rewritten, outside the package, loaded silently; a file that claims a shipped
    name must be that file (or a regeneration of it)."""
    source = golden_path("default")

    def other_token(meta, arrays):
        meta["task"]["reward"]["token"] = 3

    def scaled(meta, arrays):
        arrays["gradient"] = 1.5 * arrays["gradient"]

    for change, what in ((other_token, "meta task differ"),
                         (scaled, "array 'gradient' differs")):
        edited = rewrite(tmp_path, change, source=source)
        expect_error(edited, "claims the shipped name 'default'", what,
                     manifest.SHA256["default"][:16], "task.with_(name=...)")
    # the shipped content with other bytes (entry order, compression) still loads
    members = read_members(source)
    np.savez_compressed(tmp_path / "packed.npz", **members)
    assert (tmp_path / "packed.npz").read_bytes() != source.read_bytes()
    assert load_golden(tmp_path / "packed.npz").name == "default"


def test_an_export_of_another_task_under_a_shipped_name_does_not_claim_it(tmp_path):
    """issue 46 item 4: exporting ``default`` with another reward records the name
    ``default-custom``, so the export loads and does not pass for the shipped file."""
    from fisher_ref import load_config
    from fisher_ref.golden.export import export_golden
    task = load_config("tabular").with_(reward={"name": "length"})
    g = load_golden(export_golden(task, tmp_path / "mine.npz"))
    assert g.name == "tabular-custom"
    same = load_golden(export_golden(load_config("tabular"), tmp_path / "same.npz"))
    assert same.name == "tabular"  # a regeneration keeps the shipped name
