r"""AST rewrites for the source reducer that reach across a program: inlining calls, dropping dead code,
folding constant lookups, running a comprehension for its first item. Each ``Edit`` mutates the walk-ordered
node list of a fresh copy and says whether it applied (the reducer then checks the candidate).

Example:
    >>> import ast
    >>> tree = ast.parse("def f(a):\n    return a + 1\ny = f(2)\n")
    >>> call = [i for i, n in enumerate(ast.walk(tree)) if isinstance(n, ast.Call)][0]
    >>> function = [i for i, n in enumerate(ast.walk(tree)) if isinstance(n, ast.FunctionDef)][0]
    >>> inline_call(function, call)(list(ast.walk(tree)))
    True
    >>> print(ast.unparse(tree.body[1]))
    y = 2 + 1
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable

Edit = Callable[[list], bool]  # mutates the walk-ordered node list of a copy; False: not applicable


def inlinable(func: ast.FunctionDef, protected: ast.stmt | None) -> bool:
    """A plain function whose only ``return`` (if any) ends its body and that does not hold the protected statement."""
    spec = func.args
    if func.decorator_list or spec.vararg or spec.kwarg or spec.kwonlyargs or spec.posonlyargs:
        return False
    inner = [n for stmt in func.body for n in ast.walk(stmt)]
    if any(n is protected for n in inner) or any(
            isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await, ast.Global, ast.Nonlocal,
                           ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
            for n in inner):
        return False
    if any(isinstance(n, ast.Name) and n.id == func.name for n in inner):
        return False  # recursive
    returns = [n for n in inner if isinstance(n, ast.Return)]
    return not returns or (len(returns) == 1 and func.body[-1] is returns[0])


# Where a call may not be hoisted before its statement: evaluated lazily, repeatedly, or in its own scope.
_LAZY = (ast.Lambda, ast.IfExp, ast.BoolOp, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def inline_call(function: int, call_index: int) -> Edit:
    def edit(nodes: list) -> bool:
        func, call = nodes[function], nodes[call_index]
        binding = _bind_arguments(func, call)
        if binding is None:
            return False
        body = [copy.deepcopy(stmt) for stmt in func.body]
        if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)):
            body = body[1:]  # the docstring
        result = body.pop().value if body and isinstance(body[-1], ast.Return) else None
        result = result if result is not None else ast.Constant(None)
        if not body:  # a single ``return expr``: substitute the arguments into it, in place
            if any(isinstance(n, _LAZY) for n in ast.walk(result)) and any(
                    isinstance(n, ast.Name) and n.id in binding for n in ast.walk(result)):
                return False  # a lambda or comprehension could shadow a parameter: keep it simple
            expr = ast.Expr(result)
            holder = ast.Module(body=[expr], type_ignores=[])
            _substitute(holder, binding)
            return replace_node(nodes[0], call, expr.value)
        parents = parents_of(nodes[0])
        stmt, node = call, call
        while not isinstance(stmt, ast.stmt):
            node, stmt = stmt, parents.get(id(stmt))
            if stmt is None or isinstance(stmt, _LAZY):
                return False
        if isinstance(stmt, (ast.While, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) or (
                isinstance(stmt, (ast.If, ast.For))
                and node not in (getattr(stmt, "test", None), getattr(stmt, "iter", None))):
            return False
        owner = parents.get(id(stmt))
        field = next((f for f in ("body", "orelse", "finalbody")
                      if any(s is stmt for s in getattr(owner, f, None) or [])), None)
        if field is None:
            return False
        # Callee locals get fresh names where they would collide with a name already in use.
        own = {id(n) for n in ast.walk(func)}  # the callee's own names clash with nothing once it is inlined
        taken = {n.id if isinstance(n, ast.Name) else n.arg for n in ast.walk(nodes[0])
                 if isinstance(n, (ast.Name, ast.arg)) and id(n) not in own}
        stored = {n.id for s in body for n in ast.walk(s)
                  if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
        renames: dict[str, str] = {}
        for name in sorted(stored | set(binding)):
            simple = name in binding and name not in stored and isinstance(binding[name], (ast.Name, ast.Constant))
            if simple:
                continue
            fresh, k = name, 1
            while fresh in taken or fresh in renames.values():
                fresh, k = f"{name}{k}", k + 1
            renames[name] = fresh
        direct = {name: value for name, value in binding.items() if name not in renames}
        assigns = [ast.Assign(targets=[ast.Name(renames[name], ast.Store())], value=value, lineno=0)
                   for name, value in binding.items() if name in renames]
        tail = ast.Expr(result)
        holder = ast.Module(body=[*body, tail], type_ignores=[])
        _rename(holder, renames)
        _substitute(holder, direct)
        holder.body.pop()
        result = tail.value
        block = getattr(owner, field)
        at = next(i for i, s in enumerate(block) if s is stmt)
        if isinstance(stmt, ast.Expr) and stmt.value is call:
            block[at:at + 1] = assigns + holder.body  # the value is discarded
            return True
        block[at:at] = assigns + holder.body
        return replace_node(nodes[0], call, result)
    return edit


def inline_everywhere(function: int, sites: list[int]) -> Edit:
    """Inline every call (innermost first, so nested calls are done before their copies are made), drop the def."""
    def edit(nodes: list) -> bool:
        if not all(inline_call(function, site)(nodes) for site in reversed(sites)):
            return False
        func = nodes[function]
        for node in ast.walk(nodes[0]):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(node, field, None)
                if isinstance(block, list) and any(s is func for s in block):
                    block.remove(func)
                    return True
        return False
    return edit


def drop_unread_bindings(protected: int | None) -> Edit:
    def edit(nodes: list) -> bool:
        dropped = False
        while True:
            user = {n.name for n in ast.walk(nodes[0])
                    if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
            read = {n.id for n in ast.walk(nodes[0]) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
            read |= {n.value.id for n in ast.walk(nodes[0])
                     if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name)}
            found = False
            for node in ast.walk(nodes[0]):
                for field in ("body", "orelse", "finalbody"):
                    block = getattr(node, field, None)
                    if not isinstance(block, list):
                        continue
                    keep = [s for s in block
                            if not _binds_only_unread(s, read, user) or any(id(n) == protected for n in ast.walk(s))]
                    if len(keep) < len(block):
                        block[:] = keep
                        found = dropped = True
            if not found:
                return dropped
    return edit


def _binds_only_unread(stmt: ast.stmt, read: set[str], user: set[str]) -> bool:
    if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return stmt.name not in read
    if isinstance(stmt, (ast.Import, ast.ImportFrom)):
        return all((a.asname or a.name).split(".")[0] not in read and a.name != "*" for a in stmt.names)
    if isinstance(stmt, ast.Assign):
        names = [n for t in stmt.targets for n in ast.walk(t)]
        calls_user = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in user
                         for n in ast.walk(stmt.value))
        return (not calls_user and all(isinstance(n, (ast.Name, ast.Tuple, ast.List, ast.Store)) for n in names)
                and not any(isinstance(n, ast.Name) and n.id in read for n in names))
    return False


def drop_unlooked_entries(frozen: set[int]) -> Edit:
    def edit(nodes: list) -> bool:
        looked = {n.slice.value for n in nodes if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Constant)}
        looked |= {k.arg for n in nodes if isinstance(n, ast.Call) for k in n.keywords}
        dropped = False
        for node in nodes:
            if (isinstance(node, ast.Dict) and id(node) not in frozen
                    and all(isinstance(k, ast.Constant) for k in node.keys)):
                keep = [(k, v) for k, v in zip(node.keys, node.values)
                        if isinstance(k, ast.Constant) and k.value in looked]
                if len(keep) < len(node.keys):
                    node.keys[:], node.values[:] = [k for k, _ in keep], [v for _, v in keep]
                    dropped = True
        return dropped
    return edit


def _bind_arguments(func: ast.FunctionDef, call: ast.Call) -> dict[str, ast.expr] | None:
    """Parameter name -> argument expression (or default) for ``call``; None when it cannot be bound statically."""
    params = [a.arg for a in func.args.args]
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    if len(call.args) > len(params):
        return None
    binding = dict(zip(params, call.args))
    for keyword in call.keywords:
        if keyword.arg not in params or keyword.arg in binding:
            return None
        binding[keyword.arg] = keyword.value
    defaults = dict(zip(params[len(params) - len(func.args.defaults):], func.args.defaults))
    for name in params:
        if name not in binding:
            if name not in defaults:
                return None
            binding[name] = defaults[name]
    return {name: copy.deepcopy(binding[name]) for name in params}


def _substitute(tree: ast.AST, values: dict[str, ast.expr]) -> None:
    """Every read of a name in ``values`` becomes a copy of its expression."""
    for node in ast.walk(tree):
        for field, old in ast.iter_fields(node):
            if isinstance(old, ast.Name) and old.id in values and isinstance(old.ctx, ast.Load):
                setattr(node, field, copy.deepcopy(values[old.id]))
            elif isinstance(old, list):
                for k, item in enumerate(old):
                    if isinstance(item, ast.Name) and item.id in values and isinstance(item.ctx, ast.Load):
                        old[k] = copy.deepcopy(values[item.id])


def _rename(tree: ast.AST, renames: dict[str, str]) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id in renames:
            node.id = renames[node.id]


def replace_node(root: ast.AST, old: ast.AST, new: ast.AST) -> bool:
    """Put ``new`` where ``old`` is in the (live) tree under ``root``."""
    for node in ast.walk(root):
        for field, value in ast.iter_fields(node):
            if value is old:
                setattr(node, field, new)
                return True
            if isinstance(value, list) and any(v is old for v in value):
                value[next(i for i, v in enumerate(value) if v is old)] = new
                return True
    return False


def name_stores(tree: ast.AST) -> dict[str, int]:
    """How many times each name is assigned (stored to) in ``tree``."""
    stores: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and not isinstance(node.ctx, ast.Load):
            stores[node.id] = stores.get(node.id, 0) + 1
    return stores


def constant_table(node: ast.AST) -> dict | None:
    """``{"a": 1, ...}`` or ``dict(a=1, ...)`` with literal keys: key -> value node."""
    if isinstance(node, ast.Dict) and all(isinstance(k, ast.Constant) for k in node.keys):
        return {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
    if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict" and not node.args
            and all(k.arg is not None for k in node.keywords)):
        return {k.arg: k.value for k in node.keywords}
    return None


def lookup_of(node: ast.AST, name: str) -> object | None:
    """The key of ``name[<constant>]`` read by ``node`` (None if it is not such a lookup)."""
    if (isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and isinstance(node.value, ast.Name)
            and node.value.id == name and isinstance(node.slice, ast.Constant)):
        return node.slice.value
    return None


def fold_lookups(assign: int, name: str) -> Edit:
    def edit(nodes: list) -> bool:
        table = constant_table(nodes[assign].value)
        folded = False
        for node in nodes:
            key = lookup_of(node, name)
            if key is not None and table is not None and key in table and is_literal(table[key]):
                folded |= replace_node(nodes[0], node, copy.deepcopy(table[key]))
        return folded
    return edit


def drop_defaults_edit(function: int) -> Edit:
    def edit(nodes: list) -> bool:
        nodes[function].args.defaults.clear()
        return True
    return edit


def is_constant(node: ast.AST) -> bool:
    """True when no name, call, attribute or subscript is involved (a literal, f-string of literals, ...)."""
    return not any(isinstance(n, (ast.Name, ast.Call, ast.Attribute, ast.Subscript, ast.NamedExpr, ast.Await))
                   for n in ast.walk(node))


def is_literal(node: ast.AST) -> bool:
    return is_constant(node) and isinstance(node, (ast.Constant, ast.Tuple, ast.UnaryOp, ast.BinOp, ast.List))


def parents_of(tree: ast.AST) -> dict[int, ast.AST]:
    return {id(child): node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def first_item(iterable: ast.expr) -> ast.expr:
    """An expression for the first item ``iterable`` yields: ``range(n)`` -> ``0``, ``[a, b]`` -> ``a``, else ``E[0]``
    (``list(E)[0]`` for a call, which may build an iterator); the reducer's test rejects a wrong guess."""
    if isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and iterable.func.id == "range" and (
            1 <= len(iterable.args) <= 3 and not iterable.keywords
            and not any(isinstance(a, ast.Starred) for a in iterable.args)):
        return copy.deepcopy(iterable.args[0]) if len(iterable.args) > 1 else ast.Constant(0)
    if (isinstance(iterable, (ast.List, ast.Tuple)) and iterable.elts
            and not any(isinstance(e, ast.Starred) for e in iterable.elts)):
        return copy.deepcopy(iterable.elts[0])
    if isinstance(iterable, ast.Call):
        iterable = ast.Call(ast.Name("list", ast.Load()), [copy.deepcopy(iterable)], [])
    return ast.Subscript(value=copy.deepcopy(iterable), slice=ast.Constant(0), ctx=ast.Load())


