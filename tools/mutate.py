"""Mutation testing of the modules whose bugs cost users most: inject one plausible bug at a time
and check that the fast tests of that module notice it.

The mutants are made from the AST: arithmetic and comparison operators swapped, ``and``/``or``
swapped, a condition negated, a unary minus dropped, a number changed (``1 -> 0 / 2``), a boolean
flipped, a call statement removed. A mutant *survives* when the module's tests still pass with it.

Only a temporary copy of the repository is ever mutated: the checkout is never written, so an
interrupted run (Ctrl-C, a kill) cannot leave a mutated file behind. Each mutant runs in a process
forked from a parent that has already imported torch, transformers and pytest, so a mutant costs
the time of its tests rather than of the imports; a mutant whose tests run past the timeout (an
infinite loop, say) is killed with its process group and counted as detected.

``TARGETS`` is the one place that maps a module to its tests: update it when a module moves.
``EQUIVALENT`` lists the surviving mutants that cannot change behaviour, each with the reason.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import copy
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

TARGETS: dict[str, list[str]] = {
    # module -> the fast tests that must catch its bugs, quickest and most sensitive first
    "foam/folding.py": [
        "tests/foam/test_folding.py",
        "tests/foam/test_foam.py",
        "tests/foam/combinations/test_muon.py",
        "tests/foam/baselines/test_adam_mini.py",
    ],
    "foam/optimizer.py": ["tests/foam/test_foam.py"],
    "foam/update.py": ["tests/foam/test_foam.py"],
    "train/step.py": ["tests/train/test_step.py"],
    "train/evaluate.py": ["tests/train/test_evaluate.py"],
    "foam/schedule.py": ["tests/train/test_schedule.py"],
    "train/checkpoint.py": ["tests/train/test_checkpoint.py"],
    # train/pretrain.py (resume, the NaN stop, the summary) is left out: one run of its CLI tests
    # takes minutes on 2 cores; tests/e2e/test_train_cli.py covers it end to end.
}

CPU_ONLY = "the fused AdamW step counter's device: on a CPU-only machine every tensor is on the CPU"
SAME_PLAN = "the block lists zipped come from one fold plan, so their lengths always agree"
DURABILITY = "durability against a power loss: nothing a test (or a killed process) can observe"
IGNORE_ERRORS = "ignore_errors=True -> ignore_errors=False"
EQUIVALENT: dict[tuple[str, str, str], str] = {
    # (module, stripped source line, mutation) -> why no test can tell the mutant apart
    ("foam/schedule.py", "decay_steps = max(max_steps - warmup, 1)", "1 -> 0"): (
        "warmup_steps keeps warmup < max_steps, so max_steps - warmup >= 1 already"
    ),
    ("foam/optimizer.py", 'state["step"].device != p.device', "!= -> =="): CPU_ONLY,
    ("foam/optimizer.py", 'state["step"].device != p.device', "negate condition"): CPU_ONLY,
    (
        "foam/optimizer.py",
        'state["step"] = new_step_counter(p.device if fused else "cpu")',
        "negate condition",
    ): CPU_ONLY,
    (
        "foam/folding.py",
        "return zip(blocks_of(x, plan), values_of(y, plan), strict=True)",
        "strict=True -> strict=False",
    ): SAME_PLAN,
    (
        "foam/folding.py",
        "pairs = zip(blocks_of(out, plan), blocks_of(g, plan), values_of(g_folded, plan), strict=True)",
        "strict=True -> strict=False",
    ): SAME_PLAN,
    (
        "foam/folding.py",
        "return parts[0] if len(parts) == 1 else torch.cat(parts, dim=plan.axis)",
        "1 -> 0",
    ): "torch.cat of a single part is a copy of it: the same values, one more allocation",
    (
        "foam/update.py",
        "for d, rb, v in zip(*squares, strict=True):",
        "strict=True -> strict=False",
    ): SAME_PLAN,
    (
        "train/step.py",
        "return tensor.pin_memory().to(device, non_blocking=True)",
        "non_blocking=True -> non_blocking=False",
    ): ("a copy to the CPU is synchronous either way; on CUDA only the overlap changes"),
    ("train/checkpoint.py", "os.fsync(fd)", "remove call"): DURABILITY,
    ("train/checkpoint.py", "f.flush()", "remove call"): DURABILITY + " (closing flushes)",
    ("train/checkpoint.py", "os.fsync(f.fileno())", "remove call"): DURABILITY,
    ("train/checkpoint.py", "_fsync(tmp)", "remove call"): DURABILITY,
    ("train/checkpoint.py", "_fsync(final.parent)", "remove call"): DURABILITY,
    **{
        ("train/checkpoint.py", f"shutil.rmtree({name}, ignore_errors=True)", IGNORE_ERRORS): (
            "differs only when the file system refuses a deletion"
        )
        for name in ("child", "replaced", "pruned")
    },
    ("train/checkpoint.py", "if keep_last <= 0:", "<= -> <"): (
        "keep_last = 0 then prunes list[:-0], which is empty"
    ),
}

COPIED = (
    "foam",
    "train",
    "models",
    "repro",
    "tools",
    "configs",
    "tests",
    "scripts",
    "pyproject.toml",
)
PRELOADED = (  # heavy third-party imports done once in the parent (never the project's own code)
    "torch",
    "torch.distributed",
    "torch.multiprocessing",
    "numpy",
    "pytest",
    "hydra",
    "omegaconf",
    "transformers",
    "transformers.models.llama.modeling_llama",
    "transformers.models.qwen2.modeling_qwen2",
)
# The mutated packages (tools/, where this tool lives, and repro/ are never mutated).
PROJECT_PACKAGES = ("foam", "train", "models")

SWAPPED_OPS: dict[type, type] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Pow: ast.Mult,
    ast.Mod: ast.Mult,
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.And: ast.Or,
    ast.Or: ast.And,
}
OP_SYMBOLS = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Pow: "**",
    ast.Mod: "%",
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.And: "and",
    ast.Or: "or",
}


@dataclass
class Mutant:
    id: int
    module: str
    line: int
    col: int
    end_line: int
    end_col: int
    replacement: str
    description: str
    source_line: str

    def apply(self, source: str) -> str:
        """``source`` with this mutant's node replaced (positions are 1-based lines, 0-based
        UTF-8 columns, as ``ast`` gives them)."""
        lines = source.splitlines(keepends=True)
        first = lines[self.line - 1].encode()
        last = lines[self.end_line - 1].encode()
        new = first[: self.col].decode() + self.replacement + last[self.end_col :].decode()
        return "".join([*lines[: self.line - 1], new, *lines[self.end_line :]])

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.module, self.source_line, self.description)


# -- making mutants --------------------------------------------------------------------------------


def _skipped_nodes(tree: ast.Module) -> set[int]:
    """Ids of nodes never mutated: docstrings, error messages, logging and type annotations."""
    skipped: set[int] = set()

    def skip(node: ast.AST | None) -> None:
        if node is not None:
            skipped.update(id(n) for n in ast.walk(node))

    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                skip(body[0])
        if isinstance(node, ast.Raise | ast.JoinedStr):
            skip(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            if isinstance(owner, ast.Name) and owner.id in ("log", "logging", "warnings"):
                skip(node)
        if isinstance(node, ast.arg | ast.AnnAssign):
            skip(node.annotation)
        if isinstance(node, ast.FunctionDef):
            skip(node.returns)
            skip(node.args)  # default values are configuration, not arithmetic
    return skipped


def _variants(node: ast.AST) -> list[tuple[ast.AST, str]]:
    """(mutated copy of ``node``, description) for each mutation that applies to ``node``."""
    out: list[tuple[ast.AST, str]] = []

    def mutated(change) -> ast.AST:
        new = copy.deepcopy(node)
        change(new)
        return new

    if isinstance(node, ast.BinOp | ast.AugAssign) and type(node.op) in SWAPPED_OPS:
        old, new_op = type(node.op), SWAPPED_OPS[type(node.op)]

        def swap(n, new_op=new_op):
            n.op = new_op()

        out.append((mutated(swap), f"{OP_SYMBOLS[old]} -> {OP_SYMBOLS[new_op]}"))
    elif isinstance(node, ast.BoolOp):
        old, new_op = type(node.op), SWAPPED_OPS[type(node.op)]

        def swap_bool(n, new_op=new_op):
            n.op = new_op()

        out.append((mutated(swap_bool), f"{OP_SYMBOLS[old]} -> {OP_SYMBOLS[new_op]}"))
    elif isinstance(node, ast.Compare):
        for i, op in enumerate(node.ops):
            if type(op) in SWAPPED_OPS:
                new_op = SWAPPED_OPS[type(op)]

                def swap_cmp(n, i=i, new_op=new_op):
                    n.ops[i] = new_op()

                out.append((mutated(swap_cmp), f"{OP_SYMBOLS[type(op)]} -> {OP_SYMBOLS[new_op]}"))
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.Not):
        out.append((node.operand, f"drop {'-' if isinstance(node.op, ast.USub) else 'not'}"))
    elif isinstance(node, ast.Constant) and type(node.value) in (int, float, bool):
        value = node.value
        if isinstance(value, bool):
            news = [not value]
        elif isinstance(value, int):
            news = [0, 2] if value == 1 else [value + 1]
        else:
            news = [value + 1.0] if value in (0.0, 1.0) else [value * 2]
        for new_value in news:
            out.append((ast.Constant(new_value), f"{value!r} -> {new_value!r}"))
    elif isinstance(node, ast.If | ast.While | ast.IfExp):
        out.append((ast.UnaryOp(ast.Not(), node.test), "negate condition"))
    elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
        out.append((ast.Pass(), "remove call"))
    return out


def _replaced(node: ast.AST) -> ast.AST:
    """The node whose text a mutant of ``node`` replaces: a condition's test, else the node."""
    return node.test if isinstance(node, ast.If | ast.While | ast.IfExp) else node


