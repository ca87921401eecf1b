"""Asserts that cannot fail because they read nothing a run produced.

A lesson's check reads what a launch returned or what a cell measured. An assert whose every
name goes back, within the notebook, to literals (or to the `parameters` cell, or to
arithmetic on those) checks arithmetic, not the course's claim: `assert 245 % 2` holds
whatever the run did. `constant_asserts(nb)` lists them. An assert that is arithmetic on
purpose says so on its line: a comment with the word "arithmetic" (for example
`# arithmetic: the text's numbers from the formula`), or "parameters" for one that checks
the lesson's own settings.

How names are followed (a static reading, cell by cell, in order): a name is constant when
every assignment to it so far had a constant value; a value is constant when it is made of
literals, constant names, operators, subscripts, comprehensions over constants, and calls of
pure functions on constants: the builtins below, `math`'s, and the functions the notebook
defines whose bodies read only their arguments, constants and pure functions. Anything
imported, anything a `%%` magic or a launch made, and any call of another function is not
constant: it may read a run."""

from __future__ import annotations

import ast
import re

PURE_BUILTINS = {"abs", "all", "any", "bool", "dict", "divmod", "enumerate", "float", "int",
                 "len", "list", "max", "min", "pow", "range", "reversed", "round", "set",
                 "sorted", "str", "sum", "tuple", "zip", "isinstance", "frozenset"}
ON_PURPOSE = re.compile(r"#.*\b(arithmetic|parameters)\b")


class _Reader:
    def __init__(self):
        self.constant: dict[str, bool] = {}  # name -> every value so far was constant
        self.pure_functions: set[str] = set()

    # -- values -------------------------------------------------------------------------
    def is_constant(self, node, local: frozenset = frozenset()) -> bool:
        if isinstance(node, ast.Constant):
            return True
        if isinstance(node, ast.Name):
            return node.id in local or self.constant.get(node.id, False)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            return all(self.is_constant(e, local) for e in node.elts)
        if isinstance(node, ast.Dict):
            return all(self.is_constant(v, local) for v in [*node.keys, *node.values]
                       if v is not None)
        if isinstance(node, ast.BinOp):
            return self.is_constant(node.left, local) and self.is_constant(node.right, local)
        if isinstance(node, ast.UnaryOp):
            return self.is_constant(node.operand, local)
        if isinstance(node, ast.BoolOp):
            return all(self.is_constant(v, local) for v in node.values)
        if isinstance(node, ast.Compare):
            return all(self.is_constant(v, local) for v in [node.left, *node.comparators])
        if isinstance(node, ast.IfExp):
            return all(self.is_constant(v, local) for v in (node.test, node.body, node.orelse))
        if isinstance(node, ast.Subscript):
            return self.is_constant(node.value, local) and self.is_constant(node.slice, local)
        if isinstance(node, ast.Slice):
            return all(self.is_constant(v, local) for v in (node.lower, node.upper, node.step)
                       if v is not None)
        if isinstance(node, ast.JoinedStr):
            return all(self.is_constant(v, local) for v in node.values)
        if isinstance(node, ast.FormattedValue):
            return self.is_constant(node.value, local)
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)):
            bound = set(local)
            for gen in node.generators:
                if not self.is_constant(gen.iter, frozenset(bound)):
                    return False
                bound |= _targets(gen.target)
                if not all(self.is_constant(c, frozenset(bound)) for c in gen.ifs):
                    return False
            parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            return all(self.is_constant(p, frozenset(bound)) for p in parts)
        if isinstance(node, ast.Call):
            return self._pure(node.func, local) and all(
                self.is_constant(a, local) for a in
                [*node.args, *(k.value for k in node.keywords)])
        return False  # attributes of values, lambdas, awaits ...: not followed

    def _pure(self, func, local) -> bool:
        if isinstance(func, ast.Name):
            if func.id in self.pure_functions:
                return True
            return func.id in PURE_BUILTINS and func.id not in self.constant \
                and func.id not in local
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            return func.value.id == "math"
        return False

    # -- statements ---------------------------------------------------------------------
    def assign(self, targets, constant: bool) -> None:
        for name in targets:
            self.constant[name] = self.constant.get(name, True) and constant \
                if name in self.constant else constant

    def function(self, node: ast.FunctionDef) -> None:
        arguments = {a.arg for a in [*node.args.args, *node.args.kwonlyargs,
                                     *node.args.posonlyargs]}
        assigned = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)
                    and isinstance(n.ctx, ast.Store)}
        local = frozenset(arguments | assigned)
        reads = [n for n in ast.walk(node) if isinstance(n, ast.Name)
                 and isinstance(n.ctx, ast.Load) and n.id not in local]
        calls_ok = all(self._pure(c.func, local) or (isinstance(c.func, ast.Name)
                                                     and c.func.id in local)
                       for c in ast.walk(node) if isinstance(c, ast.Call))
        pure = calls_ok and all(self.constant.get(n.id, False) or n.id in PURE_BUILTINS
                                or n.id in self.pure_functions or n.id == "math"
                                for n in reads)
        self.constant[node.name] = False  # a function is not a value to check
        if pure:
            self.pure_functions.add(node.name)
        else:
            self.pure_functions.discard(node.name)


