"""The golden-file schema (fisher_ref.golden.schema): every key with its dtype, shape and
scale kind as docs/golden_format.md writes it out, and the key sets a file with or without
a sampler and matrices holds."""
import pytest

from fisher_ref.golden.schema import (MATRIX_KEYS, OFF_POLICY_KEYS, ON_POLICY_KEYS, SCALE_KINDS,
                                      expected_keys, scale_kind)
from tests.golden.test_format import DOC


def test_docs_list_every_key_with_dtype_shape_and_scale():
    text = DOC.read_text()
    for key, (dt, dims, kind) in expected_keys(True, True).items():
        shape = "`()`" if not dims else "`(" + ", ".join(dims) + (",)`" if len(dims) == 1 else ")`")
        assert f"| `{key}` | {dt} | {shape} | {kind} |" in text, key
    for kind in SCALE_KINDS:
        assert f"\n| {kind} |" in text, kind


def test_expected_keys_are_the_on_policy_keys_plus_what_a_file_holds():
    assert not (ON_POLICY_KEYS.keys() & OFF_POLICY_KEYS.keys())
    assert not ((ON_POLICY_KEYS.keys() | OFF_POLICY_KEYS.keys()) & MATRIX_KEYS.keys())
    assert expected_keys(False, False) == ON_POLICY_KEYS
    assert expected_keys(True, False) == {**ON_POLICY_KEYS, **OFF_POLICY_KEYS}
    assert expected_keys(False, True) == {**ON_POLICY_KEYS, **MATRIX_KEYS}
    everything = expected_keys(True, True)
    assert len(everything) == len(ON_POLICY_KEYS) + len(OFF_POLICY_KEYS) + len(MATRIX_KEYS)
    for key, (_, _, kind) in everything.items():
        assert scale_kind(key) == kind and kind in SCALE_KINDS, key
    with pytest.raises(KeyError):
        scale_kind("no_such_key")
