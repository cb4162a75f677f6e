"""Every measurement command the documentation names exists under ``benchmarks/`` and runs:
each script its pages, its records and ``benchmarks/regenerate.py --list`` name answers
``--help`` (a module, such as the peer, imports), and each shell script is valid bash."""
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [*sorted((ROOT / "docs" / "performance").glob("*.md")), ROOT / "docs/guide/distributed.md",
         ROOT / "docs/guide/exact.md", ROOT / "docs/guide/torch.md", ROOT / "docs/check/compare.md",
         ROOT / "docs/check/golden.md", ROOT / "docs/dev/engine.md", ROOT / "README.md",
         ROOT / "CONTRIBUTING.md", ROOT / "benchmarks/README.md"]
SCRIPT = re.compile(r"\bbenchmarks/[\w/]+\.(?:py|sh)\b")
OLD_HOMES = re.compile(r"\bscripts/\w+\.(?:py|sh)\b|docs/performance/record_bench\.py")


def _regenerate():
    sys.path.append(str(ROOT))
    try:
        from benchmarks import regenerate
    finally:
        sys.path.remove(str(ROOT))
    return regenerate


def named_scripts():
    """``{script path: where it is named}`` over the pages, the regenerate list and the
    ``command`` of every record it lists."""
    named = {}
    for page in PAGES:
        for hit in SCRIPT.findall(page.read_text()):
            named.setdefault(hit, page.relative_to(ROOT).as_posix())
    regen = _regenerate()
    for entry in regen.records():
        for hit in SCRIPT.findall(entry.command):
            named.setdefault(hit, f"regenerate.py: {entry.name}")
        for path in regen._files(entry):
            if path.suffix == ".json":
                command = json.loads(path.read_text()).get("command", "")
                for hit in SCRIPT.findall(command):
                    named.setdefault(hit, path.relative_to(ROOT).as_posix())
    return named


# one process for every --help: the scripts' imports (torch among them) are paid once
HELP = r"""
import contextlib, io, json, runpy, sys
out = {}
for script in sys.argv[1:]:
    text = open(script).read()
    sys.argv = [script, "--help"]
    buf = io.StringIO()
    try:
        with contextlib.redirect_stdout(buf):
            runpy.run_path(script, run_name="__main__" if "__main__" in text else "module")
        code = 0
    except SystemExit as exc:
        code = exc.code
    out[script] = [code, "usage:" in buf.getvalue(), "__main__" in text]
print(json.dumps(out))
"""


def test_the_pages_name_no_script_at_its_old_home():
    stale = {page.relative_to(ROOT).as_posix(): OLD_HOMES.findall(page.read_text())
             for page in PAGES}
    assert not {k: v for k, v in stale.items() if v}, stale


def test_every_named_benchmark_exists_and_answers_help():
    named = named_scripts()
    assert {"benchmarks/speed/peer_timing.py", "benchmarks/gpu/gpu_compare.sh",
            "benchmarks/speed/record_bench.py", "benchmarks/scaling/shard_speedup.py"} <= set(named)
    missing = {s: where for s, where in named.items() if not (ROOT / s).is_file()}
    assert not missing, missing
    for sh in [s for s in named if s.endswith(".sh")]:
        res = subprocess.run(["bash", "-n", str(ROOT / sh)], capture_output=True, text=True)
        assert res.returncode == 0, (sh, res.stderr)
    scripts = sorted(s for s in named if s.endswith(".py"))
    res = subprocess.run([sys.executable, "-c", HELP, *scripts], cwd=ROOT, capture_output=True,
                         text=True, timeout=300, env={**__import__("os").environ,
                                                      "PYTHONPATH": str(ROOT)})
    assert res.returncode == 0, res.stderr[-3000:]
    answers = json.loads(res.stdout.strip().splitlines()[-1])
    for script, (code, usage, runnable) in answers.items():
        if runnable:  # a command: --help prints its usage and exits 0
            assert code == 0 and usage, (script, named[script], code)
        else:  # a module (the peer): it imports
            assert code == 0, (script, code)
