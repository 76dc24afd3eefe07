"""Source conventions, read from the source with ``ast``: one docstring style, no private names across modules.

* Docstrings use Google sections (``Args:``, ``Returns:``, ``Raises:``), as most of the code does; a numpy-style
  section (``Parameters`` over a ``----------`` underline) anywhere in ``src/`` fails.
* A private name (``_x``) is private to its module: ``from ripplekv.a.b import _c`` in another module fails (make
  the name public, or keep the code that needs it in its module).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
PACKAGE = "ripplekv"
PACKAGES = (PACKAGE, "ripplekv_eval")  # the library and the harness

NUMPY_SECTION = re.compile(
    r"^[ \t]*(Parameters|Other Parameters|Returns|Yields|Receives|Raises|Warns|Attributes|Methods|See Also|Notes"
    r"|References|Examples)[ \t]*\r?\n[ \t]*-{3,}[ \t]*$",
    re.MULTILINE,
)


def python_files(root: Path) -> list[Path]:
    return sorted(root.rglob("*.py"))


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def numpy_sections(path: Path) -> Iterator[str]:
    """``file:line: Section`` for each numpy-style section in any string of the file (docstrings included)."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for match in NUMPY_SECTION.finditer(node.value):
                line = node.lineno + node.value[: match.start()].count("\n")
                yield f"{path.name}:{line}: {match.group(1)}"


def private_imports(path: Path, root: Path) -> Iterator[str]:
    """``module imports other._name`` for each private name imported from another module of the package."""
    this = module_name(path, root)
    package = this if path.name == "__init__.py" else this.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, ast.ImportFrom):
            continue
        source = node.module or ""
        if node.level:  # a relative import: resolve it against this module's package
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            source = ".".join([*anchor, source] if source else anchor)
        if source.split(".")[0] not in PACKAGES:
            continue
        for alias in node.names:
            name = alias.name
            if name.startswith("_") and not (name.startswith("__") and name.endswith("__")) and source != this:
                yield f"{this} imports {source}.{name}"


def violations(root: Path) -> tuple[list[str], list[str]]:
    files = [path for package in PACKAGES for path in python_files(root / package)]
    sections = [found for path in files for found in numpy_sections(path)]
    private = [found for path in files for found in private_imports(path, root)]
    return sections, private


def test_no_numpy_style_docstring_sections() -> None:
    sections, _ = violations(SRC)
    assert sections == [], "numpy-style sections (use Google style: Args:, Returns:, Raises:):\n" + "\n".join(sections)


def test_no_private_names_imported_across_modules() -> None:
    _, private = violations(SRC)
    assert private == [], "private names imported from another module (make them public):\n" + "\n".join(private)


def test_the_checks_catch_each_violation(tmp_path: Path) -> None:
    """Each violation seeded once in a throwaway package is found; the allowed forms are not."""
    pkg = tmp_path / PACKAGE
    (pkg / "a").mkdir(parents=True)
    (pkg / "__init__.py").write_text('"""Package."""\nfrom ripplekv.version import __version__\n')
    (pkg / "version.py").write_text('__version__ = "0"\n')
    (pkg / "a" / "__init__.py").write_text("")
    (pkg / "a" / "b.py").write_text(
        '"""Module."""\n\n\ndef _c():\n    pass\n\n\n'
        "def f(x):\n"
        '    """Do.\n\n    Parameters\n    ----------\n    x : int\n        The x.\n    """\n'
        "\n\nclass K:\n"
        '    """K.\n\n    Returns\n    -------\n    int\n    """\n'
        "\n\ndef g(x):\n"
        '    """Google style is fine.\n\n    Args:\n        x: the x.\n\n    Returns:\n        Its double.\n    """\n'
        "    # a comment ruler is fine too\n    # ----------\n    return 2 * x\n"
    )
    (pkg / "a" / "d.py").write_text(
        "from ripplekv.a.b import _c\n"  # a private name from another module
        "from .b import _c as c2\n"  # the same, relative
        "from ripplekv.a.b import f as _f\n"  # a public name under a private alias: allowed
        "from ripplekv.version import __version__\n"  # a dunder: allowed
        "from os.path import _get_sep\n"  # not ripplekv's: allowed
    )
    (pkg / "a" / "e.py").write_text("def _own():\n    pass\n\n\nfrom ripplekv.a.e import _own as again\n")
    sections, private = violations(tmp_path)
    assert sections == ["b.py:11: Parameters", "b.py:21: Returns"]
    assert private == ["ripplekv.a.d imports ripplekv.a.b._c", "ripplekv.a.d imports ripplekv.a.b._c"]
