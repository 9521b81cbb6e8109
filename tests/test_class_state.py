"""Every class of the library code declares its instance state in ``__init__``.

An attribute a method sets on ``self`` must have been assigned in ``__init__`` first (even if to None): what an
object holds is then read in one place, and no attribute exists only after some method ran. A dataclass, a
``msgspec.Struct`` or a ``NamedTuple`` declares its fields in its body; a class declares what its base classes
(of the same package) declare. Checked from the source with ``ast``: ``self.x = ...``, ``self.x += ...``,
``self.x: T = ...``, tuple targets, ``setattr(self, "x", ...)``, also inside functions nested in a method (they
run later).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ["config", "providers", "planner", "launcher", "runtime", "collector"]
"""Packages whose library code (``packages/<name>/src``) is checked; add one once it passes."""

FIELD_BASES = {"Struct", "NamedTuple", "TypedDict", "Protocol"}
"""Base classes whose subclasses declare their fields as annotations in the class body."""
FIELD_DECORATORS = {"dataclass", "attrs", "define", "frozen"}


@dataclass(frozen=True, slots=True)
class ClassInfo:
    node: ast.ClassDef
    path: Path


def _name(node: ast.expr) -> str:
    """The last name of ``a``, ``a.b`` or ``a.b(...)`` / ``a[...]``."""
    if isinstance(node, ast.Call):
        return _name(node.func)
    if isinstance(node, ast.Subscript):
        return _name(node.value)
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""


def _declares_fields(cls: ast.ClassDef) -> bool:
    return any(_name(d) in FIELD_DECORATORS for d in cls.decorator_list) or any(
        _name(b) in FIELD_BASES for b in cls.bases
    )


def _methods(cls: ast.ClassDef) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            yield stmt


def _self_name(method: ast.FunctionDef | ast.AsyncFunctionDef) -> str | None:
    """The name of the instance argument, None for static and class methods."""
    if any(_name(d) in {"staticmethod", "classmethod"} for d in method.decorator_list):
        return None
    args = [*method.args.posonlyargs, *method.args.args]
    return args[0].arg if args else None


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """Every node below ``node``, nested functions included, nested classes (their own ``self``) not."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            continue
        yield child
        yield from _walk(child)


def _targets(node: ast.AST) -> list[ast.expr]:
    if isinstance(node, ast.Assign):
        return list(node.targets)
    if isinstance(node, ast.AugAssign | ast.AnnAssign):
        return [node.target]
    if isinstance(node, ast.NamedExpr):
        return [node.target]
    if isinstance(node, ast.For | ast.AsyncFor):
        return [node.target]
    if isinstance(node, ast.withitem) and node.optional_vars is not None:
        return [node.optional_vars]
    return []


