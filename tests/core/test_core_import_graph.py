"""The package layout as a graph: no import cycles, and imports go stare_tir -> envs -> sandbox only.

Every `import` / `from ... import` statement of the three packages counts, including those inside
functions: a cycle hidden in a function body still forces lazy imports and untyped parameters
(the trainer -> train_config -> pipeline -> trainer circle once made `pipeline` take `cfg: Any`).
Imports under `if TYPE_CHECKING:` are left out (they never run), and so are a module's imports of
its own ancestor packages (Python initialises those first in any case).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("stare_tir", "envs", "sandbox", "registry")
# A package may import itself and the packages to its right, never those to its left.
ORDER = {name: i for i, name in enumerate(PACKAGES)}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Internal modules imported anywhere in `path` (resolved to the longest known module)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    me = _module_name(path)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    found: set[str] = set()

    def resolve(name: str) -> None:
        parts = name.split(".")
        for k in range(len(parts), 0, -1):
            cand = ".".join(parts[:k])
            if cand in modules:
                found.add(cand)
                return

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            for alias in node.names:
                resolve(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:  # `from pkg import module` imports the module
                resolve(f"{base}.{alias.name}")
            resolve(base)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    # A module's own ancestor packages are initialised before it runs anyway; `from . import name`
    # in a submodule reads a re-export of its package, which is no dependency of its own.
    return {m for m in found if m != me and not me.startswith(m + ".")}


def import_graph() -> dict[str, set[str]]:
    files = [p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")]
    modules = {_module_name(p) for p in files}
    return {_module_name(p): _imports(p, modules) for p in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle as [a, b, ..., a], or None (iterative DFS with colours)."""
    WHITE, GREY, BLACK = 0, 1, 2
    colour = dict.fromkeys(graph, WHITE)
    for start in sorted(graph):
        if colour[start] != WHITE:
            continue
        stack = [(start, iter(sorted(graph[start])))]
        path = [start]
        colour[start] = GREY
        while stack:
            node, it = stack[-1]
            nxt = next(it, None)
            if nxt is None:
                colour[node] = BLACK
                stack.pop()
                path.pop()
            elif colour.get(nxt, BLACK) == GREY:
                return path[path.index(nxt) :] + [nxt]
            elif colour.get(nxt) == WHITE:
                colour[nxt] = GREY
                stack.append((nxt, iter(sorted(graph[nxt]))))
                path.append(nxt)
    return None


def test_graph_sees_the_packages() -> None:
    graph = import_graph()
    # The walk must reach the real edges, or "no cycle" would be vacuous.
    assert "stare_tir.train_config" in graph["stare_tir.trainer"]
    assert "sandbox" in graph["envs.arithmetic"]
    assert len(graph) > 40


def test_no_import_cycle() -> None:
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_find_cycle_reports_one() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_packages_import_only_downstream() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in import_graph().items()
        for dep in deps
        if ORDER[dep.split(".")[0]] < ORDER[mod.split(".")[0]]
    ]
    assert not wrong, "imports against stare_tir -> envs -> sandbox: " + "; ".join(sorted(wrong))


# Inside stare_tir, the application layer (app/: the commands, the pipeline, start-up checks) is on
# top: the stages it runs (sft, eval, trainer, ...) never import it. What they share with it (the
# user-fixable errors) lives below both (stare_tir/errors.py).
TOP_OF_STARE_TIR = "stare_tir.app"


def test_no_stage_imports_the_application_layer() -> None:
    wrong = [
        f"{mod} imports {dep}"
        for mod, deps in import_graph().items()
        if mod.startswith("stare_tir.") and not (mod == TOP_OF_STARE_TIR or mod.startswith(TOP_OF_STARE_TIR + "."))
        for dep in deps
        if dep == TOP_OF_STARE_TIR or dep.startswith(TOP_OF_STARE_TIR + ".")
    ]
    assert not wrong, "imports upward into stare_tir.app: " + "; ".join(sorted(wrong))
