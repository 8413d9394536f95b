"""The README's examples run as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)


def test_the_training_loop_example_runs_and_learns():
    (block,) = [b for b in python_blocks() if "from foam import FOAM" in b]
    assert len(block.strip().splitlines()) <= 15
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    optimizer = namespace["optimizer"]
    assert optimizer.state and namespace["loss"].item() < 1.0
