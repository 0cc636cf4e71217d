"""The suite's own layout: one folder per subject, and no test module imports another test module
(what several test files use is in ``helpers.py``, ``cases.py`` or ``tolerances.py``), so that a
test file can move, or go, without breaking another one.

Read from the source with ``ast``: every ``import`` counts, those inside functions too."""

from __future__ import annotations

import ast
import pathlib

SUITE = pathlib.Path(__file__).resolve().parents[1]  # shared_tests/


def imported_modules(tree: ast.AST, package: str) -> list[str]:
    """The dotted names of the modules ``tree`` (a module of ``package``) imports, relative
    imports resolved; ``from X import Y`` counts both X and X.Y (Y may be a module)."""
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def imported_test_modules(path: pathlib.Path) -> list[str]:
    """The test modules the file at ``path`` (under shared_tests/) imports."""
    package = ".".join(path.relative_to(SUITE.parent).parts[:-1])
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [name for name in imported_modules(tree, package) if name.split(".")[-1].startswith("test_")]


def test_no_test_module_imports_another_test_module():
    files = sorted(SUITE.rglob("*.py"))
    assert len([f for f in files if f.name.startswith("test_")]) >= 40, "the suite's test files were not found"
    offenders = [f"{path.relative_to(SUITE)} imports {name}" for path in files for name in imported_test_modules(path)]
    assert not offenders, "a test module imports another (move what they share to helpers.py):\n" + "\n".join(
        offenders
    )
    # and the check sees each form such an import can take
    for source in (
        "from ..training.test_training import CURVE_STEPS",
        "from .test_models import build",
        "from .. import test_models",
        "import shared_tests.models.test_models",
        "def f():\n    from shared_tests.training import test_gradients",
    ):
        assert [n for n in imported_modules(ast.parse(source), "shared_tests.models") if "test_" in n], source


def test_every_test_file_sits_in_the_folder_of_its_subject():
    loose = sorted(p.name for p in SUITE.glob("test_*.py"))
    assert not loose, f"test files outside a subject folder of shared_tests/: {loose}"
    folders = sorted({p.parent for p in SUITE.rglob("test_*.py")})
    for folder in folders:
        init = folder / "__init__.py"
        assert init.exists(), f"{folder.relative_to(SUITE)} has no __init__.py"
        assert ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))), (
            f"{init.relative_to(SUITE)} does not say what the folder's tests are about"
        )
