"""The library's map, enforced: each package imports only the packages it may (docs/architecture.md,
"Code map"), the library never imports a service, and no module is longer than it should be."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LIBRARY = ROOT / "hypermedia"

MAY_IMPORT: dict[str, set[str]] = {
    "api": set(),
    "core": set(),
    "infra": {"core", "api"},
    "intake": {"core"},
    "jobs": {"core", "infra", "api"},
    "engines": {"core", "intake"},
    "sandbox": {"core", "engines.contract"},
    "worker": {"core", "infra", "jobs", "sandbox", "api", "engines.contract"},
    "devtools": {"core", "infra", "jobs", "api", "intake", "sandbox", "worker", "engines", "client"},
    "client": {"core"},
}
"""Package → the packages it may import (its own always). ``engines.contract`` is the engine
contract alone, not the engines."""

EXCEPTIONS: dict[str, set[str]] = {
    "hypermedia.engines.documents.office": {"sandbox"},
}
"""Modules allowed one import more, with the reason: the LibreOffice listener pool runs in the
docworker (not in a job's child) and confines its listeners with the sandbox's helper entry."""

LONG_MODULES: dict[str, str] = {
    "hypermedia.engines.ocr.preprocess": "one pipeline of page steps (grey, background, upscale, "
    "orientation, deskew), each recorded, whose measurements are tuned together",
    "hypermedia.engines.ocr.tables": "one detection pipeline (lines, gutters, spanning rows, runs, cells, "
    "alignment) whose thresholds are tuned together on the same pages",
}
"""Modules allowed over :data:`MAX_LINES`, each with the reason (one cohesive pipeline)."""
MAX_LINES = 600


def _modules() -> list[Path]:
    return sorted(p for p in LIBRARY.rglob("*.py") if "_pb2" not in p.name and p != LIBRARY / "__init__.py")


def _name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at any depth (function-level imports included)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def _area(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "hypermedia" or len(parts) < 2:
        return None
    if parts[1:3] == ["engines", "contract"]:
        return "engines.contract"
    return parts[1]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_module_imports_only_what_its_package_may(path: Path) -> None:
    name = _name(path)
    own = _area(name)
    assert own in MAY_IMPORT or own == "engines.contract", f"{name} is in no package of the map"
    allowed = MAY_IMPORT.get(own or "", set()) | {own} | EXCEPTIONS.get(name, set())
    if own == "engines.contract":
        allowed = {"engines.contract", "core"}
    if own == "engines":
        allowed |= {"engines.contract"}
    wrong = set()
    for imported in _imports(path):
        assert not imported.startswith("services"), f"{name} imports the service module {imported}"
        area = _area(imported)
        if area is not None and area not in allowed:
            wrong.add(imported)
    assert not wrong, f"{name} ({own}) may not import {sorted(wrong)}"


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_module_is_longer_than_one_use_case(path: Path) -> None:
    lines = len(path.read_text().splitlines())
    name = _name(path)
    assert lines <= MAX_LINES or name in LONG_MODULES, f"{name} has {lines} lines (> {MAX_LINES})"


def test_only_the_lifecycle_writes_job_state_and_only_credits_touches_its_tables() -> None:
    writers, credit_tables = [], []
    for path in [*ROOT.joinpath("hypermedia").rglob("*.py"), *ROOT.joinpath("services").rglob("*.py")]:
        text = path.read_text()
        relative = str(path.relative_to(ROOT))
        for statement in (
            "UPDATE processing_jobs",
            "UPDATE job_attempts",
            "INSERT INTO processing_jobs",
            "INSERT INTO job_attempts",
            "DELETE FROM processing_jobs",
        ):
            if statement in text and not relative.startswith("hypermedia/jobs/lifecycle/"):
                writers.append(f"{relative}: {statement}")
        if (
            "credit_holds" in text
            and "_pb2" not in path.name
            and not relative.startswith("services/credits/")
        ):
            credit_tables.append(relative)
    assert not writers
    assert not credit_tables


def _runtime_imports(path: Path) -> set[str]:
    """The modules ``path`` imports when it runs: :func:`_imports` without those under
    ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            node.body = []
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


def test_no_import_circle() -> None:
    """No two modules of the library import each other, directly or through others (a function-level
    import included: it only hides the circle, as ``media/poster.py`` and ``media/sprite.py`` did)."""
    modules = {_name(path): path for path in _modules()}

    def resolve(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    def ancestors(name: str) -> set[str]:
        parts = name.split(".")
        return {".".join(parts[:i]) for i in range(1, len(parts))}

    # A module's own packages are imported before it whatever it says, so they are no edge.
    graph = {
        name: {
            target
            for imported in _runtime_imports(path)
            if imported.startswith("hypermedia.")
            and (target := imported if imported in modules else resolve(imported)) is not None
            and target != name
            and target not in ancestors(name)
        }
        for name, path in modules.items()
    }
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(name: str, path: list[str]) -> list[str] | None:
        seen[name] = 1
        for target in sorted(graph[name]):
            if seen.get(target) == 1:
                return [*path[path.index(target) :], target] if target in path else [name, target]
            if target not in seen and (circle := visit(target, [*path, target])):
                return circle
        seen[name] = 2
        return None

    for name in sorted(graph):
        if name not in seen:
            circle = visit(name, [name])
            assert circle is None, " -> ".join(circle)


TESTS = ROOT / "tests"


def _is_test_module(module: str) -> bool:
    parts = module.split(".")
    return parts[0] == "tests" and parts[-1].startswith("test_")


def _test_modules_imported(path: Path) -> list[tuple[int, str]]:
    """``(line, module)`` for each test module (``tests.*.test_*``) ``path`` imports, at any depth;
    relative imports resolved against ``path``'s package, ``from tests.x import test_y`` included."""
    package = _name(path).split(".")[:-1] if path.name != "__init__.py" else _name(path).split(".")
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            modules = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        found.extend((node.lineno, module) for module in modules if _is_test_module(module))
    return found


def test_no_test_module_imports_another() -> None:
    """Shared builders live in ``tests/helpers/``; a test module (``test_*.py``) imports no other
    one, and nothing else under ``tests/`` imports a test module either, so each runs on its own."""
    wrong = []
    for path in sorted(TESTS.rglob("*.py")):
        for line, module in _test_modules_imported(path):
            wrong.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not wrong, "test modules imported (move the builders to tests/helpers/):\n" + "\n".join(wrong)
