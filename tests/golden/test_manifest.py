"""fisher_ref.golden.manifest: the SHA-256 of every shipped golden file, equal to the
files, and the module export.write_manifest writes."""
import hashlib

from fisher_ref.golden import manifest
from fisher_ref.golden.check import GOLDEN_DIR, golden_names, golden_path


def test_manifest_records_every_shipped_file():
    assert sorted(manifest.SHA256) == golden_names()
    for name in golden_names():
        data = golden_path(name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == manifest.SHA256[name], name


def test_write_manifest_writes_the_module_the_reader_uses(tmp_path):
    from fisher_ref.golden.export import write_manifest
    (tmp_path / "a.npz").write_bytes(b"one")
    out = tmp_path / "manifest.py"
    table = write_manifest(tmp_path, out)
    namespace = {}
    exec(out.read_text(), namespace)
    assert namespace["SHA256"] == table == {"a": hashlib.sha256(b"one").hexdigest()}
    assert namespace["__doc__"] == manifest.__doc__
    assert write_manifest(GOLDEN_DIR, tmp_path / "shipped.py") == manifest.SHA256
