"""Content-hashed, atomically written artifacts.

Every stage writes its artifact (PTX, ptxas log, ...) and a pydantic result JSON
that records the artifact's sha256. Readers go through :func:`read_model`, and check
an artifact against its recorded hash with :func:`check_artifact`, so a corrupted or
hand-edited file is detected and rebuilt rather than trusted.

Writes are atomic (hslm_ptx.pipeline.core.files.write_atomic: a temp file and a rename), so an
interrupted run leaves the old file or the new one, never half.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.core.files import rel, sha256_file, write_atomic

M = TypeVar("M", bound=BaseModel)
def write_model(path: Path, model: BaseModel) -> None:
    """Write a result model as indented JSON, atomically."""
    write_atomic(path, model.model_dump_json(indent=2) + "\n")


def field_error(path: Path, exc: ValidationError) -> str:
    """'<file>: field 'a.b': <pydantic message>' for the first error of ``exc``."""
    first = exc.errors()[0]
    field = ".".join(str(p) for p in first["loc"]) or "(top level)"
    return f"{rel(path)}: field '{field}': {first['msg']}"


# --- reading what people and stages wrote: one line for every way it can be wrong -------

MAX_DOCUMENT_BYTES = 64 * 1024 * 1024  # far above any record; a link to /dev/zero never ends


def read_document(path: Path) -> str:
    """The text of a JSON or YAML file the project reads, or an :class:`ArtifactError` line:
    missing, not a regular file (a folder, a device, a link to one), too large, or not
    UTF-8 (naming the first bad byte and its offset)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ArtifactError(f"{rel(path)}: missing; run the stage that writes it")
    if not path.is_file():
        raise ArtifactError(f"{rel(path)}: not a regular file (a folder, a device or a dangling link)")
    if path.stat().st_size > MAX_DOCUMENT_BYTES:
        raise ArtifactError(f"{rel(path)}: {path.stat().st_size} bytes, over {MAX_DOCUMENT_BYTES}; not a record")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArtifactError(f"{rel(path)}: cannot be read ({exc.strerror or exc})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise ArtifactError(f"{rel(path)}: line {line}: byte 0x{data[exc.start]:02x} at offset {exc.start} is not "
                            "UTF-8 text") from None


def _unique_object(path: Path):
    """A json ``object_pairs_hook`` that refuses a key given twice (json keeps the last)."""
    def build(pairs: list[tuple[str, object]]) -> dict:
        seen: dict[str, object] = {}
        for key, value in pairs:
            if key in seen:
                raise ArtifactError(f"{rel(path)}: duplicate key {key!r} (JSON keeps only the last): give each key once")
            seen[key] = value
        return seen

    return build


def parse_json(path: Path, text: str) -> object:
    """``text`` (the content of ``path``) as JSON; a syntax error or a duplicate key is an
    :class:`ArtifactError` naming the file."""
    try:
        return json.loads(text, object_pairs_hook=_unique_object(path))
    except json.JSONDecodeError as exc:
        raise ArtifactError(f"{rel(path)}: unreadable JSON ({exc})") from None
    except RecursionError:
        raise ArtifactError(f"{rel(path)}: unreadable JSON (nested too deeply)") from None


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.SafeLoader that refuses a mapping key given twice (PyYAML keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: set = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                duplicate = key in seen
            except TypeError:  # an unhashable key: SafeLoader's own error names it
                break
            if duplicate:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (YAML keeps only the last); give each key once",
                    key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def parse_yaml(path: Path, text: str) -> object:
    """``text`` (the content of ``path``) as YAML with PyYAML's safe loader, refusing
    duplicate keys; any error is one :class:`ArtifactError` line with the file and line."""
    try:
        return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f" line {mark.line + 1}:" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ArtifactError(f"{rel(path)}:{line} not valid YAML ({problem})") from None
    except RecursionError:
        raise ArtifactError(f"{rel(path)}: not valid YAML (nested too deeply)") from None


def read_json(path: Path) -> object:
    """:func:`read_document` + :func:`parse_json`."""
    return parse_json(path, read_document(path))


def read_yaml(path: Path) -> object:
    """:func:`read_document` + :func:`parse_yaml`."""
    return parse_yaml(path, read_document(path))


def read_model(path: Path, model_type: type[M]) -> M:
    """Read a result JSON; a missing or malformed file is an :class:`ArtifactError`."""
    path = Path(path)
    try:
        raw = read_json(path)
    except ArtifactError as exc:
        text = str(exc)
        raise ArtifactError(text if "missing;" in text else f"{text}; delete it and re-run") from None
    try:
        return model_type.model_validate(raw)
    except ValidationError as exc:
        raise ArtifactError(f"{field_error(path, exc)}; delete it and re-run") from None


def read_present(path: Path, model_type: type[M]) -> M | None:
    """The model in ``path``, or None when there is no such file (a missing result is a
    verdict; a present but unreadable one is an :class:`ArtifactError`)."""
    return read_model(path, model_type) if Path(path).exists() else None


def read_committed(path: Path, model_type: type[M]) -> M:
    """:func:`read_model` for a committed file (ledger, seal): one fixes or restores it, never
    deletes it, so the hint says so."""
    try:
        return read_model(path, model_type)
    except ArtifactError as exc:
        text = str(exc).removesuffix("; delete it and re-run").removesuffix("; run the stage that writes it")
        raise ArtifactError(f"{text}; fix it by hand or git checkout it") from None


def check_artifact(path: Path, sha256: str) -> None:
    """Raise :class:`ArtifactError` unless ``path`` exists with exactly this sha256."""
    path = Path(path)
    if not path.exists():
        raise ArtifactError(f"{rel(path)}: missing")
    actual = sha256_file(path)
    if actual != sha256:
        raise ArtifactError(
            f"{rel(path)}: sha256 {actual[:12]} does not match the recorded {sha256[:12]}; "
            "it was changed after it was written and will be rebuilt"
        )
