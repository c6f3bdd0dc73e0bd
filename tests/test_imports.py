"""The import graph of src/diffmeter, read with ast: no circles, lower layers never import higher ones (not
even inside a function), and no module imports another module's private names."""

from __future__ import annotations

import ast
from pathlib import Path

SOURCE = Path(__file__).parents[1] / "src"


def _modules() -> dict[str, Path]:
    found = {}
    for path in SOURCE.rglob("*.py"):
        parts = path.relative_to(SOURCE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(modules: dict[str, Path]) -> dict[str, set[tuple[str, str | None]]]:
    """Each module's imports of diffmeter modules, anywhere in it: (module, the name taken from it or None)."""
    graph = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        taken = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                taken |= {(alias.name, None) for alias in node.names if alias.name in modules}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                for alias in node.names:
                    if f"{base}.{alias.name}" in modules:
                        taken.add((f"{base}.{alias.name}", None))
                    elif base in modules:
                        taken.add((base, alias.name))
        graph[name] = taken
    return graph


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, found, counter = {}, {}, [], set(), [], [0]

    def visit(node):
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                other = stack.pop()
                on.discard(other)
                component.append(other)
                if other == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


GRAPH = _imports(_modules())


def test_no_import_circles():
    edges = {name: {module for module, _ in taken if module != name} for name, taken in GRAPH.items()}
    assert _cycles(edges) == []


def test_no_module_takes_another_modules_private_names():
    taken = [
        f"{name} imports {module}.{attribute}"
        for name, imports in GRAPH.items()
        for module, attribute in imports
        if attribute and attribute.startswith("_") and not attribute.startswith("__") and module != name
    ]
    assert taken == []


#: the layers, lowest first, as docs/ARCHITECTURE.md draws the data flow; a module may import its own layer and
#: those below it. The package root is a base: its public names (``diffmeter.bench``, ...) load lazily, by name.
LAYERS = (
    (
        "diffmeter",
        "errors",
        "units",
        "quiet",
        "cache",
        "spec",
        "optimization_spec",
        "quantization_spec",
        "stages",
        "parallel",
    ),
    (
        "catalog",
        "families",
        "pipelines",
        "random_weights",
        "tiny",
        "loading",
        "quantized_loading",
        "lora_file",
        "weights",
        "text_encoders",
    ),
    ("flops",),
    ("predict",),
    ("optimize",),
    ("measure",),
    ("runs", "doctor"),
    ("distributed",),
    ("execute",),
    ("sweep",),
    ("report",),
    ("cli",),
)


def _layer(module: str) -> int | None:
    top = module.split(".")[1] if "." in module else module
    return next((rank for rank, names in enumerate(LAYERS) if top in names), None)


def test_every_module_has_a_layer():
    assert [name for name in GRAPH if _layer(name) is None] == []


def test_lower_layers_never_import_higher_ones():
    """Not even inside a function: the measured run (runs/) never knows how it is executed (distributed/, sweep/,
    chosen by diffmeter.execute above both); the predictions never reach into the techniques or the measurements."""
    upward = [
        f"{name} imports {module}"
        for name, imports in GRAPH.items()
        for module, _ in imports
        if _layer(module) > _layer(name)
    ]
    assert upward == []


def test_the_checker_sees_a_circle_and_a_private_import(tmp_path):
    """The test's own check: a planted circle and a planted private import are found."""
    package = tmp_path / "diffmeter"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from diffmeter.b import _hidden\n")
    (package / "b.py").write_text("def f():\n    from diffmeter import a\n_hidden = 1\n")
    global SOURCE
    kept, SOURCE = SOURCE, tmp_path
    try:
        graph = _imports(_modules())
    finally:
        SOURCE = kept
    assert ("diffmeter.b", "_hidden") in graph["diffmeter.a"]
    edges = {name: {module for module, _ in taken if module != name} for name, taken in graph.items()}
    assert _cycles(edges) == [["diffmeter.a", "diffmeter.b"]]
