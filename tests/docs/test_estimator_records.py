"""The pages quote the estimator records as benchmarks/estimators/update_docs.py renders
them: docs/check/rl_losses.md the relative bias against K (batch_bias.json) and
docs/performance/speed.md the enumeration cost of K = 1, 2, 3 (batch_cost.json); and the
records themselves are consistent (the plot is there, the limit row is K = 1)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "update_docs", ROOT / "benchmarks" / "estimators" / "update_docs.py")
update_docs = importlib.util.module_from_spec(_spec)  # by path: benchmarks is not a package
_spec.loader.exec_module(update_docs)


@pytest.mark.parametrize("name", sorted(update_docs.PAGES))
def test_page_quotes_the_record(name):
    page, _ = update_docs.PAGES[name]
    quoted = update_docs.region(page.read_text(), name)
    assert quoted == update_docs.rendered(name).strip(), (
        f"{page} does not quote docs/bench/estimators/{name}.json as rendered; run "
        f"PYTHONPATH=. python benchmarks/estimators/update_docs.py")


def test_bias_record_has_every_k_and_the_limit():
    r = json.loads((update_docs.RECORDS / "batch_bias.json").read_text())
    assert r["commit"] and r["machine"] and (update_docs.RECORDS / "batch_bias.png").exists()
    for row in r["losses"].values():
        assert [x["K"] for x in row["per_batch"]] == [1, 2, 3]
        biases = [x["relative_bias"] for x in row["per_batch"]]
        assert biases == sorted(biases, reverse=True)  # the bias shrinks as K grows
        assert row["large_batch"]["relative_bias"] < biases[-1]
