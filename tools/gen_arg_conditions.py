"""The stack's own argument conditions, read with ``ast`` from the locked wheels (used by tools/gen_key_catalog.py).

A *condition* is an ``if`` (or nested ``if``s) of the stack's argument checks whose body raises, written entirely of
atoms about argument fields compared with literals and joined by ``and``:

    if self.dataloader_num_workers == 0 and self.dataloader_prefetch_factor is not None: raise ValueError("...")
    if self.finetuning_type != "lora":
        if self.use_dora: raise ValueError("`use_dora` is only valid for LoRA training.")
    if model_args.infer_backend != EngineName.HF: raise ValueError("vLLM/SGLang backend is only ...")
    if self.image_max_pixels < self.image_min_pixels: raise ValueError("`image_max_pixels` cannot be smaller ...")

A comparison of two fields becomes ``(field, "field <", other_field)``: the op names the other operand a field.

Each becomes ``((field, op, literal), ...), message`` in catalog_data.ARG_CONDITIONS; ``lf.conditions``
(core/recipe/rules_stack.py) evaluates them on the recipe's values (or the dataclass defaults). Anything else in a
test (a call, ``or``, a property such as ``parallel_mode``) leaves the condition out, and
so does a field the stack rewrites before it checks (``self.warmup_steps = self.warmup_ratio``): only what can be
decided from the recipe's text as the stack receives it is kept.
"""

from __future__ import annotations

import ast
from typing import Any

# get_train_args / _verify_model_args name the parsed argument objects like this
ARG_OBJECTS = ("self", "model_args", "data_args", "training_args", "finetuning_args", "generating_args")
_CMP = {ast.Eq: "==", ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.Gt: ">", ast.Lt: "<", ast.GtE: ">=",
        ast.LtE: "<="}

Atom = tuple[str, str, Any]


class _NotAtom(Exception):
    pass


def _field(node: ast.AST, fields: set[str]) -> str:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ARG_OBJECTS \
            and node.attr in fields:
        return node.attr
    raise _NotAtom


def _literal(node: ast.AST, members: dict[str, dict[str, Any]]) -> Any:
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):   # Enum.MEMBER
        value = members.get(node.value.id, {}).get(node.attr, _NotAtom)
        if value is _NotAtom:
            raise _NotAtom
        return value
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return tuple(_literal(e, members) for e in node.elts)
    try:
        return ast.literal_eval(node)
    except ValueError as err:
        raise _NotAtom from err


def _atoms(test: ast.AST, fields: set[str], members: dict[str, dict[str, Any]]) -> list[Atom]:
    """``a and b and ...`` of atoms, or _NotAtom."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return [a for v in test.values for a in _atoms(v, fields, members)]
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return [(_field(test.operand, fields), "falsy", None)]
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        f, op, right = _field(test.left, fields), test.ops[0], test.comparators[0]
        if isinstance(op, (ast.Is, ast.IsNot)) and isinstance(right, ast.Constant) and right.value is None:
            return [(f, "is None" if isinstance(op, ast.Is) else "is not None", None)]
        if type(op) in _CMP:
            try:
                return [(f, "field " + _CMP[type(op)], _field(right, fields))]
            except _NotAtom:
                return [(f, _CMP[type(op)], _literal(right, members))]
        raise _NotAtom
    return [(_field(test, fields), "truthy", None)]


def _message(exc: ast.AST | None) -> str | None:
    """The raised exception's message: a constant, or an f-string whose field values become ``{field}``."""
    if not isinstance(exc, ast.Call) or not exc.args:
        return None
    arg = exc.args[0]
    if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
        return arg.value.replace("{", "{{").replace("}", "}}")
    if isinstance(arg, ast.JoinedStr):
        parts = []
        for v in arg.values:
            if isinstance(v, ast.Constant):
                parts.append(str(v.value).replace("{", "{{").replace("}", "}}"))
            elif isinstance(v, ast.FormattedValue) and isinstance(v.value, ast.Attribute):
                parts.append("{" + v.value.attr + "}")
            else:
                parts.append("...")
        return "".join(parts)
    return None


Condition = tuple[tuple[Atom, ...], str, str]   # (atoms, message, the function that raises it)