def _replacement_text(new: ast.AST) -> str:
    """Source for ``new``: expressions are parenthesised, so precedence cannot change."""
    return f"({ast.unparse(new)})" if isinstance(new, ast.expr) else ast.unparse(new)


def make_mutants(module: str, start_id: int = 0) -> list[Mutant]:
    source = (REPO / module).read_text()
    tree = ast.parse(source)
    lines = source.splitlines()
    skipped = _skipped_nodes(tree)
    in_functions = {
        id(n)
        for fn in ast.walk(tree)
        if isinstance(fn, ast.FunctionDef)
        for stmt in fn.body
        for n in ast.walk(stmt)
    }
    keyword_of = {  # a keyword argument's value is named after it: "strict=True -> strict=False"
        id(kw.value): kw.arg for kw in ast.walk(tree) if isinstance(kw, ast.keyword) and kw.arg
    }
    mutants = []
    for node in ast.walk(tree):
        if id(node) in skipped or id(node) not in in_functions:
            continue
        for new, description in _variants(node):
            if id(node) in keyword_of and isinstance(node, ast.Constant):
                name = keyword_of[id(node)]
                description = " -> ".join(f"{name}={side}" for side in description.split(" -> "))
            span = _replaced(node)
            mutants.append(
                Mutant(
                    id=0,
                    module=module,
                    line=span.lineno,
                    col=span.col_offset,
                    end_line=span.end_lineno,
                    end_col=span.end_col_offset,
                    replacement=_replacement_text(new),
                    description=description,
                    source_line=lines[span.lineno - 1].strip(),
                )
            )
    mutants.sort(key=lambda m: (m.line, m.col, m.description))
    for i, m in enumerate(mutants):
        m.id = start_id + i
        ast.parse(m.apply(source))  # every mutant must still be valid Python (a harness check)
    return mutants


