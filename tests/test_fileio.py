"""fisher_ref.fileio: atomic writes that name the path and leave nothing behind, output
paths that are not regular files refused, and strict JSON that reads plain JSON alike."""
import errno
import os

import pytest

from fisher_ref.fileio import FileProblem, atomic_output, check_output_path, strict_json


@pytest.mark.parametrize("err", [errno.ENOSPC, errno.EACCES], ids=["disk-full", "denied"])
def test_atomic_output_names_the_path_and_cleans_up(tmp_path, monkeypatch, err):
    target = tmp_path / "out.json"
    target.write_text("old")
    real_replace = os.replace
    monkeypatch.setattr(os, "replace",
                        lambda s, d: (_ for _ in ()).throw(OSError(err, os.strerror(err), d)))
    with pytest.raises(FileProblem, match=f"{target.name}.*{os.strerror(err)}"):
        with atomic_output(target) as tmp:
            with open(tmp, "w") as fh:
                fh.write("new")
    monkeypatch.setattr(os, "replace", real_replace)
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["out.json"]
    # a write that fails inside the block (disk full mid-write) also names the path
    with pytest.raises(FileProblem, match="out.json"):
        with atomic_output(target):
            raise OSError(errno.ENOSPC, "No space left on device")
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]


def test_a_character_device_is_refused():
    with pytest.raises(FileProblem, match="character device"):
        check_output_path("/dev/null", "--out")
    with pytest.raises(FileProblem, match="character device"):
        with atomic_output("/dev/null"):
            pytest.fail("the block must not run")


def test_strict_json_keeps_what_json_reads_alike():
    assert strict_json('{"a": [1, 2.5, true, null, "x"], "b": {"c": -0.0}}') == \
        {"a": [1, 2.5, True, None, "x"], "b": {"c": -0.0}}
