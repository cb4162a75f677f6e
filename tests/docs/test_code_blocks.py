"""The README's Python examples run, and its test command is the one CI runs."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _blocks(lang):
    text = (ROOT / "README.md").read_text()
    return re.findall(rf"```{lang}\n(.*?)```", text, flags=re.S)


def test_readme_python_examples_run():
    blocks = _blocks("python")
    assert blocks, "README has no python examples"
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {})


def test_readme_test_command_is_what_ci_runs():
    """The README's set-up is two one-line commands; the second installs what CI installs
    and ends in the pytest command .ci/run runs."""
    lines = [line.strip() for b in _blocks("bash") for line in b.splitlines() if line.strip()]
    commands = [line[line.index("python -m pytest"):] for line in lines
                if "python -m pytest" in line]
    assert commands, "README gives no test command"
    ci = (ROOT / ".ci" / "run").read_text()
    for cmd in commands:
        assert cmd in ci, f"README test command {cmd!r} is not what .ci/run runs"
    (test_line,) = [line for line in lines if "python -m pytest" in line]
    for install in re.findall(r"pip install (\S+)", test_line):
        assert install in ci, f"README installs {install} but .ci/run does not"
    setup = _blocks("bash")[:2]  # the "Two commands" section
    assert [len(b.strip().splitlines()) for b in setup] == [1, 1], setup
    assert "python -m fisher_ref verify" in setup[0] and "python -m pytest" in setup[1]


def test_readme_task_example_is_a_valid_task():
    import json
    from fisher_ref import task_from_json
    (block,) = _blocks("json")
    task = task_from_json(json.loads(block))
    assert task.sampler is not None and task.max_len == 3
