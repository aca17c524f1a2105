"""A kernel's source, derived from its module's imports so it cannot drift.

:func:`source_files` is the kernel module plus every module of the package it imports,
transitively (read from the AST: ``import hslm_ptx.x``, ``from hslm_ptx import x``,
``from hslm_ptx.x import y``, and ``hslm_ptx.x.y`` too where ``hslm_ptx.x`` is a package):
emit's file_dep, and the source hash a seal pins.
:func:`check_hash` covers what decides a verify verdict besides the PTX: the kernel's
input generator and reference, the functions of its module they call, and the
source closure of the other modules they use; an edit elsewhere in the kernel
module (its emitter) does not re-run verify. Nor does an edit of the modules that only
score configurations (:data:`SCORING`: the cost model and the tile rule): what they
decide for a cell, its launch, is in the cell's inputs as data (its grid, block, shared
bytes and scalars), so a model edit that leaves every launch alone re-runs no cell, and
one that changes a launch re-runs exactly the cells whose launch changed.

Both hash meaning, not text (:func:`code_sha256`): the code's syntax tree without
docstrings, line numbers or comments (the tokenizer drops those before the tree is
built), so an edit to the prose leaves every seal fresh and only a change that can
alter the PTX, the launch or the reference stales one. Emit still re-runs on any
byte of change (its file_dep), and finds the same PTX.

Parsing is the costly part (every task creator asks, on every run), so what a file's
parse gave (its imports, its code hash) and each kernel's :func:`check_hash` are kept
across runs in :data:`MEMO_FILE`, keyed by the bytes they were computed from: the
sha256 of the file (for imports, also the list of package modules, which decides what
``from hslm_ptx.x import y`` names), and of every file of the kernel's source closure.
A run in which no source changed parses nothing.
"""
from __future__ import annotations

import ast
import atexit
import functools
import importlib.util
import inspect
import json
import types
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from pydantic import ValidationError

from hslm_ptx.kernel.spec import KernelSpec
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.files import rel, sha256_bytes, sha256_file, write_atomic
from hslm_ptx.pipeline.core.checker import content_sha256
from hslm_ptx.pipeline.core.models import Record

PACKAGE = "hslm_ptx"
MEMO_FILE = config.SOURCES_MEMO


class SourceMemo(Record):
    """What parsing gave, by the sha256 of what was parsed (see the module docstring)."""

    layout: str = ""  # sha256 of the package module list the ``imports`` were resolved against
    imports: dict[str, list[str]] = {}  # file sha256 -> the package modules it imports
    code: dict[str, str] = {}  # file sha256 -> code_text_sha256 of the file
    checks: dict[str, str] = {}  # "<kernel>:<closure sha256>" -> check_hash


class _Memo:
    """The memo of this process: read on first use, written once at exit when it grew.
    An unreadable memo is an empty one (it is only a cache: everything is recomputed)."""

    def __init__(self, path: Path = MEMO_FILE) -> None:
        self.path = Path(path)
        self.data: SourceMemo | None = None
        self.dirty = False

    def get(self) -> SourceMemo:
        if self.data is None:
            try:
                self.data = SourceMemo.model_validate(json.loads(self.path.read_text()))
            except (OSError, ValueError, ValidationError):
                self.data = SourceMemo()
            layout = sha256_bytes("\n".join(rel(p) for p in sorted(config.ROOT.glob(f"{PACKAGE}/**/*.py"))).encode())
            if self.data.layout != layout:
                self.data = SourceMemo(layout=layout, code=self.data.code, checks={})
            atexit.register(self.save)
        return self.data

    def put(self, field: str, key: str, value: Any) -> Any:
        getattr(self.get(), field)[key] = value
        self.dirty = True
        return value

    def save(self) -> None:
        if self.dirty and self.data is not None and self.path.parent.parent.is_dir():  # not after a clean
            self.path.parent.mkdir(exist_ok=True)
            write_atomic(self.path, self.data.model_dump_json() + "\n")
            self.dirty = False


