"""A kernel's source, derived from its module's imports so it cannot drift.

:func:`source_files` is the kernel module plus every module under kernels/ it imports,
transitively (read from the AST: ``import kernels.x``, ``from kernels import x``,
``from kernels.x import y``, and ``kernels.x.y`` too where ``kernels.x`` is a package):
emit's file_dep, and the source hash a seal pins.
:func:`check_hash` covers what decides a verify verdict besides the PTX: the kernel's
input generator and reference, the functions of its module they call, and the
source closure of the other modules they use; an edit elsewhere in the kernel
module (its emitter) does not re-run verify.

Both hash meaning, not text (:func:`code_sha256`): the code's syntax tree without
docstrings, line numbers or comments (the tokenizer drops those before the tree is
built), so an edit to the prose leaves every seal fresh and only a change that can
alter the PTX, the launch or the reference stales one. Emit still re-runs on any
byte of change (its file_dep), and finds the same PTX.
"""
from __future__ import annotations

import ast
import functools
import importlib.util
import inspect
import types
from pathlib import Path
from typing import Any, Callable, Iterator

from kernels.spec import KernelSpec
from pipeline.core.artifacts import rel, sha256_bytes, sha256_file

PACKAGE = "kernels"


def module_file(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise ImportError(f"module '{name}' not found")
    return Path(found.origin)


def is_package(name: str) -> bool:
    """``name`` is a package (its submodules can be imported from it by name)."""
    found = importlib.util.find_spec(name)
    return found is not None and found.submodule_search_locations is not None


@functools.lru_cache(maxsize=None)
def imported_modules(path: Path) -> frozenset[str]:
    """The kernels/ modules ``path`` imports (anywhere in the file)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith(f"{PACKAGE}."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(f"{PACKAGE}."):
                names.add(node.module)
            if node.module == PACKAGE or (node.module.startswith(f"{PACKAGE}.") and is_package(node.module)):
                # from kernels import x, from kernels.tile import x: x may be a module
                names.update(f"{node.module}.{a.name}" for a in node.names
                             if importlib.util.find_spec(f"{node.module}.{a.name}") is not None)
    return frozenset(names)


@functools.lru_cache(maxsize=None)
def closure(module: str) -> tuple[Path, ...]:
    """``module``'s file and the files of every kernels/ module it imports, transitively."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen[name] = module_file(name)
            todo.extend(imported_modules(seen[name]) - set(seen))
    return tuple(sorted(set(seen.values())))


def source_files(spec: KernelSpec) -> list[Path]:
    """The files that define ``spec``: its module and the kernels/ modules it imports."""
    return list(closure(spec.module))


def without_docstrings(tree: ast.AST) -> ast.AST:
    """``tree`` with the docstring of every module, class and function taken out (in place)."""
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                node.body = node.body[1:] or [ast.Pass()]
    return tree


def code_text_sha256(text: str, filename: str = "<source>") -> str:
    """sha256 of what ``text`` means as Python: its syntax tree without docstrings, comments
    or positions. Text that does not parse on its own (a lambda cut out of a longer
    expression) is hashed as it is."""
    try:
        tree = ast.parse(inspect.cleandoc(text) if text[:1].isspace() else text, filename=filename)
    except SyntaxError:
        return sha256_bytes(text.encode())
    return sha256_bytes(ast.dump(without_docstrings(tree), include_attributes=False).encode())


@functools.lru_cache(maxsize=None)
def _code_sha256(path: Path, content_sha256: str) -> str:
    return code_text_sha256(path.read_text(), str(path))


def code_sha256(path: Path) -> str:
    """:func:`code_text_sha256` of a file, parsed once per content (the file's byte hash
    keys the cache, so an edit is always seen)."""
    return _code_sha256(path, sha256_file(path))


def source_sha256(spec: KernelSpec) -> str:
    """One hash over the kernel's source files (relative path + code hash each): the kernel's
    source identity, which a seal pins."""
    parts = [f"{rel(path)}\0{code_sha256(path)}\n" for path in source_files(spec)]
    return sha256_bytes("".join(parts).encode())


def code_names(code: types.CodeType) -> Iterator[str]:
    """Global names a function's code (and the code nested in it) refers to."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from code_names(const)


def _used_by(fn: Callable[..., Any], home: str, functions: dict[str, str], modules: set[str]) -> None:
    """Record ``fn``'s source and, through its globals, what it uses: functions of ``home``
    recursively, other kernels/ modules by name."""
    key = getattr(fn, "__qualname__", repr(fn))
    if key in functions:
        return
    functions[key] = code_text_sha256(inspect.getsource(fn))
    for name in code_names(fn.__code__):
        value = fn.__globals__.get(name)
        owner = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
        if not isinstance(owner, str) or not owner.startswith(f"{PACKAGE}."):
            continue
        if owner == home and isinstance(value, types.FunctionType):
            _used_by(value, home, functions, modules)
        elif owner != home:
            modules.add(owner)


def check_hash(spec: KernelSpec) -> str:
    """sha256 of the code that decides a verify verdict besides the PTX (see the module
    docstring). A change there re-runs the verify cells even when the PTX bytes did not."""
    functions: dict[str, str] = {}
    modules: set[str] = set()
    for fn in (spec.make_inputs, spec.reference):
        _used_by(fn, spec.module, functions, modules)
    files = sorted({path for module in modules for path in closure(module)})
    parts = [functions[k] for k in sorted(functions)] + [f"{rel(p)}\0{code_sha256(p)}" for p in files]
    return sha256_bytes("\n".join(parts).encode())