def _flatten(target: ast.expr) -> Iterator[ast.expr]:
    if isinstance(target, ast.Tuple | ast.List):
        for elt in target.elts:
            yield from _flatten(elt)
    elif isinstance(target, ast.Starred):
        yield from _flatten(target.value)
    else:
        yield target


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def assigned(node: ast.AST, self_name: str, *, nested: bool) -> Iterator[tuple[str, int]]:
    """``(attribute, line)`` of every assignment to ``self_name.<attribute>`` in ``node``'s body: with
    ``nested``, inside nested functions too, else only the statements that run when ``node`` does."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.ClassDef):
            continue
        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) and not nested:
            continue
        for target in (t for raw in _targets(child) for t in _flatten(raw)):
            if isinstance(target, ast.Attribute) and _is_name(target.value, self_name):
                yield target.attr, target.lineno
        if (
            isinstance(child, ast.Call)
            and isinstance(child.func, ast.Name)
            and child.func.id == "setattr"
            and len(child.args) >= 2
            and _is_name(child.args[0], self_name)
        ):
            attr = child.args[1]
            yield (attr.value if isinstance(attr, ast.Constant) and isinstance(attr.value, str) else "?"), child.lineno
        yield from assigned(child, self_name, nested=nested)


INIT = {"__init__", "__post_init__"}
"""What runs when an object is made (a dataclass's generated ``__init__`` calls ``__post_init__``)."""


def _own_declared(cls: ast.ClassDef) -> set[str]:
    declared: set[str] = set()
    if _declares_fields(cls) and not any(m.name == "__init__" for m in _methods(cls)):
        for stmt in cls.body:
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                declared.add(stmt.target.id)
    for method in _methods(cls):
        self_name = _self_name(method)
        if method.name in INIT and self_name is not None:
            declared.update(attr for attr, _ in assigned(method, self_name, nested=False))
    return declared


def _classes(src: Path) -> dict[str, list[ClassInfo]]:
    found: dict[str, list[ClassInfo]] = {}
    for path in sorted(src.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(ClassInfo(node, path))
    return found


def _declared(info: ClassInfo, classes: dict[str, list[ClassInfo]], seen: frozenset[str] = frozenset()) -> set[str]:
    """What ``info``'s class declares, with what its base classes of the same package declare."""
    declared = _own_declared(info.node)
    for base in info.node.bases:
        name = _name(base)
        if name in seen:
            continue
        for parent in classes.get(name, []):
            declared |= _declared(parent, classes, seen | {info.node.name})
    return declared


def violations(src: Path) -> list[str]:
    """``file:line: Class.method sets self.attr, which __init__ does not declare`` for every class under ``src``."""
    classes = _classes(src)
    found: list[str] = []
    for infos in classes.values():
        for info in infos:
            declared = _declared(info, classes)
            for method in _methods(info.node):
                self_name = _self_name(method)
                if self_name is None:
                    continue
                # In __init__ itself only what nested functions set (they run later) can be undeclared.
                late = method.name in INIT
                walk = _walk(method) if late else [method]
                seen: set[tuple[str, int]] = set()
                for scope in walk:
                    if late and not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
                        continue
                    for attr, line in assigned(scope, self_name, nested=True):
                        if attr in declared or (attr, line) in seen:
                            continue
                        seen.add((attr, line))
                        rel = info.path.relative_to(REPO) if info.path.is_relative_to(REPO) else info.path
                        found.append(
                            f"{rel}:{line}: {info.node.name}.{method.name} sets {self_name}.{attr}, "
                            "which __init__ does not declare"
                        )
    return sorted(found)


@pytest.mark.parametrize("package", PACKAGES)
def test_every_attribute_is_declared_in_init(package: str) -> None:
    src = REPO / "packages" / package / "src"
    assert src.is_dir(), src
    found = violations(src)
    assert not found, "instance state set outside __init__:\n" + "\n".join(found)


def test_the_checker_sees_every_kind_of_late_assignment(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text(
        "from dataclasses import dataclass\n"
        "import msgspec\n"
        "class A:\n"
        "    def __init__(self):\n"
        "        self.a = None\n"
        "        self.b: int = 0\n"
        "        self.c, (self.d, *self.e) = 1, (2, 3)\n"
        "        def later():\n"
        "            self.f = 1\n"  # line 9: runs after __init__
        "    def ok(self):\n"
        "        self.a = 1\n"
        "        self.b += 1\n"
        "        self.a.x = 2\n"  # an attribute of another object
        "    def bad(self):\n"
        "        self.g = 1\n"  # 15
        "        self.h += 1\n"  # 16
        "        self.i: int = 2\n"  # 17
        "        self.a, self.j = 1, 2\n"  # 18
        "        setattr(self, 'k', 3)\n"  # 19
        "        for self.m in []: pass\n"  # 20
        "        def inner():\n"
        "            self.n = 1\n"  # 22
        "    @staticmethod\n"
        "    def s(self):\n"
        "        self.x = 1\n"
        "class B(A):\n"
        "    def more(self):\n"
        "        self.a = 3\n"  # declared by A
        "        self.o = 4\n"  # 29
        "@dataclass\n"
        "class C:\n"
        "    p: int = 0\n"
        "    def set(self):\n"
        "        self.p = 1\n"
        "        self.q = 2\n"  # 35
        "class D(msgspec.Struct):\n"
        "    r: int\n"
        "    def set(self):\n"
        "        self.r = 1\n"
        "class E:\n"
        "    def __init__(me):\n"
        "        me.t = 1\n"
        "    def set(me):\n"
        "        me.t = 2\n"
        "        me.u = 3\n"  # 45
        "@dataclass\n"
        "class F:\n"
        "    v: int = 0\n"
        "    def __post_init__(self):\n"
        "        self.w = 1\n"
        "    def set(self):\n"
        "        self.v, self.w = 1, 2\n"
        "@dataclass\n"
        "class G:\n"
        "    x: int = 0\n"
        "    def __init__(self):\n"
        "        pass\n"
        "    def set(self):\n"
        "        self.x = 1\n"  # 59: its own __init__ does not assign the field
    )
    found = {(int(v.split(":")[1]), v.split(" sets ")[1].split(",")[0]) for v in violations(tmp_path)}
    assert found == {
        (9, "self.f"),
        (15, "self.g"),
        (16, "self.h"),
        (17, "self.i"),
        (18, "self.j"),
        (19, "self.k"),
        (20, "self.m"),
        (22, "self.n"),
        (29, "self.o"),
        (35, "self.q"),
        (45, "me.u"),
        (59, "self.x"),
    }
