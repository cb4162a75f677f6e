"""Run the curvlinops example of docs/check/golden.md (not part of the test suite:
curvlinops is not a dependency) after the torch example it builds on, and print the comparison table.

    pip install curvlinops-for-pytorch
    python benchmarks/accuracy/check_curvlinops.py
"""
import re
from importlib.metadata import version
from pathlib import Path

PAGE = Path(__file__).resolve().parents[2] / "docs" / "check" / "golden.md"


def blocks(text=None):
    """The page's torch block (the one defining ``GoldenMLP``) and its curvlinops block."""
    text = PAGE.read_text() if text is None else text
    (torch_block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                      if "class GoldenMLP" in b]
    (curvlinops_block,) = re.findall(r"```py\n(.*?)```", text, flags=re.S)
    return torch_block, curvlinops_block


def main(argv=None):
    import argparse
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    torch_block, curvlinops_block = blocks()
    namespace = {}
    exec(compile(torch_block, "docs/check/golden.md (torch GGN)", "exec"), namespace)
    exec(compile(curvlinops_block, "docs/check/golden.md (curvlinops)", "exec"),
         namespace)  # it asserts
    result = namespace["compare_to_golden"](
        {"token_fisher_matrix_sum": namespace["G"].numpy()}, namespace["golden"])
    print(f"curvlinops-for-pytorch {version('curvlinops-for-pytorch')}, "
          f"torch {version('torch')}")
    print(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
