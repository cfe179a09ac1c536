"""The client package's modules import one another without a circle, type-only imports included: the
lower ones type against a protocol of what they use, not against `Client`."""

from __future__ import annotations

import ast
from pathlib import Path

import gpud_client

ROOT = Path(gpud_client.__file__).parent


def module_name(path: Path) -> str:
    parts = ["gpud_client", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports() -> dict[str, set[str]]:
    """Each module's imports of the package's modules (under `if TYPE_CHECKING:` too)."""
    modules = {module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module in modules:
                for alias in node.names:  # `from gpud_client import packing` imports the submodule
                    sub = f"{node.module}.{alias.name}"
                    found.add(sub if sub in modules else node.module)
        graph[name] = found - {name}
    return graph


def circle(graph: dict[str, set[str]]) -> list[str] | None:
    """A loop of imports, if there is one."""
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> list[str] | None:
        if name in path:
            return [*path[path.index(name) :], name]
        if name in done:
            return None
        for imported in sorted(graph[name]):
            if (loop := visit(imported, [*path, name])) is not None:
                return loop
        done.add(name)
        return None

    for name in sorted(graph):
        if (loop := visit(name, [])) is not None:
            return loop
    return None


def test_the_client_package_has_no_import_circle() -> None:
    assert circle(imports()) is None


def test_only_the_front_modules_import_the_concrete_client() -> None:
    importers = {name for name, imported in imports().items() if "gpud_client.client" in imported}
    assert importers == {"gpud_client", "gpud_client.nn"}
