"""Named shape sets from shapes.yaml, validated into :class:`hslm_ptx.pipeline.core.models.Shape`.

The file is user-edited, so every way it can be wrong ends in one :class:`UserError`
line naming the file, the set, the entry (number and name) and the field, instead of
a pydantic dump or a KeyError deep inside a task.
"""
from __future__ import annotations

import functools
import zlib
from pathlib import Path

from pydantic import ValidationError

from hslm_ptx.pipeline.core.artifacts import parse_yaml, read_document

from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.config import SHAPES_FILE
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.core.models import NAME_RULE, Shape, safe_name


def _entry_error(where: str, exc: ValidationError) -> UserError:
    """All of an entry's field errors on one line: "field 'K': ...; field 'N': ..."."""
    parts = []
    for err in exc.errors():
        field = ".".join(str(p) for p in err["loc"])
        parts.append(f"field '{field}': {err['msg']}" if field else err["msg"])
    return UserError(f"{where}: {'; '.join(parts)}")


def load_shape_sets(path: Path = SHAPES_FILE) -> dict[str, tuple[Shape, ...]]:
    """Every set in ``path``, in file order; raises :class:`UserError` on any bad entry.
    Parsed once per content in a process (every task creator asks)."""
    name = rel(path)
    if not Path(path).exists() and not Path(path).is_symlink():
        raise UserError(f"{name}: missing; it lists the shape sets (see the README)")
    try:
        text = read_document(Path(path))
    except ArtifactError as exc:  # not a file, not UTF-8: one line
        raise UserError(f"{exc}; fix it (or git checkout it to start again)") from None
    return dict(_parsed_sets(Path(path), text))


@functools.lru_cache(maxsize=8)
def _parsed_sets(path: Path, text: str) -> tuple[tuple[str, tuple[Shape, ...]], ...]:
    name = rel(path)
    try:
        raw = parse_yaml(path, text)
    except ArtifactError as exc:  # not YAML, a key twice: one line
        raise UserError(f"{exc}; fix it (or git checkout it to start again)") from None
    if not isinstance(raw, dict) or not raw:
        raise UserError(f"{name}: expected a mapping of set name -> list of shapes")
    sets: dict[str, tuple[Shape, ...]] = {}
    for set_name, entries in raw.items():
        try:
            if not isinstance(set_name, str):
                raise ValueError(f"{set_name!r} is not a safe name: use {NAME_RULE}")
            safe_name(set_name)
        except ValueError as exc:
            raise UserError(f"{name}: set name {exc}") from None
        if not isinstance(entries, list) or not entries:
            raise UserError(f"{name}: set '{set_name}' must be a non-empty list of shapes")
        shapes: list[Shape] = []
        for number, entry in enumerate(entries, start=1):
            label = entry.get("name") if isinstance(entry, dict) else None
            if isinstance(label, str) and len(label) > 40:
                label = f"{label[:20]}..."  # the field error says how long it is
            where = f"{name}: set '{set_name}' entry {number}" + (f" ('{label}')" if label else "")
            try:
                shape = Shape.model_validate(entry)
            except ValidationError as exc:
                raise _entry_error(where, exc) from None
            if any(s.name == shape.name for s in shapes):
                raise UserError(f"{where}: field 'name': duplicate name in set '{set_name}'")
            shapes.append(shape)
        sets[set_name] = tuple(shapes)
    return tuple(sets.items())


def parse_set_names(text: str) -> tuple[str, ...]:
    """``"smoke,tails"`` -> ("smoke", "tails"); order kept, repeats dropped."""
    names = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not names:
        raise UserError(f"shape={text!r}: give a set name or a comma list, e.g. shape=smoke,tails")
    return names


def select_sets(names: tuple[str, ...], path: Path = SHAPES_FILE) -> dict[str, tuple[Shape, ...]]:
    """The named sets from ``path``; an unknown name is a :class:`UserError` listing the known ones."""
    sets = load_shape_sets(path)
    for set_name in names:
        if set_name not in sets:
            raise UserError(
                f"unknown shape set '{set_name}' in {rel(path)}; known: {', '.join(sets)}"
            )
    return {set_name: sets[set_name] for set_name in names}


def load_set(name: str, path: Path = SHAPES_FILE) -> tuple[Shape, ...]:
    """The shapes of one named set (:class:`UserError` when unknown)."""
    return select_sets((name,), path)[name]


def seed(kernel: str, shape: Shape) -> int:
    """Input seed of one cell (verify's and the bench's, so both run the same data): crc32 of
    "kernel/shape-name"."""
    return zlib.crc32(f"{kernel}/{shape.name}".encode())
