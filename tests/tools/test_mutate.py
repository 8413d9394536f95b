"""tools/mutate.py stays usable: its module -> tests map and its list of equivalent mutants
point at code and tests that exist (a refactor that moves a module must update them)."""

import ast
from pathlib import Path

import pytest

from tools import mutate

REPO = Path(__file__).resolve().parents[2]


def test_every_target_and_test_exists():
    for module, tests in mutate.TARGETS.items():
        assert (REPO / module).is_file(), module
        for entry in tests:
            path, _, name = entry.partition("::")
            assert (REPO / path).is_file(), entry
            if name:
                assert f"def {name}(" in (REPO / path).read_text(), entry


def test_every_equivalent_mutant_still_exists():
    keys = {m.key for module in mutate.TARGETS for m in mutate.make_mutants(module)}
    missing = [key for key in mutate.EQUIVALENT if key not in keys]
    assert not missing, f"EQUIVALENT names mutants that no longer exist: {missing}"


SOURCE = '''
def f(x, labels):
    """Docstrings are never mutated."""
    if x > 1:
        raise ValueError(f"x={x} must be small")
    return labels[:, 1:].sum(dim=-1, keepdim=True) * 2
'''


@pytest.mark.parametrize(
    ("description", "expected"),
    [
        ("> -> >=", "if (x >= 1):"),
        ("negate condition", "if (not x > 1):"),
        ("keepdim=True -> keepdim=False", "keepdim=(False)"),
        ("* -> /", "return (labels[:, 1:].sum(dim=-1, keepdim=True) / 2)"),
    ],
)
def test_mutants_replace_exactly_their_node(tmp_path, monkeypatch, description, expected):
    (tmp_path / "m.py").write_text(SOURCE)
    monkeypatch.setattr(mutate, "REPO", tmp_path)
    mutants = mutate.make_mutants("m.py")
    (chosen,) = [m for m in mutants if m.description == description]
    mutated = chosen.apply(SOURCE)
    ast.parse(mutated)
    assert expected in mutated
    assert all("must be small" in m.apply(SOURCE) for m in mutants)  # messages are kept
    assert all("Docstrings are never mutated." in m.apply(SOURCE) for m in mutants)
