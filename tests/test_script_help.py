"""The scripts' ``--help`` says what each does in whole sentences: its docstring, not a cut line."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


@pytest.mark.parametrize("script", ["consolidate_checkpoint.py", "export_hf.py", "plot_runs.py"])
def test_help_shows_the_whole_first_paragraph(script):
    doc = ast.get_docstring(ast.parse((SCRIPTS / script).read_text()))
    first_paragraph = " ".join(doc.split("\n\n")[0].split())
    assert first_paragraph.endswith(".")  # a sentence, not the line it starts on
    shown = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--help"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    assert first_paragraph in " ".join(shown.split())
