"""Each folder imports only the layers docs/design.md ("Layout") lets it import: the
errors from errors/, nothing of the command line below it, and no click on the reading
side. Every import counts, those inside functions too."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path
from typing import Dict, Iterator, Set, Tuple

import pytest

ROOT = Path(__file__).resolve().parent.parent

# folder -> the layers it may import (its own aside); cli/ may import any
ALLOWED: Dict[str, Set[str]] = {
    "errors": set(),
    "trampolines": {"errors"},
    "arch": {"errors", "trampolines", "programs"},
    "rewriter": {"errors", "trampolines", "arch"},
    "programs": {"errors", "trampolines", "rewriter"},
    "reader": {"errors", "trampolines", "programs"},
    "api": {"errors", "trampolines", "arch", "rewriter", "programs", "reader"},
}
LAYERS = set(ALLOWED)  # every other urewrite.X is the package root's: the command line
COMMAND_LINE_ONLY = {"click"}  # what only cli/ imports


def imports(path: Path) -> Iterator[Tuple[int, str]]:
    """(line, dotted name) of every module the file imports; `from urewrite import X`
    names urewrite.X."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "urewrite":
                for alias in node.names:
                    yield node.lineno, f"urewrite.{alias.name}"
            else:
                yield node.lineno, node.module


def layer_of(name: str) -> str:
    """The folder an imported urewrite module lives in ("cli" for the package root's)."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else "cli"


def wrong_imports(folder: str) -> list:
    out = []
    for path in sorted((ROOT / folder).rglob("*.py")):
        for line, name in imports(path):
            where = f"{path.relative_to(ROOT)}:{line}: {name}"
            top = name.split(".")[0]
            if top == "urewrite":
                layer = layer_of(name)
                if layer != folder and layer not in ALLOWED[folder]:
                    out.append(where)
            elif top in COMMAND_LINE_ONLY:
                out.append(where)
    return out


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(folder):
    assert (ROOT / folder / "__init__.py").is_file()
    assert wrong_imports(folder) == []


def test_the_package_root_imports_nothing():
    """Importing any urewrite.X runs cli/__init__.py (the package root) first: it must
    not bring the command line with it."""
    assert list(imports(ROOT / "cli" / "__init__.py")) == []


@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_each_folder_is_installed_under_its_own_name(folder):
    """urewrite.FOLDER is the folder FOLDER, installed or not."""
    package = Path(importlib.import_module(f"urewrite.{folder}").__file__)
    assert (package.parent.name, package.name) == (folder, "__init__.py")


def test_the_rule_sees_a_wrong_import(tmp_path, monkeypatch):
    """The check itself: an import of the command line, or of click, from the reading
    side (inside a function) is caught."""
    (tmp_path / "reader").mkdir()
    (tmp_path / "reader" / "__init__.py").write_text("")
    (tmp_path / "reader" / "bad.py").write_text(
        "from urewrite.errors import UrewriteError\n"
        "from urewrite import console\n"
        "def f():\n    import click\n    from urewrite.rewriter import pipeline\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    assert wrong_imports("reader") == ["reader/bad.py:2: urewrite.console",
                                       "reader/bad.py:4: click",
                                       "reader/bad.py:5: urewrite.rewriter"]
