"""The package stays readable: no function longer than a screen and a half (80 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvlab

MAX_FUNCTION_LINES = 80


def test_no_function_in_the_package_is_longer_than_80_lines():
    root = Path(kvlab.__file__).parent
    long = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    long.append(f"{path.relative_to(root)}:{node.lineno} {node.name} ({length} lines)")
    assert not long, "functions longer than 80 lines:\n" + "\n".join(long)
