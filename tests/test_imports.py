"""Imports flow one way (DESIGN.md): scripts -> {repro, tools} -> train -> {foam, models} -> torch;
nothing imports tools/ but scripts and tests; no script imports another; inside foam/ the
baselines do not import each other; foam/, repro/ and tools/ have no import cycles; inside repro/
the CPU study imports the paper's modules, never the reverse."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STDLIB = set(sys.stdlib_module_names)

# Third-party and project packages each package may import at module level.
ALLOWED = {
    "foam": {"torch", "foam"},
    "models": {"torch", "transformers", "yaml", "omegaconf", "models"},
    "train": {
        "torch",
        "transformers",
        "datasets",
        "sentencepiece",
        "hydra",
        "omegaconf",
        "wandb",
        "tqdm",
        "yaml",
        "pyarrow",
        "numpy",
        "psutil",
        "peft",  # the fine-tuning recipes' LoRA baseline (train/finetune/methods.py)
        "safetensors",  # one model file from a checkpoint (train/export/consolidate.py)
        "foam",
        "models",
        "train",
    },
    "repro": {"torch", "numpy", "hydra", "omegaconf", "foam", "models", "train", "repro"},
    "tools": {"torch", "hydra", "yaml", "foam", "models", "train", "repro", "tools"},
}
# Optional accelerators foam/ may import lazily, inside the function that needs them; and what
# repro/ and tools/ import only where a command needs it (figures, statistics, SLURM, the
# mutants' pytest).
LAZY_OPTIONAL = {
    "foam": {"bitsandbytes"},
    "repro": {"matplotlib", "scipy", "submitit"},
    "tools": {"matplotlib", "pytest"},
}
# What scripts/ may import of the project: packages, never another script.
PROJECT_PACKAGES = {"foam", "models", "train", "repro", "tools"}
# Modules that import an optional accelerator at module level and are themselves imported only
# lazily (test_foam_imports_without_optional_packages checks `import foam` loads none of them).
OPTIONAL_MODULES = {"foam/triton_kernels.py": {"triton"}}


def imported_modules(path: Path) -> list[tuple[str, bool]]:
    """(full module name, imported at module level?) for every absolute import in a file;
    ``from a.b import c`` gives ``a.b.c`` (``c`` may be a module or a name in ``a.b``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    top_level_nodes = {id(node) for node in tree.body}
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        else:
            continue
        found += [(name, id(node) in top_level_nodes) for name in names]
    return found


def imports(path: Path) -> list[tuple[str, bool]]:
    """(top-level module, imported at module level?) for every import in a file."""
    return [(name.split(".")[0], at_top) for name, at_top in imported_modules(path)]


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_packages_import_only_what_the_design_allows(package):
    bad = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for module, at_top in imports(path):
            if module in STDLIB or module in ALLOWED[package]:
                continue
            if not at_top and module in LAZY_OPTIONAL.get(package, set()):
                continue
            if module in OPTIONAL_MODULES.get(path.relative_to(ROOT).as_posix(), set()):
                continue
            bad.append(f"{path.relative_to(ROOT)}: {module}")
    assert not bad, f"{package}/ imports outside its layer: {bad}"


def test_scripts_import_packages_not_scripts():
    """A script is an entry point: what another script or a test needs lives in a package."""
    scripts = sorted((ROOT / "scripts").glob("*.py"))
    names = {path.stem for path in scripts}
    bad = [
        f"{path.name}: {module}"
        for path in scripts
        for module, _ in imports(path)
        if module in names and module not in PROJECT_PACKAGES
    ]
    assert not bad, f"scripts import scripts: {bad}"


def test_nothing_but_scripts_and_tests_imports_tools():
    """tools/ serves the framework without being it: the library, the trainer and the
    reproduction never depend on a benchmark, the GPU check or the mutation tester."""
    bad = [
        f"{path.relative_to(ROOT)}: {module}"
        for package in ("foam", "models", "train", "repro")
        for path in sorted((ROOT / package).rglob("*.py"))
        for module, _ in imports(path)
        if module == "tools"
    ]
    assert not bad, bad


def test_scripts_are_thin_entry_points():
    """Every script is at most 30 lines: its logic lives in a package, where tests reach it."""
    long = {
        p.name: n for p in ROOT.glob("scripts/*.py") if (n := len(p.read_text().splitlines())) > 30
    }
    assert not long, long


def test_baselines_do_not_import_each_other():
    """What two baselines share lives in a module they both import (foam.lowrank, ...)."""
    baselines = ROOT / "foam" / "baselines"
    bad = []
    for path in sorted(baselines.glob("*.py")):
        if path.name == "__init__.py":
            continue
        for name, _ in imported_modules(path):
            parts = name.split(".")
            if parts[:2] == ["foam", "baselines"] or parts[:2] == ["foam", "combinations"]:
                bad.append(f"{path.name}: {name}")
    assert not bad, f"baselines import other baselines: {bad}"


def test_foam_imports_without_optional_packages():
    """`import foam` in a fresh interpreter loads no third-party module but torch."""
    import subprocess

    code = (
        "import sys, foam; "
        "bad = {m.split('.')[0] for m in sys.modules} & "
        "{'transformers', 'datasets', 'hydra', 'wandb', 'bitsandbytes', 'triton', 'train', 'models'}; "
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def module_graph(package: str) -> dict[str, set[str]]:
    """Each module of a package (``foam.x.y``; a package as its ``__init__``) -> the package's
    modules it imports anywhere in its text, lazy imports included (``from foam.a import name``
    counts as ``foam.a``)."""
    modules = {}
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    graph = {}
    for name, path in modules.items():
        targets = set()
        for imported, _ in imported_modules(path):
            while imported and imported not in modules:
                imported = imported.rpartition(".")[0]
            if imported and imported != name:
                targets.add(imported)
        graph[name] = targets
    return graph


@pytest.mark.parametrize("package", ["foam", "repro", "tools", "train"])
def test_no_import_cycle_inside_a_package(package):
    """No import cycle inside foam/, repro/ or tools/, lazy imports included: a cycle makes the order in
    which modules load matter, and hides which one owns what."""
    graph = module_graph(package)
    cycles = []

    def visit(name: str, path: list[str]) -> None:
        for target in sorted(graph[name]):
            if target in path:
                cycles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in done:
                visit(target, [*path, target])
        done.add(name)

    done: set[str] = set()
    for name in sorted(graph):
        if name not in done:
            visit(name, [name])
    assert not cycles, cycles


def test_the_papers_reproduction_never_imports_the_cpu_study():
    """repro/cpu_study/ builds on the paper's modules (methods, experiments, the tables); they
    know nothing of it, lazy imports included, so the study can change or go without touching
    the paper's reproduction (repro.make_tables takes the study's tables as ``writers``)."""
    graph = module_graph("repro")
    study = {m for m in graph if m == "repro.cpu_study" or m.startswith("repro.cpu_study.")}
    assert "repro.cpu_study.study" in study and "repro.make_tables" in graph
    back = sorted(f"{m} -> {t}" for m in graph.keys() - study for t in sorted(graph[m] & study))
    assert not back, f"the paper's modules import the CPU study: {back}"


def test_foams_update_reads_only_the_leaves_it_builds_on():
    """foam/update.py, which every path of FOAM's step reads (eager, C++, Triton), imports only
    the fold and the numerics, and they nothing of foam but its error type."""
    graph = module_graph("foam")
    assert graph["foam.update"] <= {"foam.folding", "foam.numerics"}
    assert graph["foam.folding"] | graph["foam.numerics"] <= {"foam.errors"}
    assert graph["foam.errors"] == set()


def test_raising_a_config_error_needs_no_config_checker():
    """train/errors.py is a leaf; the modules that only raise a config error import it, not
    train/config.py (which pulls in foam, models, the loggers and parallelism)."""
    graph = module_graph("train")
    assert graph["train.errors"] == set()
    raisers = ("data.loader", "data.corpus", "data.tokenizer", "checkpoint", "update_cosine")
    raisers += ("step_stats",)
    assert [m for m in raisers if "train.config" in graph[f"train.{m}"]] == []


def test_the_data_pipeline_reads_one_way():
    """Records -> rows (batcher) under the train loader (loader) and the evaluation sets
    (val_batches); the resume arithmetic (position) knows no loader."""
    graph = module_graph("train")
    assert not {"train.data.loader", "train.data.val_batches"} & graph["train.data.batcher"]
    assert not {"train.data.loader", "train.data.val_batches"} & graph["train.data.position"]
    assert "train.data.val_batches" not in graph["train.data.loader"]


FINETUNE_SHARES = ("train.data.corpus", "train.objective", "train.summary")
"""What fine-tuning (train/finetune/) may import of the pre-training trainer: the hub check, the
loss's ignore index and the git sha (train/finetune/__init__.py names them)."""


def test_finetuning_imports_only_the_named_pieces_of_pretraining():
    bad = []
    for path in sorted((ROOT / "train" / "finetune").rglob("*.py")):
        for name, _ in imported_modules(path):
            parts = name.split(".")
            if parts[0] != "train" or parts[1] == "finetune":
                continue
            if not any(name == s or name.startswith(s + ".") for s in FINETUNE_SHARES):
                bad.append(f"{path.relative_to(ROOT)}: {name}")
    assert not bad, f"fine-tuning reaches into pre-training: {bad}"
    pretraining = [p for p in (ROOT / "train").rglob("*.py") if "finetune" not in p.parts]
    assert not [
        p.name
        for p in pretraining
        for name, _ in imported_modules(p)
        if name.startswith("train.finetune")
    ], "pre-training imports fine-tuning"


def imported_test_modules(source: str, package: tuple[str, ...]) -> set[str]:
    """The ``test_*`` modules under tests/ that the source of a module in ``package`` imports,
    absolute or relative, at module level or inside a function (``from tests.e2e import test_x``
    and ``from .test_x import y`` both count)."""
    imported = []  # dotted names as parts; ``from a import b`` gives a.b (b: module or name)
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported += [alias.name.split(".") for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = [*package[: len(package) + 1 - node.level]] if node.level else []
            base += node.module.split(".") if node.module else []
            imported += [[*base, alias.name] for alias in node.names]
    return {
        ".".join(parts[:end])
        for parts in imported
        for end in range(1, len(parts) + 1)
        if parts[end - 1].startswith("test_")
        and ROOT.joinpath(*parts[:end]).with_suffix(".py").is_file()
    }


AWAITING_THEIR_BRANCH: dict = {}
"""Files being changed on another branch as tests/helpers/cli.py arrived: their imports of
``command``, ``run``, ``train_losses``, ``TINY`` and ``torchrun`` move to tests.helpers.cli when
the branches meet, and then this goes (an entry that no longer holds fails the check)."""


def test_no_test_module_is_imported_as_a_library():
    """What several test modules share lives in tests/helpers/: importing a test module runs its
    module-level code in the importer, and moving or renaming a test breaks unrelated ones."""
    found = {
        path.relative_to(ROOT).as_posix(): imported_test_modules(
            path.read_text(), path.relative_to(ROOT).parent.parts
        )
        for path in sorted((ROOT / "tests").rglob("*.py"))
    }
    bad = [
        f"{path}: {module}"
        for path, modules in found.items()
        for module in sorted(modules - AWAITING_THEIR_BRANCH.get(path, set()))
    ]
    assert not bad, (
        f"test modules imported as libraries (their helpers go in tests/helpers/): {bad}"
    )
    stale = sorted(
        path for path, modules in AWAITING_THEIR_BRANCH.items() if found.get(path) != modules
    )
    assert not stale, f"drop these from AWAITING_THEIR_BRANCH: {stale}"


@pytest.mark.parametrize(
    ("source", "found"),
    [
        pytest.param(
            "from tests.e2e.test_train_cli import TINY", {"tests.e2e.test_train_cli"}, id="absolute"
        ),
        pytest.param(
            "import tests.foam.test_fused as fused", {"tests.foam.test_fused"}, id="aliased"
        ),
        pytest.param(
            "def f():\n    from .test_train_cli import run",
            {"tests.e2e.test_train_cli"},
            id="relative-in-a-function",
        ),
        pytest.param(
            "from ..foam import test_fused", {"tests.foam.test_fused"}, id="parent-package"
        ),
        pytest.param(
            "from . import test_missing, test_ctrl_c",
            {"tests.e2e.test_ctrl_c"},
            id="one-of-several",
        ),
        pytest.param("from tests.helpers.cli import TINY, test_like_name", set(), id="a-helper"),
        # tests/foam/test_fused.py imports itself so in a child process; no module under tests/
        pytest.param("import test_fused", set(), id="not-under-tests"),
    ],
)
def test_the_check_finds_test_modules_however_they_are_imported(source, found):
    """Seen from a module in tests/e2e/."""
    assert imported_test_modules(source, ("tests", "e2e")) == found
