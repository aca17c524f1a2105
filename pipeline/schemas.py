"""JSON Schema of every JSON file the pipeline writes, exported from the pydantic models.

``python -m pipeline.schemas`` writes schemas/<Model>.json; they are committed, so a
reader outside Python (or a reviewer) sees each format, and a model change that is not
exported with it is a gate finding (SCHEMA DRIFT), like a stale seal.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from pipeline.artifacts import rel, write_atomic
from pipeline.config import SCHEMAS_DIR
from pydantic import BaseModel

from pipeline.layer_records import LayerBenchReport, LayerLedger, LayerReport
from pipeline.models import (
    EmitResult, KernelTestRun, Ledger, PtxasReport, RunSummary, Seal, VerifyReport,
)

DOCUMENTS: tuple[type[BaseModel], ...] = (EmitResult, PtxasReport, VerifyReport, KernelTestRun, Seal, Ledger,
                                           RunSummary, LayerReport, LayerLedger, LayerBenchReport)


def schema_text(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"


def export(folder: Path = SCHEMAS_DIR) -> list[Path]:
    """Write every document's schema into ``folder``; returns the paths written."""
    paths = []
    for model in DOCUMENTS:
        path = Path(folder) / f"{model.__name__}.json"
        write_atomic(path, schema_text(model))
        paths.append(path)
    return paths


def drift(folder: Path = SCHEMAS_DIR) -> list[str]:
    """'<file>: what' for each committed schema that is missing, differs from its model,
    or has no model (empty: the folder is the models' export)."""
    found = []
    expected = {f"{m.__name__}.json": m for m in DOCUMENTS}
    for name, model in expected.items():
        path = Path(folder) / name
        if not path.exists():
            found.append(f"{rel(path)}: missing")
        elif path.read_text() != schema_text(model):
            found.append(f"{rel(path)}: differs from {model.__module__}.{model.__name__}")
    extra = sorted(p for p in Path(folder).glob("*.json") if p.name not in expected) if Path(folder).is_dir() else []
    return found + [f"{rel(p)}: no such record in pipeline.schemas.DOCUMENTS" for p in extra]


if __name__ == "__main__":
    for written in export():
        print(f"wrote {rel(written)}")
    sys.exit(0)