# -- running them ---------------------------------------------------------------------------------


def run_tests(workdir: Path, tests: list[str], timeout: float, log_file: Path) -> tuple[str, float]:
    """Run ``tests`` under ``workdir`` in a forked child; ('passed' | 'failed' | 'timeout', secs)."""
    start = time.monotonic()
    pid = os.fork()
    if pid == 0:  # the child: its own process group, so a timeout kills its subprocesses too
        code = 1
        try:
            os.setpgid(0, 0)
            fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.chdir(workdir)
            sys.path.insert(0, str(workdir))
            import pytest

            args = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not slow and not gpu", *tests]
            code = int(pytest.main(args))
        finally:
            os._exit(code)
    deadline = start + timeout
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                return ("passed" if code == 0 else "failed"), time.monotonic() - start
            if time.monotonic() > deadline:
                kill_group(pid)
                return "timeout", time.monotonic() - start
            time.sleep(0.05)
    except BaseException:  # Ctrl-C / SIGTERM: take the running mutant's processes down too
        kill_group(pid)
        raise


def run_in_stages(
    workdir: Path, tests: list[str], timeout: float, log_file: Path
) -> tuple[str, float]:
    """``run_tests`` one entry of ``tests`` at a time, stopping at the first that fails: a mutant
    the first file catches then costs only that file's collection, not every file's."""
    total = 0.0
    for entry in tests:
        outcome, secs = run_tests(workdir, [entry], timeout - total, log_file)
        total += secs
        if outcome != "passed":
            return outcome, total
    return "passed", total


def kill_group(pid: int) -> None:
    """Kill the child this script forked and its process group (its test subprocesses)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)
    os.waitpid(pid, 0)


def prepare_copy(workdir: Path) -> None:
    for name in COPIED:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, workdir / name, ignore=shutil.ignore_patterns("__pycache__"))
        elif src.exists():
            shutil.copy2(src, workdir / name)


def preload() -> None:
    """Import the heavy third-party modules once, so every forked mutant starts warm."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)
    leaked = [name for name in sys.modules if name.split(".")[0] in PROJECT_PACKAGES]
    if leaked:  # the children must import the mutated copy, not a module loaded here
        raise RuntimeError(f"project modules were imported before forking: {leaked}")


