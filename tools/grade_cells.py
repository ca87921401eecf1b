"""Which cells of a lesson `make grade` runs: the answers, the checks, and what they read.

A graded lesson runs only what its exercises need, not every experiment of the lesson: for
every name a needed cell reads, the cell before it that assigns the name, and the cells in
between that change it without launching anything, and so on; plus the setup cells.
"""

from __future__ import annotations

import ast
import builtins
import re

from tools.course import LAUNCHES
from tools.exercises import WRITEFILE

KERNEL_NAMES = set(dir(builtins)) | {"get_ipython", "display", "In", "Out", "exit", "quit"}
SETUP = re.compile(r"^\s*(import |from \S+ import )|sys\.path|os\.environ|os\.chdir|warnings\.|"
                   r"manual_seed|set_num_threads|%matplotlib", re.M)


def python_of(source: str) -> str:
    """A cell as Python (IPython's magics turned into calls)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(source)


def names(source: str) -> tuple[set[str], set[str], set[str]]:
    """(names a cell assigns, names it changes, names it reads from earlier cells), at
    the notebook's top level. A function's own arguments and locals, and a
    comprehension's variables, are none of them; nor is a name the cell assigns before it
    reads it. A method call or an item assignment on a name at the top level
    (`cluster.up()`, `os.environ["X"] = ...`, `sys.path.insert`) changes it; an import
    reads `sys` (its path decides what is found)."""
    try:
        tree = ast.parse(python_of(source))
    except SyntaxError:
        return set(), set(), set()
    writes, reads = set(), set()
    scopes = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
    comprehensions = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)

    def stored(nodes) -> set[str]:
        found = set()
        for node in nodes:
            for n in ast.walk(node):
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store):
                    found.add(n.id)
                elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    found.add(n.name)
                elif isinstance(n, ast.alias):
                    found.add((n.asname or n.name).split(".")[0])
        return found

    def visit(node, local):
        if isinstance(node, scopes):
            if not isinstance(node, ast.Lambda) and local is None:
                writes.add(node.name)
            a = node.args
            for default in getattr(node, "decorator_list", []) + a.defaults + [
                    d for d in a.kw_defaults if d is not None]:
                visit(default, local)
            body = node.body if isinstance(node.body, list) else [node.body]
            inner = set(local or ()) | {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs}
            inner |= {x.arg for x in (a.vararg, a.kwarg) if x} | stored(body)
            for statement in body:
                visit(statement, inner)
            return
        if isinstance(node, comprehensions):
            inner = set(local or ()) | stored(g.target for g in node.generators)
            for child in ast.iter_child_nodes(node):
                visit(child, inner)
            return
        if isinstance(node, ast.ClassDef) and local is None:
            writes.add(node.name)
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Store):
                if local is None:
                    writes.add(node.id)
            elif local is None or node.id not in local:
                reads.add(node.id)
        elif isinstance(node, ast.alias) and local is None:
            writes.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            reads.add("sys")
        for child in ast.iter_child_nodes(node):
            visit(child, local)

    visit(tree, None)
    # A name the cell assigns itself is its own (`for name in ...` reads the loop's name,
    # not an earlier cell's), but for `x += 1`, which reads the earlier x.
    reads -= writes
    reads |= {n.target.id for n in tree.body
              if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
    changes = set()
    for statement in tree.body:  # mutations at the top level
        targets = []
        if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call):
            targets = [statement.value.func]  # `cluster.up()`, `sys.path.insert(...)`
        elif isinstance(statement, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            targets = getattr(statement, "targets", None) or [statement.target]
        for target in targets:
            if not isinstance(target, (ast.Attribute, ast.Subscript)):
                continue
            while isinstance(target, (ast.Attribute, ast.Subscript, ast.Call)):
                target = target.func if isinstance(target, ast.Call) else target.value
            if isinstance(target, ast.Name):
                changes.add(target.id)
    return writes, changes - KERNEL_NAMES, reads - KERNEL_NAMES


def launches(source: str) -> bool:
    return bool(LAUNCHES.search(source)) or "subprocess" in source or bool(
        re.search(r"^\s*!", source, re.M))


def needed_cells(sources: list[str], required: set[int], setup: bool = True) -> set[int]:
    """The cells (indices into `sources`, in execution order) that the `required` ones
    need: for every name a needed cell reads, the last cell before it that assigns it,
    and the cells between that change it without launching anything (`cluster.up()`,
    not a demonstration `cluster.srun(...)`), and so on. Setup cells (imports, sys.path,
    environment variables) are added too, with what they need, unless that is a launch."""
    found = [names(s) for s in sources]
    launching = [launches(s) for s in sources]

    def writers(name: str, before: int) -> list[int]:
        assigned = next((j for j in range(before - 1, -1, -1) if name in found[j][0]), -1)
        changed = [j for j in range(assigned + 1, before)
                   if name in found[j][1] and not launching[j]]
        return ([assigned] if assigned >= 0 else []) + changed

    def closure(start: set[int]) -> set[int]:
        done, todo = set(), list(start)
        while todo:
            i = todo.pop()
            if i in done:
                continue
            done.add(i)
            for name in found[i][2]:
                todo += writers(name, i)
        return done

    needed = closure(required)
    for i, source in enumerate(sources):
        if setup and i not in needed and SETUP.search(source) and not WRITEFILE.match(source):
            extra = closure({i})
            if not any(launching[j] for j in extra - needed):
                needed |= extra
    return needed