def _targets(target) -> set[str]:
    """The names an assignment target binds or changes: `a, b = ...` both, `d[k] = ...`
    and `o.x = ...` the object's."""
    if isinstance(target, ast.Name):
        return {target.id}
    if isinstance(target, (ast.Tuple, ast.List)):
        return set().union(*(_targets(e) for e in target.elts)) if target.elts else set()
    if isinstance(target, ast.Starred):
        return _targets(target.value)
    if isinstance(target, (ast.Subscript, ast.Attribute)):
        return _targets(target.value)
    return set()


def constant_asserts(nb) -> list[tuple[int, str]]:
    """(cell index, the assert's first line) for every assert in the lesson's code cells
    that reads nothing but constants (or one of whose `and`-ed parts does) and does not say
    it is arithmetic on purpose. A
    function an exercise's `solution` cell defines is the learner's answer: what it returns
    is never constant."""
    reader = _Reader()
    found = []
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code" or cell.source.lstrip().startswith("%%"):
            continue
        lines = cell.source.splitlines()
        source = "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line
                           for line in lines)
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        tags = cell.get("metadata", {}).get("tags", [])
        parameters, solution = "parameters" in tags, "solution" in tags
        for node, steady in _statements(tree.body, reader, True):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                reader.assign({(a.asname or a.name).split(".")[0] for a in node.names}, False)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                reader.function(node)
                if solution:
                    reader.pure_functions.discard(node.name)
            elif isinstance(node, ast.ClassDef):
                reader.assign({node.name}, False)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                value = node.value
                targets = set().union(*(_targets(t) for t in (
                    node.targets if isinstance(node, ast.Assign) else [node.target])))
                constant = steady and value is not None and (
                    parameters or reader.is_constant(value))
                if isinstance(node, ast.AugAssign):
                    constant = constant and all(reader.constant.get(t, False) for t in targets)
                reader.assign(targets, constant)
            elif isinstance(node, (ast.For, ast.AsyncFor)):
                reader.assign(_targets(node.target), steady and reader.is_constant(node.iter))
            elif isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    if item.optional_vars is not None:
                        reader.assign(_targets(item.optional_vars), False)
            elif isinstance(node, ast.ExceptHandler) and node.name:
                reader.assign({node.name}, False)
            elif isinstance(node, ast.Assert) and any(reader.is_constant(part) for part in (
                    node.test.values if isinstance(node.test, ast.BoolOp)
                    and isinstance(node.test.op, ast.And) else [node.test])):
                text = "\n".join(lines[node.lineno - 1:node.end_lineno])
                if not ON_PURPOSE.search(text):
                    found.append((index, lines[node.lineno - 1].strip()))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            for inner in ast.walk(node):
                if isinstance(inner, ast.NamedExpr):
                    reader.assign(_targets(inner.target), False)
                elif (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute)
                      and isinstance(inner.func.value, ast.Name)
                      and inner.func.value.id != "math"):
                    reader.assign({inner.func.value.id}, False)  # `rows.append(...)` may read a run
    return found


def _statements(body, reader, steady):
    """Every statement of a cell in order, with whether its running is decided by constants
    alone (`steady`): into the bodies of if/for/while/with/try, not into functions or
    classes (read as definitions). An assignment in a try, or under a test or a loop that
    reads a run, gets no constant value."""
    for node in body:
        yield node, steady
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        inner = steady
        if isinstance(node, (ast.If, ast.While)):
            inner = steady and reader.is_constant(node.test)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            inner = steady and reader.is_constant(node.iter)
        elif isinstance(node, ast.Try) or type(node).__name__ == "TryStar":
            inner = False
        for field in ("body", "orelse", "finalbody"):
            yield from _statements(getattr(node, field, []) or [], reader, inner)
        for handler in getattr(node, "handlers", []) or []:
            yield handler, False
            yield from _statements(handler.body, reader, False)
