"""A failed check in a lesson says what it compared, in JupyterLab and in `make course`:
pytest's assertion rewriting (as `make grade` applies it to its checks), run by the lesson's
kernel on every cell through IPython's AST transformers.

    assert ranks == 2                 # before: AssertionError
                                      # after:  AssertionError: assert 3 == 2

`tools/launch.py`, which every lesson imports, registers it when it runs in an IPython
kernel; elsewhere (a script, a test) nothing changes.
"""

from __future__ import annotations

import ast


class RewriteAsserts(ast.NodeTransformer):
    """IPython calls `visit` with each cell's module before it compiles it."""

    def visit(self, node):
        if not isinstance(node, ast.Module) or not any(
                isinstance(n, ast.Assert) for n in ast.walk(node)):
            return node
        try:
            from _pytest.assertion.rewrite import rewrite_asserts
        except ImportError:  # pytest is not installed: plain asserts still work
            return node
        rewrite_asserts(node, b"", None, None)  # in place; adds its own imports first
        for n in ast.walk(node):  # its imports have a line but no end line: IPython's
            if getattr(n, "lineno", None) is None:  # fix_missing_locations would give them
                continue                            # line 1, before a cell's comment lines
            if getattr(n, "end_lineno", None) is None or n.end_lineno < n.lineno:
                n.end_lineno, n.end_col_offset = n.lineno, n.col_offset
        return node


def register(shell=None) -> bool:
    """Add the rewriting to `shell` (the running IPython, if any), once. True if added."""
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:
            return False
        shell = get_ipython()
    if shell is None or any(isinstance(t, RewriteAsserts) for t in shell.ast_transformers):
        return False
    shell.ast_transformers.append(RewriteAsserts())
    return True
