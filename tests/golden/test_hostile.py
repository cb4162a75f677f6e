"""Hostile golden files and checker inputs: each ends in a GoldenFileError (the reader) or a
TypeError/ValueError naming the problem (the checkers), before anything large is allocated,
and never in a pass."""
import json

import numpy as np
import pytest

from fisher_ref.checks.conformance import check_token_fisher
from fisher_ref.golden.check import compare_to_golden, golden_path
from fisher_ref.golden.archive import GoldenFileError
from fisher_ref.golden.format import (array_sha256, canonical_json, load_golden, meta_sha256,
                                      read_members)
from fisher_ref.numerics import softmax, token_fisher
from tests.golden.test_archive import meta_entry, npy, zip_of
from tests.golden.test_format import rewrite

SOURCE = golden_path("tabular")


def expect(path, *needles):
    with pytest.raises(GoldenFileError) as info:
        load_golden(path)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


# ------------------------------------------------------------------ hostile meta

def forged(tmp_path, text):
    """The tabular file with its meta replaced by ``text`` (hashes as they were)."""
    members = read_members(SOURCE)
    members.pop("meta")
    entries = {f"{k}.npy": npy(v) for k, v in members.items()}
    entries["meta.npy"] = meta_entry(text)
    return zip_of(tmp_path, entries)


def test_nan_in_meta_is_a_golden_file_error(tmp_path):
    meta = json.loads(str(read_members(SOURCE)["meta"]))
    text = canonical_json(meta).replace('"baseline":0.0', '"baseline":NaN', 1)
    assert "NaN" in text
    expect(forged(tmp_path, text), "NaN is not a JSON number")


def test_deeply_nested_meta_is_a_golden_file_error(tmp_path):
    expect(forged(tmp_path, "[" * 100000 + "]" * 100000), "nested too deeply")
    expect(forged(tmp_path, "[" * 100 + "]" * 100), "nested too deeply")


def test_duplicate_keys_in_meta_are_refused(tmp_path):
    text = canonical_json(json.loads(str(read_members(SOURCE)["meta"])))
    expect(forged(tmp_path, text[:-1] + ',"name":"other"}'), "'name' appears twice")


@pytest.mark.parametrize("field, value, words", [
    (("task", "prompts"), 7, "task.prompts must be a list of token lists"),
    (("task", "prompts"), [[1, "a"]], "task.prompts must be a list"),
    (("task", "max_len"), "3", "task.max_len must be a positive integer"),
    (("model", "vocab_size"), [5], "model.vocab_size must be a positive integer"),
    (("layout",), [{"shape": "12"}], "layout[0] must be an object with a 'shape' list"),
    (("sizes", "N"), -1, "meta sizes"),
    (("theta_source",), "guessed", "theta_source must be 'init' or 'given'"),
    (("model", "init_seed"), "zero", "model.init_seed must be a number"),
])
def test_meta_fields_of_the_wrong_kind_are_golden_file_errors(tmp_path, field, value, words):
    def change(meta, arrays):
        d = meta
        for k in field[:-1]:
            d = d[k]
        d[field[-1]] = value
    expect(rewrite(tmp_path, change, source=SOURCE), words)


# ----------------------------------------------- cross-checks a re-hashed edit cannot pass

@pytest.mark.parametrize("edit, words", [
    (lambda m, a: a.__setitem__("theta", a["theta"] * (1 + 1e-9)), "theta is not init_scale"),
    (lambda m, a: a["state_probs"].__setitem__((0, 0), a["state_probs"][0, 0] + 1e-6),
     "rows of 'state_probs' do not sum to 1"),
    (lambda m, a: a.__setitem__("sequence_fisher", a["sequence_fisher"] * 1.001),
     "sequence_fisher differs from token_fisher_sum"),
    (lambda m, a: a["state_depth"].__setitem__(-1, 0), "states per depth"),
    (lambda m, a: a["seq_tokens"].__setitem__((-1, -1), -1), "responses per length"),
    (lambda m, a: a.__setitem__("seq_prob", a["seq_prob"] * 0.5), "seq_prob sums to"),
], ids=["theta", "probs", "fisher", "depth", "lengths", "seq_prob"])
def test_edited_arrays_with_recomputed_hashes_are_caught(tmp_path, edit, words):
    """A careful forger recomputes every unkeyed hash; the cheap identities still fail."""
    expect(rewrite(tmp_path, edit, source=SOURCE), "inconsistent golden file", words)


