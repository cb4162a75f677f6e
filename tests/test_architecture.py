"""The layers of the package, counted by walking its source (``ast``): no private name
imported across modules, nothing inside the package importing the package root, no module
over :data:`MAX_LINES` lines, and the import contracts in ``pyproject.toml`` kept
(``lint-imports``, which CI runs too)."""
import ast
import pathlib
import shutil
import subprocess
import tomllib


ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fisher_ref"
#: A module longer than this is split by concern.
MAX_LINES = 450
#: Modules another change splits; each goes from this list once its split has merged, and
#: the list is then empty.
SPLIT_ELSEWHERE = set()


def _modules():
    """``(dotted name, package, tree)`` of every module of the package (``package``: the
    package a relative import starts from)."""
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        package = ".".join(rel.parts[:-1])
        out.append((".".join(parts), package, ast.parse(path.read_text(), str(path))))
    return out


def _absolute(package, node):
    """The module an ``ImportFrom`` inside ``package`` names (relative imports resolved)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def private_imports():
    """``module: from other import _name`` for every private name (one leading underscore,
    not a dunder) that a module of the package imports from another module of it."""
    found = []
    for module, package, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                source = _absolute(package, node)
                if not source.startswith("fisher_ref"):
                    continue
                for alias in node.names:
                    name = alias.name
                    if name.startswith("_") and not name.startswith("__") and source != module:
                        found.append(f"{module}: from {source} import {name}")
    return found


def root_imports():
    """``module: line`` for every import of the package root (``from fisher_ref import
    ...``, ``import fisher_ref``) by a module inside it. Code inside string literals (the
    exercises and doctests shown to learners) is not an import and is not counted."""
    found = []
    for module, package, tree in _modules():
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and _absolute(package, node) == "fisher_ref":
                found.append(f"{module}:{node.lineno}: from fisher_ref import ...")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name == "fisher_ref":
                        found.append(f"{module}:{node.lineno}: import fisher_ref")
    return found


def long_modules():
    """``path: lines`` for every module over :data:`MAX_LINES` lines."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        n = len(path.read_text().splitlines())
        if n > MAX_LINES:
            found.append((path.relative_to(ROOT).as_posix(), n))
    return found


def test_no_private_name_crosses_a_module():
    assert private_imports() == []


def test_nothing_inside_the_package_imports_the_root():
    assert root_imports() == []


def test_no_module_is_over_the_line_limit():
    over = {p: n for p, n in long_modules() if p not in SPLIT_ELSEWHERE}
    assert over == {}, f"modules over {MAX_LINES} lines: {over}"


def test_the_split_elsewhere_list_names_only_modules_still_too_long():
    """A module leaves SPLIT_ELSEWHERE once it is split: the list holds no module that is
    already short enough, or gone."""
    over = {p for p, _ in long_modules()}
    assert SPLIT_ELSEWHERE <= over, sorted(SPLIT_ELSEWHERE - over)


def test_the_walk_counts_what_it_says():
    """Each count finds a planted case: a private name, a root import, a long module."""
    src = "from fisher_ref.engine.plan import _seconds\nimport fisher_ref\nx = 'from fisher_ref import exact'\n"
    tree = ast.parse(src)
    privates = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)
                for a in n.names if a.name.startswith("_") and not a.name.startswith("__")]
    roots = [n for n in ast.walk(tree) if isinstance(n, ast.Import)
             and any(a.name == "fisher_ref" for a in n.names)]
    assert privates == ["_seconds"] and len(roots) == 1  # the string is no import


CONTRACTS = {"layers: imports go down only",
             "checking a golden file needs numpy only",
             "the fast engine knows nothing of the parallel layer over it",
             "the readable judge stands apart from the fast engine",
             "no cycles among siblings"}


def test_the_import_contracts_are_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    contracts = {c["name"]: c for c in config["contracts"]}
    assert CONTRACTS <= set(contracts)
    layers = contracts["layers: imports go down only"]["layers"]
    assert layers.index("fisher_ref.parallel") < layers.index("fisher_ref.engine")
    forbid = contracts["the fast engine knows nothing of the parallel layer over it"]
    assert forbid["source_modules"] == ["fisher_ref.engine"]
    assert forbid["forbidden_modules"] == ["fisher_ref.parallel"]


def test_lint_imports_keeps_every_contract():
    exe = shutil.which("lint-imports")
    assert exe is not None, "lint-imports (import-linter) is not installed; CI installs it"
    out = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={"PYTHONPATH": str(ROOT), "PATH": str(pathlib.Path(exe).parent)})
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert f"{len(CONTRACTS)} kept, 0 broken" in out.stdout