def first_binding(target: ast.expr, iterable: ast.expr) -> dict[str, ast.expr] | None:
    """Loop variable name(s) -> their value on the first iteration; None when that is not statically clear.

    ``for i in range(n)`` -> ``{i: 0}``; ``for i, x in enumerate(xs)`` -> ``{i: 0, x: xs[0]}``;
    ``for a, b in zip(as_, bs)`` -> ``{a: as_[0], b: bs[0]}``.
    """
    if isinstance(target, ast.Name):
        return {target.id: first_item(iterable)}
    if not (isinstance(target, ast.Tuple) and all(isinstance(e, ast.Name) for e in target.elts)
            and isinstance(iterable, ast.Call) and isinstance(iterable.func, ast.Name) and not iterable.keywords):
        return None
    names = [e.id for e in target.elts if isinstance(e, ast.Name)]
    if iterable.func.id == "enumerate" and len(iterable.args) == 1 and len(names) == 2:
        return {names[0]: ast.Constant(0), names[1]: first_item(iterable.args[0])}
    if (iterable.func.id == "zip" and len(iterable.args) == len(names)
            and not any(isinstance(a, ast.Starred) for a in iterable.args)):
        return {name: first_item(arg) for name, arg in zip(names, iterable.args)}
    return None


def single_iteration(comprehension: int) -> Edit:
    """``[f(i) for i in range(n)]`` -> ``[f(0)]`` (one generator, no ``if``; sets, dicts and generators alike)."""
    def edit(nodes: list) -> bool:
        node = nodes[comprehension]
        if len(node.generators) != 1 or node.generators[0].ifs or node.generators[0].is_async:
            return False
        binding = first_binding(node.generators[0].target, node.generators[0].iter)
        parts = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
        if binding is None or any(_rebinds(n, binding) for part in parts for n in ast.walk(part)):
            return False  # an inner lambda or comprehension shadows the loop variable: leave it
        values = ast.Tuple(parts, ast.Load())
        holder = ast.Module(body=[ast.Expr(values)], type_ignores=[])
        _substitute(holder, binding)
        parts = values.elts
        new: ast.expr
        if isinstance(node, ast.DictComp):
            new = ast.Dict(keys=[parts[0]], values=[parts[1]])
        elif isinstance(node, ast.SetComp):
            new = ast.Set(elts=parts)
        elif isinstance(node, ast.ListComp):
            new = ast.List(elts=parts, ctx=ast.Load())
        else:  # a generator: a one-item tuple iterates the same way
            new = ast.Tuple(elts=parts, ctx=ast.Load())
        return replace_node(nodes[0], node, new)
    return edit


