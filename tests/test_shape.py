"""The shape docs/architecture.md draws, kept: functions that fit on a screen, and no import inside a function
that reaches into ringexp (such an import only hides a circle; the layers contract in pyproject.toml, checked by
lint-imports, keeps the imports at the top pointing down)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = (ROOT / "ringexp", ROOT / "studies")
MAX_LINES = 50


def functions():
    for path in sorted(p for package in PACKAGES for p in package.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield path.relative_to(ROOT), node


def test_no_function_is_longer_than_a_screen():
    long = [(str(p), f.name, f.end_lineno - f.lineno + 1) for p, f in functions()
            if f.end_lineno - f.lineno + 1 > MAX_LINES]
    assert not long, long


def test_no_function_imports_ringexp():
    inside = [(str(p), f.name, ast.unparse(n)) for p, f in functions() for n in ast.walk(f)
              if isinstance(n, ast.Import | ast.ImportFrom)
              and any(name.startswith("ringexp") for name in
                      ([n.module or ""] if isinstance(n, ast.ImportFrom) else [a.name for a in n.names]))]
    assert not inside, inside
