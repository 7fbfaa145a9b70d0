"""The package's shape, checked: no import cycle, layers import downwards only, core never imports streamlit,
and no name starting with ``_`` is imported from another module (ARCHITECTURE.md's rules)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "ckptlab"

# Lower layers first: a module may import its own layer and those before it, never a later one.
LAYERS = [
    {"ckptlab.errors", "ckptlab.fact", "ckptlab.units", "ckptlab.torchstate", "ckptlab.files"},
    {"ckptlab.model"},
    {
        "ckptlab.spec",
        "ckptlab.spec_fields",
        "ckptlab.training_args",
        "ckptlab.alloc_conf",
    },  # what to run, its fields at the edges; a user's TrainingArguments read as it
    {"ckptlab.results"},
    {"ckptlab.step"},
    {"ckptlab.explore"},
    {"ckptlab.show"},
    {"ckptlab.lab", "ckptlab.cli", "ckptlab.integrations"},  # front ends: the app's, the command line, a Trainer
    {"ckptlab", "ckptlab.__main__"},
]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def _imports(path: Path) -> list[tuple[str, list[str]]]:
    """(imported module, names) for every import in the file, in functions too, relative ones resolved."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [(alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.append((base, [alias.name for alias in node.names]))
    return found


def _edges(name: str) -> set[str]:
    """The package's modules that ``name`` imports (``from pkg import module`` counts as the module)."""
    edges = set()
    for module, names in _imports(MODULES[name]):
        if module not in MODULES:
            continue
        submodules = {f"{module}.{n}" for n in names if f"{module}.{n}" in MODULES}
        edges |= submodules or {module}
        if submodules and len(submodules) < len(names):
            edges.add(module)
    return edges - {name}


def _layer(name: str) -> int:
    for index, layer in enumerate(LAYERS):
        if any(name == top or name.startswith(top + ".") for top in layer if top != "ckptlab") or name in layer:
            return index
    raise AssertionError(f"{name} is in no layer of tests/test_architecture.py")


def test_the_package_has_no_import_cycle():
    graph = {name: _edges(name) for name in MODULES}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import cycle: " + " -> ".join(path[path.index(name) :] + [name]))
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, path + [name])
        done.add(name)

    for name in graph:
        visit(name, [])


def test_a_module_imports_only_its_own_layer_and_lower_ones():
    upward = [
        f"{name} imports {other}" for name in MODULES for other in sorted(_edges(name)) if _layer(other) > _layer(name)
    ]
    assert not upward, upward


def test_the_core_never_imports_streamlit():
    for name, path in MODULES.items():
        imported = {module for module, _ in _imports(path)}
        assert not any(module.split(".")[0] == "streamlit" for module in imported), name


def test_no_private_name_is_imported_from_another_module():
    sources = [*PACKAGE.rglob("*.py"), *(ROOT / "pages").glob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    sources += [*(ROOT / "tests").rglob("*.py"), ROOT / "app.py"]
    ours = ("ckptlab", "pages", "benchmarks", "tests")
    private = []
    for path in sources:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] in ours):
                private += [
                    f"{path.relative_to(ROOT)}: {alias.name}" for alias in node.names if alias.name.startswith("_")
                ]
    assert not private, private
