"""The committed JSON Schemas are the models' export, and every record file names its schema version."""
from __future__ import annotations

import json

from pipeline.config import SCHEMAS_DIR
from pipeline.ledger import dump_ledger, make_ledger
from pipeline.models import SCHEMA_VERSION
from pipeline.schemas import DOCUMENTS, drift, export


def test_committed_schemas_match_the_models():
    assert drift(SCHEMAS_DIR) == []
    assert {p.stem for p in SCHEMAS_DIR.glob("*.json")} == {m.__name__ for m in DOCUMENTS}


def test_drift_is_found(tmp_path):
    export(tmp_path)
    assert drift(tmp_path) == []
    seal = tmp_path / "Seal.json"
    schema = json.loads(seal.read_text())
    schema["properties"].pop("tests")
    seal.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    (tmp_path / "Ledger.json").unlink()
    (tmp_path / "Old.json").write_text("{}")
    found = drift(tmp_path)
    assert [line.split(": ", 1)[1] for line in found] == [
        "differs from pipeline.models.Seal", "missing", "no such record in pipeline.schemas.DOCUMENTS"]


def test_every_record_file_names_its_schema_version():
    for model in DOCUMENTS:
        assert model.model_json_schema()["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert json.loads(dump_ledger(make_ledger([], 0)))["schema_version"] == SCHEMA_VERSION
