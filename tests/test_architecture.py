"""The package layout holds: imports run one way, no module imports itself back, and every
Redis key prefix is spelled in exactly one module of its package (docs/architecture.md).

Read from the source with `ast`, so imports inside functions and under TYPE_CHECKING count:
a lazy import hides a cycle from Python, not from a maintainer.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lease", "tasks", "beat", "devtools")
WINGS = ("tasks.ranges", "tasks.restock", "tasks.rollback")
EXAMPLES = "tasks.examples"
# The operator command line and the operator console put the wings' views together; the only
# core-level modules that may import a wing.
TOP = ("tasks.__main__", "tasks.cli", "tasks.console")


def is_top(name: str) -> bool:
    return any(within(name, top) for top in TOP)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def sources(*packages: str) -> dict[str, Path]:
    found = {}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


PROJECT = sources(*PRODUCT, "bench", "examples", "tests")


def imports_of(name: str, path: Path) -> Iterator[str]:
    """Every module `path` imports, resolved to a project module where it names one."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                yield candidate if candidate in PROJECT else base


def graph(*packages: str) -> dict[str, set[str]]:
    return {name: set(imports_of(name, path)) for name, path in sources(*packages).items()}


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def wing_of(name: str) -> str | None:
    return next((wing for wing in (*WINGS, EXAMPLES) if within(name, wing)), None)


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module, or a self-import."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in edges.get(node, ()):
            if nxt not in edges:
                continue
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in edges.get(node, ()):
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_itself_back() -> None:
    assert cycles(graph(*PRODUCT)) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_lease_imports_only_redis_and_the_standard_library() -> None:
    allowed = set(sys.stdlib_module_names) | {"redis", "lease", "__future__"}
    bad = {(name, target) for name, targets in graph("lease").items() for target in targets
           if target.split(".")[0] not in allowed}
    assert bad == set()


def test_the_core_never_imports_a_wing_and_wings_never_import_each_other() -> None:
    bad = set()
    for name, targets in graph("tasks").items():
        own = wing_of(name)
        for target in targets:
            other = wing_of(target)
            if other is None or other == own or is_top(name):
                continue
            if own == EXAMPLES:
                continue  # the examples are the users' view: they may use every wing
            bad.add((name, target))
    assert bad == set()


@pytest.mark.parametrize("forbidden", ["beat", "devtools", "bench"])
def test_tasks_never_imports_beat_devtools_or_bench(forbidden: str) -> None:
    bad = {(name, target) for name, targets in graph("tasks").items() for target in targets
           if within(target, forbidden)}
    assert bad == set()


@pytest.mark.parametrize("forbidden", ["examples", "bench"])
def test_the_product_never_imports_the_example_or_the_benchmarks(forbidden: str) -> None:
    """The example job is a user's project and the benchmarks measure the product: what
    workers import (lease, tasks, beat) names neither, so the example reaches workers only the
    way a user's job does (EXTRA_TASK_MODULES)."""
    bad = {(name, target) for name, targets in graph("lease", "tasks", "beat").items()
           for target in targets if within(target, forbidden)}
    assert bad == set()


def test_the_example_uses_the_platform_only_through_its_public_modules() -> None:
    """What users copy imports the platform as a user's project would (the range-job API
    and, for its seeder, the settings and the engine), never the benchmarks or the tests."""
    bad = {(name, target) for name, targets in graph("examples").items() for target in targets
           if within(target, "bench") or within(target, "tests") or within(target, "devtools")}
    assert bad == set()


def test_the_platform_names_the_example_nowhere_as_a_task_module() -> None:
    """No worker of the platform registers the example: it is not among Celery's own
    `include` strings (TASK_MODULES), which no import graph sees."""
    from tasks.celery import TASK_MODULES

    assert [m for m in TASK_MODULES if "cm_data" in m or within(m, "examples")] == []


def test_only_benchmarks_and_tests_import_bench() -> None:
    bad = {(name, target) for name, targets in graph(*PRODUCT).items() for target in targets
           if within(target, "bench")}
    assert bad == set()


# Every prefix, and the one module of its package that may spell it.
KEY_OWNERS = {
    "lease:": "lease/keys.py", "fence:": "lease/keys.py", "lease-waiting:": "lease/keys.py",
    "lease-wake:": "lease/keys.py",
    "deliveries:": "tasks/worker/keys.py", "beat:leader": "tasks/worker/keys.py",
    "rollback-handover:": "tasks/rollback/keys.py", "journal:": "tasks/rollback/keys.py",
    "range:": "tasks/ranges/keys.py", "range-control:": "tasks/ranges/keys.py",
    "range-throttle:": "tasks/ranges/keys.py", "range-orphans:": "tasks/ranges/keys.py",
    "range-outage:": "tasks/ranges/keys.py",
    "stock:": "tasks/restock/keys.py", "deducted:": "tasks/restock/keys.py",
    "term:": "tasks/restock/keys.py", "meta:": "tasks/restock/keys.py",
    "redo:": "tasks/restock/keys.py", "redo-cursor:": "tasks/restock/keys.py",
    "offset:": "tasks/restock/keys.py", "offsets:": "tasks/restock/keys.py",
    "delay:": "tasks/restock/keys.py", "drain-attempts:": "tasks/restock/keys.py",
    "rebuild-attempts:": "tasks/restock/keys.py", "{stock:": "tasks/restock/keys.py",
    "saga:": "tasks/examples/saga.py",
    "console-session:": "tasks/console/keys.py", "console-login:": "tasks/console/keys.py",
    "rangekeeper:scratch": "devtools/embedded.py",
}


def code_strings(path: Path) -> Iterator[str]:
    """The string literals of `path`'s code (docstrings left out), f-strings' literal heads
    included."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)
                  and node.body and isinstance(node.body[0], ast.Expr)
                  and isinstance(node.body[0].value, ast.Constant)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and id(node) not in docstrings:
            if isinstance(node.value, str | bytes):
                value = node.value
                yield value.decode("latin-1") if isinstance(value, bytes) else value


def test_every_key_prefix_is_spelled_in_exactly_one_module() -> None:
    spelled: dict[str, set[str]] = {prefix: set() for prefix in KEY_OWNERS}
    for path in sources(*PRODUCT).values():
        for text in code_strings(path):
            for prefix in KEY_OWNERS:
                if text.startswith(prefix):
                    spelled[prefix].add(str(path.relative_to(ROOT)))
    assert spelled == {prefix: {owner} for prefix, owner in KEY_OWNERS.items()}


def test_no_prefix_constant_outside_the_key_modules() -> None:
    owners = set(KEY_OWNERS.values())
    bad = set()
    for path in sources(*PRODUCT).values():
        rel = str(path.relative_to(ROOT))
        if rel in owners:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
                names = [t.id for t in node.targets if isinstance(t, ast.Name)]
                if any(n.endswith("_PREFIX") for n in names):
                    bad.add((rel, *names))
    assert bad == set()
