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


def test_the_trainer_example_runs_and_trains_foam(tmp_path, monkeypatch):
    (block,) = [b for b in python_blocks() if "trainer_optimizers" in b]
    assert len(block.strip().splitlines()) <= 15
    monkeypatch.chdir(tmp_path)  # the example writes its checkpoints to out/foam
    namespace: dict = {}
    exec(compile(block, str(README), "exec"), namespace)
    optimizer = namespace["optimizers"][0]
    assert type(optimizer).__name__ == "FOAM" and optimizer.state
    assert optimizer.param_groups[0]["level"] == 2
    assert (tmp_path / "out" / "foam" / "checkpoint-20" / "optimizer.pt").is_file()
