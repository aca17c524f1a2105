"""The duplicate-body rule: no function body is copied between files under hslm_ptx/
(import it instead), unless ledger/allowed_duplicates.yaml lists the pair
with a reason.

Bodies are compared after normalizing their AST: statements that do nothing dropped
(``pass``, a docstring or any other bare constant, wherever they stand), arguments renamed
by position and other locals by first appearance, so renaming a copy's variables does
not hide it. Constants, attribute names and global names are kept: two tables with
different numbers, or two calls of different helpers, are different code. Bodies of
fewer than :data:`MIN_STATEMENTS` statements (counted recursively) are too small to
matter. A duplicate nested inside a reported duplicate is not reported again.

``python -m hslm_ptx.pipeline.ratchet.dupbody [--root DIR]`` lists the groups, one line each, the allowed
ones marked, and exits 1 when a group is not allowed (``--help`` for the rest).
"""
from __future__ import annotations

import ast
import hashlib
import sys
from collections import defaultdict
from pathlib import Path
from typing import Iterator

from pydantic import ValidationError

from hslm_ptx.pipeline.core.artifacts import field_error, read_yaml

from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli
from hslm_ptx.pipeline.core.config import ALLOWED_FILE, ROOT
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.models import AllowedDuplicates, DuplicateGroup, FunctionRef

SCOPE = ("hslm_ptx",)
MIN_STATEMENTS = 3

Def = ast.FunctionDef | ast.AsyncFunctionDef


def bound_names(fn: Def) -> list[str]:
    """Arguments in signature order, then every other name the body binds, in walk order."""
    args = fn.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, args.vararg, *args.kwonlyargs, args.kwarg) if a]
    declared = {n for node in ast.walk(fn) if isinstance(node, (ast.Global, ast.Nonlocal)) for n in node.names}
    for node in (n for stmt in fn.body for n in ast.walk(stmt)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.append(node.id)
        elif isinstance(node, ast.arg):
            names.append(node.arg)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(node.name)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.append(node.name)
    return [n for n in dict.fromkeys(names) if n not in declared]


class Normalize(ast.NodeTransformer):
    """Rename bound names to placeholders and drop the statements that do nothing
    (:func:`is_no_op`), so a copy padded with them is still the same body."""

    def __init__(self, names: list[str]) -> None:
        self.names = {name: f"_{i}" for i, name in enumerate(names)}

    def generic_visit(self, node: ast.AST) -> ast.AST:
        for field in ("body", "orelse", "finalbody"):
            block = getattr(node, field, None)
            if isinstance(block, list) and block and all(isinstance(s, ast.stmt) for s in block):
                kept = [s for s in block if not is_no_op(s)]
                setattr(node, field, kept or ([ast.Pass()] if field == "body" else []))
        for attr in ("id", "arg", "name"):
            if isinstance(getattr(node, attr, None), str) and not isinstance(node, (ast.alias, ast.keyword)):
                setattr(node, attr, self.names.get(getattr(node, attr), getattr(node, attr)))
        return super().generic_visit(node)


def is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def is_no_op(stmt: ast.stmt) -> bool:
    """``pass``, or an expression statement of a constant (a docstring anywhere, ``...``, ``0``):
    running it changes nothing."""
    return isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant))


def fingerprint(fn: Def) -> str | None:
    """sha256 of the normalized body, or None when it has fewer than MIN_STATEMENTS."""
    body = fn.body[1:] if fn.body and is_docstring(fn.body[0]) else fn.body
    module = Normalize(bound_names(fn)).visit(ast.Module(body=[*body], type_ignores=[]))
    statements = sum(isinstance(n, ast.stmt) for n in ast.walk(module))
    if statements < MIN_STATEMENTS:
        return None
    return hashlib.sha256(ast.dump(module).encode()).hexdigest()


