"""The scripts' ``--help`` says what each does in whole sentences: its docstring, not a cut line."""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


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


def entry_point_module(path: Path) -> str | None:
    """The module whose ``main`` a thin script calls (None: the script holds its own)."""
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.ImportFrom)
            and (node.module or "").split(".")[0] in {"repro", "tools", "train"}
            and any(alias.name == "main" for alias in node.names)
        ):
            return node.module
    return None


THIN = sorted(p.name for p in SCRIPTS.glob("*.py") if entry_point_module(p))


def first_paragraph(doc: str) -> str:
    return " ".join(doc.split("\n\n")[0].split())


def test_every_script_is_a_thin_entry_point():
    assert set(THIN) == {p.name for p in SCRIPTS.glob("*.py")}


@pytest.mark.parametrize("script", THIN)
def test_a_thin_scripts_docstring_opens_with_its_help(script):
    """Its ``--help`` prints the first paragraph of the module it calls; the script's own
    docstring opens with the same sentence, so reading either tells what the command does."""
    path = SCRIPTS / script
    module = importlib.import_module(entry_point_module(path))
    script_doc = ast.get_docstring(ast.parse(path.read_text()))
    assert first_paragraph(script_doc) == first_paragraph(module.__doc__)
