"""The committed JSON Schemas are the models' export, and every record file names its schema version."""
from __future__ import annotations

import json

import pytest

from hslm_ptx.pipeline.core import schemas
from hslm_ptx.pipeline.core.config import SCHEMAS_DIR
from hslm_ptx.pipeline.ratchet.ledger import dump_ledger, make_ledger
from hslm_ptx.pipeline.core.models import SCHEMA_VERSION
from hslm_ptx.pipeline.core.schemas import DOCUMENTS, drift, export, main


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
        "differs from hslm_ptx.pipeline.core.models.Seal", "missing", "no such record in hslm_ptx.pipeline.core.schemas.DOCUMENTS"]


def test_every_record_file_names_its_schema_version():
    for model in DOCUMENTS:
        assert model.model_json_schema()["properties"]["schema_version"]["const"] == SCHEMA_VERSION
    assert json.loads(dump_ledger(make_ledger([], 0)))["schema_version"] == SCHEMA_VERSION


# ---- python -m hslm_ptx.pipeline.core.schemas ---------------------------------------------------------

def test_cli_help_is_help_and_writes_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(schemas, "SCHEMAS_DIR", tmp_path / "schemas")  # the default folder, here
    assert main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: python -m hslm_ptx.pipeline.core.schemas")
    assert not (tmp_path / "schemas").exists()
    assert main([]) == 0  # without --help the default folder is written: the check above can fail
    assert sorted(p.stem for p in (tmp_path / "schemas").iterdir()) == sorted(m.__name__ for m in DOCUMENTS)


def test_cli_writes_where_it_is_told(tmp_path, capsys):
    assert main(["--out", str(tmp_path / "out")]) == 0
    assert drift(tmp_path / "out") == []
    assert capsys.readouterr().out.count("wrote ") == len(DOCUMENTS)


@pytest.mark.parametrize("args, fragment", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--out"], "argument --out: expected one argument"),
    (["--out", "{tmp}/file"], "{tmp}/file: not a folder"),
    (["--out", "{tmp}/file/below"], "cannot be written (Not a directory)"),
])
def test_cli_bad_argument_is_one_line_exit_2(tmp_path, capsys, args, fragment):
    (tmp_path / "file").write_text("")
    assert main([a.format(tmp=tmp_path) for a in args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and fragment.format(tmp=tmp_path) in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]  # nothing written
