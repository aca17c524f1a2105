"""Content-based up-to-date checks for doit: inputs by sha256, targets by their recorded hash.

doit's default md5 checker trusts an unchanged mtime (an edit kept by ``cp -p``, tar
or a fast editor is missed) and only checks that targets exist (a damaged target
is trusted). Here every file_dep is hashed on every run (our inputs are small) and
each stage's ``uptodate`` re-hashes its artifact against the sha256 its result JSON
recorded, so both cases re-run exactly the stage that owns the file.
"""
from __future__ import annotations

import os
from pathlib import Path

from doit.dependency import FileChangedChecker
from pydantic import BaseModel

from pipeline.artifacts import ArtifactError, check_artifact, read_model, sha256_file


class ContentChecker(FileChangedChecker):
    """file_dep state = sha256 of the content; mtime and size are never trusted."""

    def check_modified(self, file_path: str, file_stat: os.stat_result, state: str) -> bool:
        return sha256_file(Path(file_path)) != state

    def get_state(self, dep: str, current_state: str | None) -> str:
        return sha256_file(Path(dep))


def recorded_hash_matches(result: Path, model: type[BaseModel], artifact: Path,
                          field: str = "ptx_sha256"):
    """An ``uptodate`` callable: True while ``result`` reads as ``model`` and ``artifact``
    still has the sha256 recorded in its ``field``; any damage makes the task re-run."""

    def uptodate() -> bool:
        try:
            check_artifact(artifact, getattr(read_model(result, model), field))
        except ArtifactError:
            return False
        return True

    uptodate.__name__ = f"recorded_hash_matches({Path(artifact).name})"
    return uptodate
