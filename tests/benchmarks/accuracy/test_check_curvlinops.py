"""benchmarks/accuracy/check_curvlinops.py finds the two blocks it runs (curvlinops itself is
not a dependency, so the comparison is not run here)."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[3] / "benchmarks" / "accuracy" / "check_curvlinops.py"


def test_the_page_holds_the_torch_block_and_the_curvlinops_block():
    """The example moved from the README to docs/check/golden.md; the script reads it there."""
    spec = importlib.util.spec_from_file_location("check_curvlinops", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch_block, curvlinops_block = mod.blocks()
    assert "class GoldenMLP" in torch_block
    assert "curvlinops" in curvlinops_block and "GGNLinearOperator" in curvlinops_block