MEMO = _Memo()


def module_file(name: str) -> Path:
    found = importlib.util.find_spec(name)
    if found is None or found.origin is None:
        raise ImportError(f"module '{name}' not found")
    return Path(found.origin)


def is_package(name: str) -> bool:
    """``name`` is a package (its submodules can be imported from it by name)."""
    found = importlib.util.find_spec(name)
    return found is not None and found.submodule_search_locations is not None


def imported_modules(path: Path) -> frozenset[str]:
    """The package modules ``path`` imports (anywhere in the file), parsed once per content."""
    digest = sha256_file(path)
    found = MEMO.get().imports.get(digest)
    if found is None:
        found = MEMO.put("imports", digest, sorted(parsed_imports(path)))
    return frozenset(found)


def parsed_imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names if a.name.startswith(f"{PACKAGE}."))
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module.startswith(f"{PACKAGE}."):
                names.add(node.module)
            if node.module == PACKAGE or (node.module.startswith(f"{PACKAGE}.") and is_package(node.module)):
                # from hslm_ptx import x, from hslm_ptx.tile import x: x may be a module
                names.update(f"{node.module}.{a.name}" for a in node.names
                             if importlib.util.find_spec(f"{node.module}.{a.name}") is not None)
    return names


SCORING = frozenset({"hslm_ptx.cost.model", "hslm_ptx.tile.rule"})  # they score launches; a verdict reads the launch


@functools.lru_cache(maxsize=None)
def closure(module: str, skip: frozenset[str] = frozenset()) -> tuple[Path, ...]:
    """``module``'s file and the files of every package module it imports, transitively,
    but for the imported modules in ``skip`` (and what only they import)."""
    seen: dict[str, Path] = {}
    todo = [module]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen[name] = module_file(name)
            todo.extend(imported_modules(seen[name]) - set(seen) - skip)
    return tuple(sorted(set(seen.values())))


def source_files(spec: KernelSpec) -> list[Path]:
    """The files that define ``spec``: its module and the package modules it imports."""
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
    found = MEMO.get().code.get(content_sha256)
    return found if found is not None else MEMO.put("code", content_sha256, code_text_sha256(path.read_text(), str(path)))


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
    recursively, other package modules by name."""
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
    docstring). A change there re-runs the verify cells even when the PTX bytes did not.
    What it reads is the kernel's source closure and the files that define its input
    generator and reference (a spec can be built elsewhere), so their bytes key it."""
    sites = [(Path(fn.__code__.co_filename), f"{fn.__qualname__}@{fn.__code__.co_firstlineno}")
             for fn in (spec.make_inputs, spec.reference)]
    files = tuple(sorted(set(closure(spec.module)) | {path for path, _ in sites if path.is_file()}))
    key = f"{spec.name}:{closure_bytes_sha256(files)}:{' '.join(site for _, site in sites)}:{' '.join(sorted(SCORING))}"
    found = MEMO.get().checks.get(key)
    return found if found is not None else MEMO.put("checks", key, computed_check_hash(spec))


def closure_bytes_sha256(files: Iterable[Path]) -> str:
    """One hash over the bytes of ``files`` (relative path + sha256 each), each file hashed
    once per version in a process (hslm_ptx.pipeline.core.checker.content_sha256)."""
    return sha256_bytes("".join(f"{rel(p)}\0{content_sha256(str(p))}\n" for p in files).encode())


def computed_check_hash(spec: KernelSpec) -> str:
    functions: dict[str, str] = {}
    modules: set[str] = set()
    for fn in (spec.make_inputs, spec.reference):
        _used_by(fn, spec.module, functions, modules)
    files = sorted({path for module in modules for path in closure(module, SCORING)})
    parts = [functions[k] for k in sorted(functions)] + [f"{rel(p)}\0{code_sha256(p)}" for p in files]
    return sha256_bytes("\n".join(parts).encode())
