"""JSON Schema of every JSON file the pipeline writes, exported from the pydantic models.

``python -m hslm_ptx.pipeline.core.schemas`` writes schemas/<Model>.json (``--out DIR``: there
instead); they are committed, so a reader outside Python (or a reviewer) sees each
format, and a model change that is not exported with it is a gate finding (SCHEMA
DRIFT), like a stale seal.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli
from hslm_ptx.pipeline.core.config import SCHEMAS_DIR
from hslm_ptx.pipeline.core.errors import UserError
from pydantic import BaseModel

from hslm_ptx.pipeline.core.layer_records import LayerBenchReport, LayerLedger, LayerReport
from hslm_ptx.pipeline.core.models import (EmitResult, KernelTestRun, Ledger, PtxasReport, RunSummary, Seal,
                                           VerifyIndex, VerifyReport)

DOCUMENTS: tuple[type[BaseModel], ...] = (EmitResult, PtxasReport, VerifyReport, VerifyIndex, KernelTestRun, Seal, Ledger,
                                           RunSummary, LayerReport, LayerLedger, LayerBenchReport)


def schema_text(model: type[BaseModel]) -> str:
    return json.dumps(model.model_json_schema(), indent=2, sort_keys=True) + "\n"


def export(folder: Path = SCHEMAS_DIR) -> list[Path]:
    """Write every document's schema into ``folder``; returns the paths written."""
    if Path(folder).exists() and not Path(folder).is_dir():
        raise UserError(f"{rel(folder)}: not a folder; give the folder the schemas are written in")
    paths = []
    for model in DOCUMENTS:
        path = Path(folder) / f"{model.__name__}.json"
        try:
            write_atomic(path, schema_text(model))
        except OSError as exc:  # a folder above it is a file, or not writable
            raise UserError(f"{rel(path)}: cannot be written ({exc.strerror}); give a folder you can write in") from None
        paths.append(path)
    return paths


def committed_text(path: Path) -> str | None:
    """The committed schema's text; None when it is not a UTF-8 file (a folder, a stray
    byte): it then differs from every export, which is what drift reports."""
    try:
        return path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def drift(folder: Path = SCHEMAS_DIR) -> list[str]:
    """'<file>: what' for each committed schema that is missing, differs from its model,
    or has no model (empty: the folder is the models' export)."""
    found = []
    expected = {f"{m.__name__}.json": m for m in DOCUMENTS}
    for name, model in expected.items():
        path = Path(folder) / name
        if not path.exists():
            found.append(f"{rel(path)}: missing")
        elif committed_text(path) != schema_text(model):
            found.append(f"{rel(path)}: differs from {model.__module__}.{model.__name__}")
    extra = sorted(p for p in Path(folder).glob("*.json") if p.name not in expected) if Path(folder).is_dir() else []
    return found + [f"{rel(p)}: no such record in hslm_ptx.pipeline.core.schemas.DOCUMENTS" for p in extra]


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.core.schemas",
                      description="Export the JSON Schema of every record file the pipeline writes, "
                                  "one <Model>.json each.")
    p.add_argument("--out", type=Path, default=SCHEMAS_DIR,
                   help=f"folder to write them in (default: {rel(SCHEMAS_DIR)}, the committed copy the gate compares)")
    return p


def _main(args: list[str]) -> int:
    for written in export(parser().parse_args(args).out):
        print(f"wrote {rel(written)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hslm_ptx.pipeline.core.schemas [--out DIR]``; a bad argument or an --out that is a
    file is one line and exit 2."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