def _rebinds(node: ast.AST, names: dict) -> bool:
    if isinstance(node, ast.Lambda):
        return any(a.arg in names for a in ast.walk(node.args) if isinstance(a, ast.arg))
    if isinstance(node, ast.comprehension):
        return any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(node.target))
    return isinstance(node, ast.NamedExpr) and node.target.id in names


def read_once_after(assign: ast.Assign, read: ast.Name, parents: dict[int, ast.AST]) -> bool:
    """True when ``read`` sits in a later statement of ``assign``'s own block, evaluated once (not in a loop,
    lambda, comprehension, nested function or lazily evaluated operand), and no name the value reads changes
    in between: moving the value there computes the same thing."""
    owner = parents.get(id(assign))
    node: ast.AST | None = read
    while node is not None:
        parent = parents.get(id(node))
        if parent is owner and isinstance(node, ast.stmt):
            block = next((b for b in (getattr(owner, f, None) for f in ("body", "orelse", "finalbody"))
                          if isinstance(b, list) and any(s is node for s in b)), None)
            if block is None or not any(s is assign for s in block):
                return False
            position = {id(s): i for i, s in enumerate(block)}
            start, stop = position[id(assign)], position[id(node)]
            # nothing the value reads may be rebound on the way (the read's own statement included)
            rebound = {n.id for s in block[start + 1:stop + 1] for n in ast.walk(s)
                       if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
            return stop > start and not rebound & {n.id for n in ast.walk(assign.value) if isinstance(n, ast.Name)}
        if isinstance(parent, (*_LAZY, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.While)) or (
                isinstance(parent, ast.For) and node is not parent.iter) or (
                isinstance(parent, ast.If) and node is not parent.test and parent is not owner):
            return False
        node = parent
    return False
