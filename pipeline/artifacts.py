"""Content-hashed, atomically written artifacts.

Every stage writes its artifact (PTX, ptxas log, ...) and a pydantic result JSON
that records the artifact's sha256. Readers go through :func:`read_result`, which
re-hashes the artifact, so a corrupted or hand-edited file is detected and rebuilt
rather than trusted. Writes go to a temp file in the same folder and are renamed
into place: an interrupted run leaves the old file or the new one, never half.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "artifacts"

M = TypeVar("M", bound=BaseModel)


class ArtifactError(Exception):
    """An artifact or result file is missing, unreadable, or does not match its hash."""


class UserError(Exception):
    """A mistake the user can fix (bad shapes.yaml, unknown set or backend, no ptxas).

    Its str() is one line naming the file or option and what to do; tasks print it
    as is, with no traceback, and fail.
    """


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path) -> str:
    return sha256_bytes(Path(path).read_bytes())


def write_atomic(path: Path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` via a temp file + rename in the same directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = data.encode() if isinstance(data, str) else data
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(payload)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_model(path: Path, model: BaseModel) -> None:
    """Write a result model as indented JSON, atomically."""
    write_atomic(path, model.model_dump_json(indent=2) + "\n")


def read_model(path: Path, model_type: type[M]) -> M:
    """Read a result JSON; a missing or malformed file is an :class:`ArtifactError`."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ArtifactError(f"{rel(path)}: missing; run the stage that writes it") from None
    except (OSError, json.JSONDecodeError) as exc:
        raise ArtifactError(f"{rel(path)}: unreadable JSON ({exc}); delete it and re-run") from None
    try:
        return model_type.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise ArtifactError(
            f"{rel(path)}: field '{field}': {first['msg']}; delete it and re-run"
        ) from None


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


def rel(path: Path) -> str:
    """Path relative to the project root when it is inside it (for messages)."""
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
