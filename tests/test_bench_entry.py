"""`python -m bench <question>` (bench/__main__.py): every script is a question, the README's
table names every question, and a question runs its script with the rest of the line."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"


def entry() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_entry", BENCH / "__main__.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_script_is_a_question_and_every_question_a_script() -> None:
    scripts = {p.name for p in BENCH.glob("*.py")} - {"__main__.py"}
    assert {script for script, _ in entry().QUESTIONS.values()} == scripts


def test_the_readme_table_names_every_question() -> None:
    text = (BENCH / "README.md").read_text()
    table = text.split("## Which benchmark answers which question", 1)[1].split("\n## ", 1)[0]
    for question in entry().QUESTIONS:
        assert f"| `{question}`:" in table, question
        assert f"python -m bench {question}" in table, question


def test_a_question_runs_its_script_with_the_rest_of_the_line() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "bench", "long-streams", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    assert "--no-fresh" in run.stdout
    wrong = subprocess.run(
        [sys.executable, "-m", "bench", "nothing"], cwd=ROOT, capture_output=True, text=True
    )
    assert wrong.returncode == 2
    assert "no question 'nothing'" in wrong.stderr and "long-streams" in wrong.stderr