_NEGATED = {"==": "!=", "!=": "==", "in": "not in", "not in": "in", "<": ">=", ">=": "<", ">": "<=", "<=": ">",
            "truthy": "falsy", "falsy": "truthy", "is None": "is not None", "is not None": "is None"}


def _negated(atom: Atom) -> Atom:
    key, op, literal = atom
    if op.startswith("field "):
        return key, "field " + _NEGATED[op.removeprefix("field ")], literal
    return key, _NEGATED[op], literal


def _walk_ifs(body: list[ast.stmt], outer: list[Atom] | None, fields: set[str], members: dict[str, dict[str, Any]],
              out: list[Condition], fn: str) -> None:
    """Nested ``if``s (not their ``else``): each raising body under a conjunction of atoms is one condition; an
    ``assert`` of one atom raises when that atom does not hold (its negation, under the ``if``s around it)."""
    for st in body:
        if isinstance(st, ast.Assert) and outer is not None:
            try:
                test = _atoms(st.test, fields, members)
            except _NotAtom:
                continue
            msg = _message(ast.Call(func=ast.Name("AssertionError"), args=[st.msg], keywords=[])) if st.msg else None
            if len(test) == 1 and msg:
                out.append((tuple(outer + [_negated(test[0])]), msg, fn))
            continue
        if not isinstance(st, ast.If):
            continue
        atoms: list[Atom] | None
        try:
            atoms = None if outer is None else outer + _atoms(st.test, fields, members)
        except _NotAtom:
            atoms = None
        for raise_ in (s for s in st.body if isinstance(s, ast.Raise)):
            msg = _message(raise_.exc)
            if atoms and msg:
                out.append((tuple(atoms), msg, fn))
        _walk_ifs(st.body, atoms, fields, members, out, fn)


def conditions(source: str, functions: dict[str, str | tuple[str, ...] | None], fields: set[str],
               members: dict[str, dict[str, Any]]) -> list[Condition]:
    """The conditions of ``functions`` ({name: its class or classes, or None for a module function}) in
    ``source``."""
    out: list[Condition] = []
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            for fn in node.body:
                owners = functions.get(fn.name, ()) if isinstance(fn, ast.FunctionDef) else ()
                if isinstance(fn, ast.FunctionDef) and node.name in ((owners,) if isinstance(owners, str) else
                                                                     owners or ()):
                    _walk_ifs(fn.body, [], fields, members, out, f"{node.name}.{fn.name}")
        elif isinstance(node, ast.Module):
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.name in functions and functions[fn.name] is None:
                    _walk_ifs(fn.body, [], fields, members, out, fn.name)
    return out


def rewritten(source: str, enums: set[str]) -> set[str]:
    """Fields the code assigns (``obj.f = ...``), except converting the field's own value with an enum or split_arg
    (``self.f = E(self.f)``: the same text, checked exactly): conditions on them are not decidable from the recipe."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            continue
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for t in targets:
            if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id in ARG_OBJECTS):
                continue
            v = node.value
            same = isinstance(v, ast.Call) and isinstance(v.func, ast.Name) and (v.func.id in enums or
                                                                                  v.func.id == "split_arg") \
                and len(v.args) == 1 and isinstance(v.args[0], ast.Attribute) and v.args[0].attr == t.attr
            if not same or isinstance(node, ast.AugAssign):
                out.add(t.attr)
    return out


def metadata_choices(source: str, cls: str) -> dict[str, tuple[str, ...]]:
    """Dataclass fields of ``cls`` whose ``metadata`` lists ``choices`` as a literal list."""
    out: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for st in node.body:
            if not (isinstance(st, ast.AnnAssign) and isinstance(st.target, ast.Name) and isinstance(st.value, ast.Call)):
                continue
            for kw in st.value.keywords:
                if kw.arg == "metadata" and isinstance(kw.value, ast.Dict):
                    for k, v in zip(kw.value.keys, kw.value.values, strict=True):
                        if isinstance(k, ast.Constant) and k.value == "choices" and isinstance(v, ast.List):
                            try:
                                out[st.target.id] = tuple(ast.literal_eval(v))
                            except ValueError:
                                pass
    return out
