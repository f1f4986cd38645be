"""The package layout holds: imports run one way, no module imports itself back, and every
Redis key prefix is spelled in exactly one module of its package (docs/architecture.md).

Read from the source with `ast`, so imports inside functions and under TYPE_CHECKING count:
a lazy import hides a cycle from Python, not from a maintainer.
"""

from __future__ import annotations

import ast
import dataclasses
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lease", "tasks", "beat", "devtools")
WINGS = ("tasks.ranges", "tasks.restock", "tasks.rollback")
EXAMPLES = "tasks.examples"
# The operator command line and the operator console put the wings' views together; with the
# composition root, the only core-level modules that may import a wing.
TOP = ("tasks.__main__", "tasks.cli", "tasks.console")
# The composition root: the app and the list of wings it is built from.
ROOT_MODULES = ("tasks.celery", "tasks.wings")
# The core's rooms: they import no wing and name none by string (the wings register what they
# bring through their declarations, tasks/<wing>/wing.py).
ROOMS = ("tasks.config", "tasks.store", "tasks.worker", "tasks.observe", "tasks.deadletters",
         "tasks.wing")
# The wings' declaration modules, and what each owns besides its keys.
DECLARATIONS = {"tasks.ranges": "tasks.ranges.wing", "tasks.restock": "tasks.restock.wing",
                "tasks.rollback": "tasks.rollback.wing"}
MAX_MODULE_LINES = 400
MAX_FUNCTION_LINES = 50


def is_top(name: str) -> bool:
    return any(within(name, top) for top in (*TOP, *ROOT_MODULES))


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


def test_the_rooms_import_no_wing_and_name_none_by_string() -> None:
    """A room knows no wing: no import (lazy or TYPE_CHECKING ones included) and no string that
    names one (a module path, a task name or pattern, a `module:function` spec)."""
    wings = (*WINGS, EXAMPLES)
    bad = set()
    for name, path in sources("tasks").items():
        if not any(within(name, room) for room in ROOMS):
            continue
        for target in imports_of(name, path):
            if wing_of(target) is not None:
                bad.add((name, target))
        for text in code_strings(path):
            if any(wing in text for wing in wings):
                bad.add((name, text))
    assert bad == set()


def test_the_wings_are_named_only_by_the_composition_root_and_the_operator_faces() -> None:
    """Outside the wings themselves, only tasks.celery, tasks.wings and the operator faces name
    a wing's module in a string (Celery's include, a task name)."""
    bad = set()
    for name, path in sources("tasks").items():
        if wing_of(name) is not None or is_top(name):
            continue
        for text in code_strings(path):
            if any(text.startswith(wing + ".") or text == wing for wing in WINGS):
                bad.add((name, text))
    assert bad == set()


def _owner_of(name: str) -> str | None:
    """The wing (or room) package `name` belongs to."""
    return wing_of(name) or next((room for room in ROOMS if within(name, room)), None)


def test_every_table_is_declared_in_exactly_one_module_of_its_owner() -> None:
    from tasks.wings import load_tables

    metadata = load_tables()
    declared: dict[str, set[str]] = {}
    for name, path in sources("tasks").items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            table = None
            if (isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "__tablename__" for t in node.targets)
                    and isinstance(node.value, ast.Constant)):
                table = node.value.value
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                  and node.func.id == "Table" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                table = node.args[0].value
            if table is not None:
                declared.setdefault(str(table), set()).add(name)
    assert set(declared) == set(metadata.tables)
    owners = {table: {_owner_of(m) for m in modules} for table, modules in declared.items()}
    assert {t: len(m) for t, m in declared.items()} == {t: 1 for t in declared}
    expected = {"work_items": "tasks.ranges", "schedules": "tasks.ranges",
                "range_runs": "tasks.ranges", "range_run_events": "tasks.ranges",
                "range_job_schedules": "tasks.ranges",
                "range_run_input": "tasks.ranges",
                "skus": "tasks.restock", "orders": "tasks.restock",
                "order_items": "tasks.restock", "payments": "tasks.restock",
                "restock_nodes": "tasks.restock", "rollback_journal": "tasks.rollback",
                "rollback_owners": "tasks.rollback", "dead_letters": "tasks.deadletters"}
    assert owners == {table: {owner} for table, owner in expected.items()}


def test_every_settings_section_and_variable_has_one_owner() -> None:
    """Each wing's section is declared in its own package, no variable is read twice (by the
    core and a section, or by two sections), and every wing with settings has one."""
    from tasks.config.settings import _FIELDS, env_name
    from tasks.wings import WINGS as DECLARED
    from tasks.wings import sections

    owners = {cls.__module__: cls for cls in sections()}
    assert {wing_of(module) for module in owners} == {w for w in WINGS}
    assert len(sections()) == len({*sections()}) == len(DECLARED)
    names = [name for name, _ in _FIELDS.values()]
    for cls in sections():
        names += [env_name(cls, f) for f in dataclasses.fields(cls) if "parse" in f.metadata]
    assert sorted(n for n in names if names.count(n) > 1) == []


