"""The README's examples run as written, and its layout names the tree's modules."""

import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

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


def training_commands() -> dict[str, list[str]]:
    """The README's training examples by their comment: the arguments after ``pretrain.py``."""
    block = re.search(r"## Training\n\n```bash\n(.*?)```", README.read_text(), re.DOTALL)
    commands = {}
    for line in block.group(1).splitlines():
        command, comment = line.split("#", 1)
        commands[comment.strip()] = command.split("train/pretrain.py")[1].split()
    return commands


def pretrain(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "train/pretrain.py", *args],
        cwd=README.parent,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_papers_command_trains_on_c4_and_offline_stops_with_one_line(tmp_path):
    args = training_commands()["the paper's protocol (C4)"]
    assert args == ["+model=llama_350m", "+optim=foam2"]  # the user's command, nothing added
    resolved = pretrain(*args, "--cfg", "job")
    assert resolved.returncode == 0, resolved.stderr
    assert yaml.safe_load(resolved.stdout)["data"]["name"] == "c4"
    offline = pretrain(*args, f"hydra.run.dir={tmp_path}", HF_HUB_OFFLINE="1")
    assert offline.returncode == 2
    (line,) = offline.stderr.strip().splitlines()
    assert line.startswith("error: data=c4: the Hugging Face hub is unreachable")
    assert "data=local data.path=DIR" in line and "data=embedded" in line
    assert not (tmp_path / "checkpoints").exists()


def test_the_laptop_command_names_its_data():
    args = training_commands()["a laptop"]
    assert "data=embedded" in args
    resolved = pretrain(*args, "--cfg", "job")
    assert yaml.safe_load(resolved.stdout)["data"]["name"] == "embedded"


def test_the_layout_section_names_every_module():
    """The README's layout is where a newcomer finds a file's job: a module it does not name is
    one they must find by reading the tree."""
    readme = README.read_text()
    layout = readme.split("## Layout", 1)[1].split("```")[1]
    named = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", layout))
    packages = ("foam", "foam/baselines", "foam/combinations", "models", "train", "repro")
    packages += ("repro/tables", "repro/cpu_study", "repro/cpu_study/tables", "tools")
    packages += ("train/finetune", "train/data", "train/export")
    modules = {
        f"{package}/{path.stem}"
        for package in packages
        for path in (README.parent / package).glob("*.py")
        if path.stem != "__init__" and path.stem not in named
    }
    assert not modules, f"README.md's layout does not name {sorted(modules)}"