def functions(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, Def]]:
    """(qualname, node) of every function, method and nested function."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield prefix + node.name, node
            yield from functions(node, f"{prefix}{node.name}.")
        elif isinstance(node, ast.ClassDef):
            yield from functions(node, f"{prefix}{node.name}.")
        else:
            yield from functions(node, prefix)


def sources(root: Path = ROOT, scope: tuple[str, ...] = SCOPE) -> list[Path]:
    return sorted(p for folder in scope for p in (root / folder).rglob("*.py") if "__pycache__" not in p.parts)


def find_duplicates(root: Path = ROOT, scope: tuple[str, ...] = SCOPE) -> list[DuplicateGroup]:
    """Groups of functions in two or more files with the same normalized body."""
    seen: dict[str, list[tuple[FunctionRef, int]]] = defaultdict(list)
    for path in sources(root, scope):
        name = path.relative_to(root).as_posix()
        try:
            tree = ast.parse(path.read_text(), filename=name)
        except SyntaxError as exc:
            raise ArtifactError(f"{name}:{exc.lineno}: cannot parse ({exc.msg})") from None
        for qualname, fn in functions(tree):
            if (key := fingerprint(fn)) is not None:
                seen[key].append((FunctionRef(path=name, qualname=qualname, line=fn.lineno), fn.end_lineno or fn.lineno))
    groups = [members for members in seen.values() if len({ref.path for ref, _ in members}) > 1]

    def inside(ref: FunctionRef, end: int, other: list[tuple[FunctionRef, int]]) -> bool:
        return any(o.path == ref.path and o.line < ref.line and end <= o_end for o, o_end in other)

    kept = [g for g in groups if not any(h is not g and all(inside(r, e, h) for r, e in g) for h in groups)]
    return sorted((DuplicateGroup(members=[ref for ref, _ in g]) for g in kept),
                  key=lambda g: [m.name for m in g.members])


def read_allowed(path: Path = ALLOWED_FILE) -> AllowedDuplicates:
    """The allowed-duplicates list; :class:`ArtifactError` when it is unreadable."""
    try:
        raw = read_yaml(Path(path)) if Path(path).exists() else None  # refuses duplicate keys
        return AllowedDuplicates.model_validate(raw or {})
    except ValidationError as exc:
        raise ArtifactError(field_error(path, exc)) from None


def allowed_group(group: DuplicateGroup, allowed: AllowedDuplicates) -> bool:
    names = {m.name for m in group.members}
    return any(names <= set(entry.functions) for entry in allowed.allowed)


def stale_allowances(groups: list[DuplicateGroup], allowed: AllowedDuplicates) -> list[list[str]]:
    """Allowed entries whose functions no longer share one body (the list should shrink)."""
    found = [{m.name for m in g.members} for g in groups]
    return [e.functions for e in allowed.allowed if not any(set(e.functions) <= names for names in found)]


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.ratchet.dupbody",
                      description="List the function bodies repeated across files under "
                                  f"{' and '.join(f'{s}/' for s in SCOPE)}, one group a line, those "
                                  f"the allowed list names marked; exit 1 when a group is not allowed. "
                                  "Reads files, writes nothing.")
    p.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    p.add_argument("--allowed", type=Path,
                   help=f"the allowed list (default: {rel(ALLOWED_FILE)} under --root)")
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    if not any((opts.root / folder).is_dir() for folder in SCOPE):
        raise UserError(f"--root {opts.root}: has no {' or '.join(f'{s}/' for s in SCOPE)} folder; "
                        "give the top folder of a checkout")
    if opts.allowed is not None and not opts.allowed.is_file():
        raise UserError(f"--allowed {opts.allowed}: no such file; give the allowed list "
                        f"({rel(ALLOWED_FILE)}'s format), or leave --allowed out")
    allowed = read_allowed(opts.allowed or opts.root / ALLOWED_FILE.relative_to(ROOT))
    groups = find_duplicates(opts.root)
    for group in groups:
        mark = "  (allowed)" if allowed_group(group, allowed) else ""
        print(" == ".join(f"{m.name}:{m.line}" for m in group.members) + mark)
    if not groups:
        print(f"no function body repeated across files under {' and '.join(f'{s}/' for s in SCOPE)}")
    return 0 if all(allowed_group(g, allowed) for g in groups) else 1


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
