"""Run the README's curvlinops example (not part of the test suite: curvlinops is not a
dependency) after the torch example it builds on, and print the comparison table.

    pip install curvlinops-for-pytorch
    python scripts/check_curvlinops.py
"""
import re
from importlib.metadata import version
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def main():
    text = README.read_text()
    (torch_block,) = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S)
                      if "class GoldenMLP" in b]
    (curvlinops_block,) = re.findall(r"```py\n(.*?)```", text, flags=re.S)
    namespace = {}
    exec(compile(torch_block, "README.md (torch GGN)", "exec"), namespace)
    exec(compile(curvlinops_block, "README.md (curvlinops)", "exec"), namespace)  # asserts
    result = namespace["compare_to_golden"](
        {"token_fisher_matrix_sum": namespace["G"].numpy()}, namespace["golden"])
    print(f"curvlinops-for-pytorch {version('curvlinops-for-pytorch')}, "
          f"torch {version('torch')}")
    print(result)
    return 0 if result.passed else 1


if __name__ == "__main__":
    raise SystemExit(main())