def test_meta_hash_message_says_what_it_can_promise(tmp_path):
    def change(meta, arrays):
        meta["task"]["baseline"] = 0.5
    expect(rewrite(tmp_path, change, rehash_meta=False, source=SOURCE),
           "meta was modified", "unkeyed")


# ---------------------------------------------------------------------- checkers

@pytest.fixture(scope="module")
def golden():
    return load_golden(SOURCE)


@pytest.mark.parametrize("value, words", [
    (lambda g: g["sequence_fisher"] + 1e3j, "complex"),
    (lambda g: g["sequence_fisher"].astype(complex), "complex"),
    (lambda g: g["sequence_fisher"].astype(str), "string"),
    (lambda g: [str(x) for x in g["sequence_fisher"]], "string"),
    (lambda g: g["sequence_fisher"] > 0, "boolean"),
])
def test_compare_to_golden_refuses_arrays_of_the_wrong_kind(golden, value, words):
    with pytest.raises(TypeError, match=f"sequence_fisher: your array holds {words}"):
        compare_to_golden({"sequence_fisher": value(golden)}, golden)


def test_compare_to_golden_refuses_integer_keys_given_as_strings(golden):
    with pytest.raises(TypeError, match="state_depth: your array holds string"):
        compare_to_golden({"state_depth": golden["state_depth"].astype(str)}, golden)


def test_an_empty_comparison_is_not_a_pass(golden):
    with pytest.raises(ValueError, match="nothing to compare"):
        compare_to_golden({}, golden)
    with pytest.raises(TypeError, match="arrays must be a dict"):
        compare_to_golden([("sequence_fisher", golden["sequence_fisher"])], golden)


@pytest.mark.parametrize("rtol", [float("nan"), -1e-10, float("inf"), "1e-10", True, None])
def test_bad_rtol_is_refused(golden, rtol):
    nan = np.full_like(golden["sequence_fisher"], np.nan)
    with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
        compare_to_golden({"sequence_fisher": nan}, golden, rtol=rtol)


def test_check_token_fisher_refuses_complex_results_and_bad_rtol():
    right = lambda z, j: token_fisher(softmax(z), j)  # noqa: E731
    assert check_token_fisher(right).passed
    report = check_token_fisher(lambda z, j: right(z, j) + 1e3j)
    assert not report.passed
    assert "complex" in " ".join(str(r.problem) for r in report.results)
    for rtol in (float("nan"), -1.0, float("inf")):
        with pytest.raises(ValueError, match="rtol must be a finite number >= 0"):
            check_token_fisher(right, rtol=rtol)


def test_a_valid_comparison_still_passes(golden):
    assert compare_to_golden({"sequence_fisher": golden["sequence_fisher"],
                              "state_depth": golden["state_depth"]}, golden).passed
    assert array_sha256(golden["theta"]) == golden.meta["sha256"]["theta"]
    assert meta_sha256(golden.meta) == golden.meta["meta_sha256"]


# ------------------------------------------------------------------ export size guard

def test_the_export_estimate_is_the_size_of_the_shipped_files():
    from fisher_ref.golden.export import GOLDEN_CASES, NO_MATRICES, export_size, golden_task
    from fisher_ref.golden.format import MATRIX_MAX_PARAMS
    for name in GOLDEN_CASES:
        t = golden_task(name)
        matrices = name not in NO_MATRICES and t.model.num_params <= MATRIX_MAX_PARAMS
        ratio = export_size(t, matrices) / golden_path(name).stat().st_size
        assert 1.0 <= ratio <= 1.25, (name, ratio)


def test_the_export_estimate_counts_the_prompt_length():
    """Every state stores its prompt: a 1,000-token prompt costs 8 bytes a token a state."""
    from fisher_ref import load_config
    from fisher_ref.golden.export import export_size
    t = load_config("default")
    long = t.with_(prompts=((1,) * 1000, (3,)))
    N = 2 * (1 + 4 + 16)
    assert export_size(long, False) - export_size(t, False) >= 8 * N * 998


def test_keys_given_as_one_string_are_refused(golden):
    with pytest.raises(TypeError, match="keys must be a list of golden keys"):
        compare_to_golden({"sequence_fisher": golden["sequence_fisher"]}, golden,
                          keys="sequence_fisher")