def test_every_metric_series_has_one_owner() -> None:
    """A series name is made once: the core's in tasks.observe.metrics, each wing's in its
    own series class (named for its wing: range_*, restock_*, rollback_*)."""
    from tasks.observe.metrics import Metrics
    from tasks.wings import WINGS as DECLARED

    series = [wing.series for wing in DECLARED if wing.series is not None]
    metrics = Metrics(series)
    owned: dict[str, list[str]] = {}
    core = [v for v in vars(metrics).values() if hasattr(v, "_name")]
    core += list(metrics.lease.values())
    for metric in core:
        owned.setdefault(metric._name, []).append("tasks.observe.metrics")
    for cls, found in metrics.wings.items():
        assert wing_of(cls.__module__) is not None, cls
        for metric in vars(found).values():
            owned.setdefault(metric._name, []).append(cls.__module__)
    assert {name: owners for name, owners in owned.items() if len(owners) > 1} == {}
    prefixes = {"tasks.ranges": "rangekeeper_range_", "tasks.restock": "rangekeeper_restock_",
                "tasks.rollback": "rangekeeper_rollback_"}
    for name, (owner,) in owned.items():
        wing = wing_of(owner)
        if wing is not None:
            assert name.startswith(prefixes[wing]), (name, owner)


def test_every_wing_declares_its_routes_beat_entries_and_dead_letter_kinds() -> None:
    """A wing's routes and beat entries name its own tasks only; a dead-letter kind has one
    owner (the core's are in tasks.deadletters.kinds)."""
    from tasks.deadletters.kinds import CORE_KINDS
    from tasks.wings import WINGS as DECLARED

    assert {w.__module__ for w in map(type, DECLARED)} == {"tasks.wing"}
    kinds = [k.name for k in CORE_KINDS]
    for wing in DECLARED:
        package = f"tasks.{wing.name}"
        assert package in WINGS
        assert all(r.pattern.startswith(package + ".") for r in wing.routes), wing.name
        assert all(b.task.startswith(package + ".") for b in wing.beat), wing.name
        assert all(within(m, package) for m in wing.task_modules), wing.name
        kinds += [k.name for k in wing.dead_letter_kinds]
    assert sorted(k for k in kinds if kinds.count(k) > 1) == []


def test_no_module_is_long_and_no_function_is_long() -> None:
    long_modules, long_functions = set(), set()
    for name, path in sources(*PRODUCT).items():
        text = path.read_text(encoding="utf-8")
        if len(text.splitlines()) > MAX_MODULE_LINES:
            long_modules.add(name)
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long_functions.add((name, node.name, length))
    assert long_modules == set()
    assert long_functions == set()


def test_the_console_never_imports_the_cli() -> None:
    """The CLI and the console both stand on the wings' views and the dead-letter module;
    neither imports the other (the CLI names the console only to serve it)."""
    bad = {(name, target) for name, targets in graph("tasks").items() for target in targets
           if within(name, "tasks.console") and within(target, "tasks.cli")}
    assert bad == set()


def package_faces(package: str) -> dict[str, Path]:
    return {name: path for name, path in sources(package).items() if path.name == "__init__.py"}


def test_every_package_face_under_tasks_does_no_work() -> None:
    """A face of `tasks` holds its docstring and nothing else (`from __future__` at most): so
    importing `tasks.ranges.planning` runs `tasks/ranges/__init__.py` and builds nothing, reads
    no environment and connects no signal."""
    bad = set()
    for name, path in package_faces("tasks").items():
        body = ast.parse(path.read_text(encoding="utf-8")).body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]
        bad |= {(name, node.lineno) for node in body
                if not (isinstance(node, ast.ImportFrom) and node.module == "__future__")}
    assert bad == set()


def test_no_module_imports_a_name_through_a_face_of_tasks() -> None:
    """`from tasks.rollback import step` would need the face to import `api`: every import
    from a package of `tasks` names one of its modules (`from tasks.console import actions`)
    or goes to the module itself (`from tasks.rollback.api import step`)."""
    faces = set(package_faces("tasks"))
    bad = set()
    for name, path in PROJECT.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module in faces:
                bad |= {(name, f"{node.module}.{alias.name}") for alias in node.names
                        if f"{node.module}.{alias.name}" not in PROJECT}
    assert bad == set()


def test_rich_is_drawn_in_one_module_of_the_cli() -> None:
    """The wings' status views and the dead-letter view are plain data; the CLI draws them in
    `tasks.cli.render`, the console serialises them."""
    drawers = {name for name, targets in graph("lease", "tasks", "beat").items()
               if any(within(target, "rich") for target in targets)}
    assert drawers == {"tasks.cli.render"}