def run_mutants(
    modules: list[str], mutants: list[Mutant], timeout_factor: float
) -> list[dict] | None:
    """Each mutant's outcome, its tests run on a temporary copy of the repository (None when a
    module's tests fail before any mutant: nothing can be learned from its mutants then)."""
    results: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="mutate_") as tmp:
        workdir = Path(tmp) / "repo"
        workdir.mkdir()
        prepare_copy(workdir)
        os.environ["PYTHONPATH"] = str(workdir)  # subprocesses (the CLI tests) import the copy
        log_file = Path(tmp) / "pytest.log"
        timeouts: dict[str, float] = {}
        for module in modules:
            outcome, secs = run_tests(workdir, TARGETS[module], 1800, log_file)
            if outcome != "passed":
                print(log_file.read_text()[-3000:])
                print(f"the tests of {module} fail without any mutant: fix them first")
                return None
            timeouts[module] = timeout_factor * secs + 60
            print(f"{module}: tests pass unmutated in {secs:.1f} s", flush=True)
        for m in mutants:
            target = workdir / m.module
            original = target.read_text()
            target.write_text(m.apply(original))
            try:
                outcome, secs = run_in_stages(
                    workdir, TARGETS[m.module], timeouts[m.module], log_file
                )
            finally:
                target.write_text(original)
            status = {"passed": "SURVIVED", "failed": "killed", "timeout": "timeout"}
            if outcome == "passed" and m.key in EQUIVALENT:
                status["passed"] = "equivalent"
            verdict = status[outcome]
            results.append({**asdict(m), "outcome": verdict, "seconds": round(secs, 1)})
            print(
                f"{m.id:4d} {verdict:<16} {secs:6.1f}s {m.module}:{m.line}: "
                f"{m.description} | {m.source_line}",
                flush=True,
            )
    return results


def report(results: list[dict], path: Path | None) -> int:
    """Print the tally and every timed-out and surviving mutant; 1 when any survived."""
    counts = {k: sum(r["outcome"] == k for r in results) for k in ("killed", "timeout")}
    survivors = [r for r in results if r["outcome"] == "SURVIVED"]
    equivalent = [r for r in results if r["outcome"] == "equivalent"]
    print(
        f"\n{len(results)} mutants: {counts['killed']} killed, {counts['timeout']} timed out "
        f"(counted as detected: check them on a quiet machine), {len(equivalent)} equivalent "
        f"(listed in EQUIVALENT), {len(survivors)} survived"
    )
    for r in [r for r in results if r["outcome"] == "timeout"]:
        print(f"  TIMEOUT  {r['id']}: {r['module']}:{r['line']}: {r['description']}")
    for r in survivors:
        print(f"  SURVIVED {r['id']}: {r['module']}:{r['line']}: {r['description']}")
        print(f"           {r['source_line']}  ->  {r['replacement']}")
    if path:
        path.write_text(json.dumps(results, indent=1))
    return 1 if survivors else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", help=f"modules to mutate (default: {list(TARGETS)})")
    parser.add_argument("--list", action="store_true", help="print the mutants and stop")
    parser.add_argument("--only", type=int, nargs="+", help="run only these mutant numbers")
    parser.add_argument("--report", type=Path, help="write every mutant's outcome as JSON here")
    parser.add_argument(
        "--timeout-factor",
        type=float,
        default=5.0,
        help="a mutant's tests time out after this many times the unmutated run, plus a minute",
    )
    args = parser.parse_args(argv)
    modules = args.modules or list(TARGETS)
    unknown = [m for m in modules if m not in TARGETS]
    if unknown:
        parser.error(f"no tests mapped for {unknown}; known modules: {list(TARGETS)}")

    mutants: list[Mutant] = []
    for module in modules:
        mutants += make_mutants(module, start_id=len(mutants))
    if args.list:
        for m in mutants:
            print(f"{m.id:4d} {m.module}:{m.line}: {m.description:<18} | {m.source_line}")
        return 0
    if args.only:
        mutants = [m for m in mutants if m.id in set(args.only)]

    # SIGTERM unwinds like Ctrl-C: the running mutant is killed and the temporary copy removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started in background
    sys.dont_write_bytecode = True  # a mutated file must never be served from a stale .pyc
    os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    preload()
    results = run_mutants(modules, mutants, args.timeout_factor)
    if results is None:
        return 2
    return report(results, args.report)
