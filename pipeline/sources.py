"""A kernel's source, derived from its module's imports so it cannot drift.

:func:`source_files` is the kernel module plus every module under kernels/ it imports,
transitively (read from the AST: ``import kernels.x``, ``from kernels import x``,
``from kernels.x import y``): emit's file_dep, and the source hash a seal pins.
:func:`check_hash` covers what decides a verify verdict besides the PTX: the kernel's
input generator and reference, the functions of its module they call, and the
source closure of the other modules they use; an edit elsewhere in the kernel
module (its emitter, a comment) does not re-run verify.
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
from pipeline.artifacts import rel, sha256_bytes, sha256_file

PACKAGE = "kernels"


def module_file(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise ImportError(f"module '{name}' not found")
    return Path(found.origin)


@functools.lru_cache(maxsize=None)
def imported_modules(path: Path) -> frozenset[str]:
    """The kernels/ modules ``path`` imports (anywhere in the file)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith(f"{PACKAGE}."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == PACKAGE:  # from kernels import x: x is a module
                names.update(f"{PACKAGE}.{a.name}" for a in node.names
                             if importlib.util.find_spec(f"{PACKAGE}.{a.name}") is not None)
            elif node.module.startswith(f"{PACKAGE}."):
                names.add(node.module)
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


def source_sha256(spec: KernelSpec) -> str:
    """One hash over the kernel's source files (relative path + content each): the kernel's
    source identity, which a seal pins."""
    parts = [f"{rel(path)}\0{sha256_file(path)}\n" for path in source_files(spec)]
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
    functions[key] = inspect.getsource(fn)
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
    parts = [functions[k] for k in sorted(functions)] + [f"{rel(p)}\0{sha256_file(p)}" for p in files]
    return sha256_bytes("\n".join(parts).encode())
