"""Bad input gets one clear line and a refusal, never a traceback or a silently wrong result.

One test (or one parametrized case) per way in: a file the project reads (a key given
twice, a byte that is not UTF-8, a folder or a device where a file should be, a name too
long for a file system, a damaged doit database), a command-line value, an argument of
the public float API, a member of a landed tar, a killed tool's scratch folder. Each
plants the fault and checks the line names the file / argument / field.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap

import numpy as np
import pytest

from hslm_ptx import arrays as array_ops
from hslm_ptx.runtime.launch import kernel_args, launch
from hslm_ptx.kernel.pitch import KernelLayout
from hslm_ptx.reference.quant import codes_into, ternarize
from hslm_ptx.catalog.registry import get_kernel
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.formats.ternary import PackError, pack
from hslm_ptx.validate import LaunchError
from hslm_ptx.pipeline.core import cmdline
from hslm_ptx.pipeline.ratchet import gate
from hslm_ptx.pipeline.core.artifacts import read_json, read_model, read_yaml
from hslm_ptx.pipeline.core.files import scratch_folder, sweep_scratch_folders
from hslm_ptx.pipeline.bench.land import unpack_rest
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.ratchet.ledger import dump_ledger, make_ledger, read_ledger
from hslm_ptx.pipeline.core.models import VerifyReport
from hslm_ptx.pipeline.ratchet.seal import read_seals
from hslm_ptx.pipeline.core.shapes import load_shape_sets

W16x1 = pack(np.ones((16, 1)))


def one_line(text: str) -> str:
    assert "\n" not in text.strip() and "Traceback" not in text
    return text


# --- duplicate keys, bytes that are not UTF-8, things that are not files -----------------

def shapes_error(tmp_path, data: bytes | str) -> str:
    path = tmp_path / "shapes.yaml"
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    with pytest.raises(UserError) as info:
        load_shape_sets(path)
    return one_line(str(info.value))


@pytest.mark.parametrize("text, says", [
    ("smoke:\n  - {name: a, R: 1, K: 1, N: 1}\nsmoke:\n  - {name: b, R: 2, K: 2, N: 2}\n",
     "line 3: not valid YAML (duplicate key 'smoke'"),
    ("smoke:\n  - name: a\n    name: b\n    R: 1\n    K: 1\n    N: 1\n", "line 3: not valid YAML (duplicate key 'name'"),
])
def test_a_key_given_twice_in_shapes_yaml_is_refused(tmp_path, text, says):
    assert says in shapes_error(tmp_path, text)


def test_a_non_utf8_byte_in_shapes_yaml_names_line_and_offset(tmp_path):
    message = shapes_error(tmp_path, b"smoke:\n  - {name: \xff, R: 1, K: 1, N: 1}\n")
    assert "shapes.yaml: line 2: byte 0xff at offset 18 is not UTF-8 text" in message


@pytest.mark.parametrize("plant", ["folder", "link to /dev/zero", "dangling link"])
def test_shapes_yaml_that_is_not_a_file_is_one_line(tmp_path, plant):
    path = tmp_path / "shapes.yaml"
    if plant == "folder":
        path.mkdir()
    else:
        os.symlink("/dev/zero" if plant == "link to /dev/zero" else tmp_path / "gone", path)
    with pytest.raises(UserError) as info:
        load_shape_sets(path)
    assert "not a regular file" in one_line(str(info.value))


@pytest.mark.parametrize("where", ["set", "shape"])
def test_a_300_character_name_is_refused(tmp_path, where):
    long = "a" * 300
    text = (f"{long}:\n  - {{name: a, R: 1, K: 1, N: 1}}\n" if where == "set"
            else f"smoke:\n  - {{name: {long}, R: 1, K: 1, N: 1}}\n")
    message = shapes_error(tmp_path, text)
    assert "(300 characters) is not a safe name" in message and "at most 100 characters" in message
    assert len(message) < 400


def test_json_with_a_key_twice_or_a_bad_byte_is_one_line(tmp_path):
    twice, bad = tmp_path / "twice.json", tmp_path / "bad.json"
    twice.write_text('{"a": {"b": 1, "b": 2}}')
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(ArtifactError, match=r"twice.json: duplicate key 'b'"):
        read_json(twice)
    with pytest.raises(ArtifactError, match=r"bad.json: line 1: byte 0xff at offset 7 is not UTF-8"):
        read_json(bad)
    (tmp_path / "ok.yaml").write_text("a: {b: 1}\nc: [1, 2]\n")
    assert read_yaml(tmp_path / "ok.yaml") == {"a": {"b": 1}, "c": [1, 2]}


def test_a_non_utf8_ledger_seal_or_report_is_an_artifact_error(tmp_path):
    ledger = tmp_path / "ledger.json"
    ledger.write_bytes(dump_ledger(make_ledger([], 0)).encode().replace(b"entries", b"entr\xffes"))
    with pytest.raises(ArtifactError, match="ledger.json: line .*byte 0xff.*fix it by hand or git checkout it"):
        read_ledger(ledger)
    seals = tmp_path / "seals"
    seals.mkdir()
    (seals / "k.json").write_bytes(b'{"kernel": "\xff"}')
    with pytest.raises(ArtifactError, match=r"k.json: line 1: byte 0xff"):
        read_seals(seals)
    report = tmp_path / "r.json"
    report.write_bytes(b"\xff\xfe")
    with pytest.raises(ArtifactError, match=r"r.json: line 1: byte 0xff .*delete it and re-run"):
        read_model(report, VerifyReport)


def test_a_non_utf8_allowed_duplicates_is_gate_exit_2(tmp_path, monkeypatch, capsys):
    (tmp_path / "allowed.yaml").write_bytes(b"allowed: [\xff]\n")
    monkeypatch.setattr(gate, "ALLOWED_FILE", tmp_path / "allowed.yaml")
    assert gate.main([]) == 2
    err = capsys.readouterr().err
    assert one_line(err).startswith("gate: cannot read ") and "byte 0xff" in err


# --- the doit database, command-line values, Ctrl-C -----------------------------------------

def test_a_damaged_database_is_named(tmp_path):
    assert cmdline.database_problem(tmp_path / "absent.db") is None
    junk = tmp_path / "junk.db"
    junk.write_bytes(b"junk" * 64)
    assert cmdline.database_problem(junk) == "file is not a database"
    sound = tmp_path / "sound.db"
    import sqlite3
    with sqlite3.connect(sound) as conn:
        conn.execute("create table doit (task_id text not null primary key, task_data json)")
        conn.execute("insert into doit values ('a', '{\"x\": 1}')")
        conn.execute("insert into doit values ('b', '" + "{\"y\": 2}" * 500 + "')")
    assert cmdline.database_problem(sound) is not None  # the second row is not one JSON value
    with sqlite3.connect(sound) as conn:
        conn.execute("delete from doit where task_id = 'b'")
        conn.execute("insert into doit values ('c', '" + '{"z": "' + "q" * 20000 + '"}' + "')")
    assert cmdline.database_problem(sound) is None
    truncated = tmp_path / "truncated.db"
    truncated.write_bytes(sound.read_bytes()[: sound.stat().st_size // 2])
    assert cmdline.database_problem(truncated) == "database disk image is malformed"
    assert cmdline.database_file(["doit", "--backend", "json", "gate"]) is None
    assert str(cmdline.database_file(["doit", "--db-file=/x/y.db", "gate"])) == "/x/y.db"


@pytest.mark.parametrize("task_data, says", [
    ("[1, 2]", "task 'a': task_data is list JSON, not an object"),
    ("5", "task 'a': task_data is int JSON, not an object"),
    ('"text"', "task 'a': task_data is str JSON, not an object"),
    ("null", "task 'a': task_data is NoneType JSON, not an object"),
    ('{"_values_:": [1]}', "task 'a': task_data field '_values_:' is list JSON, not an object"),
    ('{"deps:": 7}', "task 'a': task_data field 'deps:' is not a list of file names"),
    ('{"deps:": [[1]]}', "task 'a': task_data field 'deps:' is not a list of file names"),
])
def test_a_database_row_that_is_json_but_not_what_doit_reads_is_named(tmp_path, task_data, says):
    import sqlite3
    path = tmp_path / "rows.db"
    with sqlite3.connect(path) as conn:
        conn.execute("create table doit (task_id text not null primary key, task_data json)")
        conn.execute("insert into doit values ('a', ?)", (task_data,))
    assert cmdline.database_problem(path) == says
    with sqlite3.connect(path) as conn:
        conn.execute("update doit set task_data = ? where task_id = 'a'",
                     ('{"_values_:": {"x": 1}, "deps:": ["a.py"], "a.py": "0f"}',))
    assert cmdline.database_problem(path) is None


def test_a_hash_memo_row_of_other_types_is_a_miss(tmp_path, monkeypatch):
    from hslm_ptx.pipeline.core import checker
    monkeypatch.setattr(checker, "_hashes", {})
    monkeypatch.setattr(checker, "_kept", [tmp_path / "elsewhere.json"])  # registers no atexit writer
    path = tmp_path / "k.ptx"
    path.write_text("one")
    st = path.stat()
    memo = tmp_path / "hashes.json"
    memo.write_text(json.dumps([[str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, "x", "late"]]))
    checker.keep_hashes(memo)
    assert checker._hashes == {}
    assert checker.content_sha256(str(path)) == checker.sha256_file(path)


def test_doit_with_a_damaged_database_says_one_line_and_exits_2(tmp_path):
    """The one nested doit run of this file: a dodo that starts as the project's does."""
    (tmp_path / "dodo.py").write_text(textwrap.dedent("""
        from hslm_ptx.pipeline.core.cmdline import startup

        def task_nothing():
            return {"actions": None}

        startup()
    """))
    (tmp_path / ".doit.db").write_bytes(b"\0" * 100 + b"not sqlite")
    done = subprocess.run([sys.executable, "-m", "doit", "-f", str(tmp_path / "dodo.py"), "-d", str(tmp_path),
                           "clean"], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 2, done.stderr
    assert one_line(done.stderr).startswith("error: the doit database .doit.db is damaged (file is not a database)")
    assert "rm .doit.db" in done.stderr


@pytest.mark.parametrize("name, value, says", [
    ("shape", "", "error: shape= is empty; give <set,...> (shapes.yaml), or leave shape out for the default"),
    ("backend", "", "error: backend= is empty"),
    ("gpu", "", "error: gpu= is empty"),
    ("force", "yes", "error: force=yes: expected one of 0, 1"),
    ("accept_new", "2", "error: accept_new=2: expected one of 0, 1"),
    ("base", " ", "error: base= is empty; give <git ref>, or leave base out for none"),
])
def test_an_empty_or_unknown_value_is_refused_before_any_task(monkeypatch, capsys, name, value, says):
    with pytest.raises(SystemExit) as info:
        cmdline.startup(["doit", "verify", f"{name}={value}"])
    assert info.value.code == 3 and one_line(capsys.readouterr().err).startswith(says)


def test_known_values_pass_startup(monkeypatch):
    monkeypatch.setattr(cmdline, "database_file", lambda argv: None)
    monkeypatch.setattr(cmdline.signal, "signal", lambda *a: None)
    monkeypatch.setattr(cmdline, "sweep_temp_files", lambda: [])
    monkeypatch.setattr(cmdline, "sweep_scratch_folders", lambda: [])
    monkeypatch.setattr(sys, "excepthook", sys.excepthook)
    assert cmdline.startup(["doit", "force=1", "verify", "shape=smoke"]) is None


def test_an_unknown_variable_is_refused_before_any_task(capsys):
    with pytest.raises(SystemExit) as info:
        cmdline.startup(["doit", "verify", "shap=smoke"])
    assert info.value.code == 3
    assert one_line(capsys.readouterr().err).startswith("error: unknown variable 'shap'; known: shape, backend")


def test_ctrl_c_says_ctrl_c(capsys):
    with pytest.raises(SystemExit) as info:
        cmdline._interrupted(KeyboardInterrupt, KeyboardInterrupt(), None)
    assert info.value.code == 130
    assert capsys.readouterr().err.startswith("interrupted (Ctrl-C); the tasks that finished are saved")


def test_a_killed_tools_scratch_folder_is_swept(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = tmp_path / f"ptxas-{gone.pid}-abc"
    mine = tmp_path / f"ptxas-{os.getpid()}-def"
    other = tmp_path / "ptxas-xyz"  # not named by scratch_folder: not ours to judge
    for folder in (dead, mine, other):
        folder.mkdir()
    assert sweep_scratch_folders(tmp_path) == [dead]
    assert not dead.exists() and mine.exists() and other.exists()
    with scratch_folder("ptxas") as scratch:
        assert os.path.basename(scratch).startswith(f"ptxas-{os.getpid()}-")
    assert not os.path.exists(scratch)


# --- bench_land: members that would leave the landing folder ---------------------------------

def tgz(path, members: list[tarfile.TarInfo], data: bytes = b"{}") -> None:
    with tarfile.open(path, "w:gz") as tar:
        for member in members:
            if member.isfile():
                member.size = len(data)
                tar.addfile(member, io.BytesIO(data))
            else:
                tar.addfile(member)


def member(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, link
    return info


@pytest.mark.parametrize("name, kind, says", [
    ("artifacts/verify//tmp/x/pwned.json", tarfile.REGTYPE, "leaves the landing folder"),
    ("/tmp/x/pwned.log", tarfile.REGTYPE, "an absolute path"),
    ("artifacts/verify/../../pwned.json", tarfile.REGTYPE, "leaves the landing folder"),
    ("step.log", tarfile.SYMTYPE, "a link"),
    ("artifacts/verify/k/s/a.json", tarfile.LNKTYPE, "a link"),
    ("dev.log", tarfile.CHRTYPE, "not a plain file"),
])
def test_a_member_that_leaves_the_landing_folder_is_refused(tmp_path, name, kind, says):
    archive = tmp_path / "rest.tgz"
    tgz(archive, [member("artifacts/verify/k/s/ok.json"), member(name, kind, "/etc/passwd")])
    dest = tmp_path / "landed"
    with pytest.raises(UserError) as info:
        unpack_rest(archive, dest)
    assert says in one_line(str(info.value)) and repr(name) in str(info.value)
    assert not dest.exists()  # nothing unpacked, the good member included


def test_plain_members_land_where_they_belong(tmp_path):
    archive = tmp_path / "rest.tgz"
    tgz(archive, [member(".", tarfile.DIRTYPE), member("./artifacts", tarfile.DIRTYPE),
                  member("./artifacts/verify/k/s/a.json"), member("verify.log"), member("other/x.txt"),
                  member("./out/bench-smoke.png"), member("./out/calibration.json"), member("./out/notes.txt")])
    unpack_rest(archive, tmp_path / "landed")
    assert (tmp_path / "landed/verify/k/s/a.json").read_bytes() == b"{}"
    assert (tmp_path / "landed/logs/verify.log").exists() and not (tmp_path / "landed/other").exists()
    assert (tmp_path / "landed/bench-smoke.png").exists() and (tmp_path / "landed/calibration.json").exists()
    assert not (tmp_path / "landed/notes.txt").exists() and not (tmp_path / "landed/out").exists()


def test_a_damaged_tgz_is_one_line(tmp_path):
    (tmp_path / "rest.tgz").write_bytes(b"\x1f\x8b not really")
    with pytest.raises(UserError, match="not a readable tar.gz"):
        unpack_rest(tmp_path / "rest.tgz", tmp_path / "landed")


# --- the float API: right or refused ----------------------------------------------------------

def test_a_result_near_the_top_of_the_f64_range_is_right_not_nan():
    x = np.tile([1e308, -1e308], (4, 8))
    y = array_ops.forward(x, W16x1, 1000.0)
    assert np.array_equal(y, np.zeros((4, 1)))  # +-1e308 in pairs: every sum is 0
    one = np.zeros((4, 16))
    one[:, 0] = 1e308
    assert np.allclose(array_ops.forward(one, W16x1, 1e-3), 1e305, rtol=1e-2)  # s * beta underflows nothing


def test_the_rescale_of_ordinary_scales_is_the_plain_product():
    rng = np.random.default_rng(3)
    acc = rng.integers(-2**20, 2**20, (7, 5)).astype(np.int32)
    s = rng.uniform(1e-3, 10, (7, 1))
    assert np.array_equal(array_ops._rescale(acc, s, 0.37, np), acc * (s * 0.37))


@pytest.mark.parametrize("weights, says", [
    (np.array([[1.0, np.nan]]), "ternarize: w has a non-finite value (nan) at (0, 1)"),
    (np.array([[np.inf, 1.0]]), "ternarize: w has a non-finite value (inf) at (0, 0)"),
    (np.zeros((0, 3)), "ternarize: w has shape (0, 3), no weights to take a scale of"),
    (np.array([["a"]]), "ternarize: w is <U1; expected real"),
    ([[1.0, 2.0], [3.0]], "ternarize: w is a ragged list"),
])
def test_ternarize_refuses_what_has_no_scale(weights, says):
    with pytest.raises(ValueError) as info:
        ternarize(weights)
    assert str(info.value).startswith(says)


def test_ternarize_near_the_top_of_the_range_and_of_a_list():
    codes, beta = ternarize(np.array([1e308, 1e308, 0.0]))
    assert np.isfinite(beta) and beta == pytest.approx(1e308 / 3 * 2) and codes.tolist() == [1, 1, 0]
    codes, beta = ternarize([[0.5, -1.0], [0.2, 0.0]])
    assert codes.tolist() == [[1, -1], [0, 0]] and beta == pytest.approx(0.425)


@pytest.mark.parametrize("call, says", [
    (lambda: array_ops.forward(np.ones((4, 16)), W16x1, "1.0"), "forward: beta='1.0' is a str; expected the finite scale"),
    (lambda: array_ops.forward(np.ones((4, 16)), W16x1, True), "forward: beta=True is a bool"),
    (lambda: array_ops.grad_input(np.ones((4, 1)), W16x1, 1.0, K=0), "grad_input: K=0 is below 1; expected an int >= 1"),
    (lambda: array_ops.grad_input(np.ones((4, 1)), W16x1, 1.0, K=-5), "grad_input: K=-5 is below 1"),
    (lambda: array_ops.grad_input(np.ones((4, 1)), W16x1, 1.0, K="20"), "grad_input: K='20' is a str; expected an int"),
    (lambda: array_ops.grad_input(np.ones((4, 1)), W16x1, 1.0, K=20.0), "grad_input: K=20.0 is a float; expected an int"),
    (lambda: array_ops.grad_weight(np.ones((8, 4)), np.ones((8, 2)), chunk_rows=2.5),
     "grad_weight: chunk_rows=2.5 is a float; expected an int >= 1"),
    (lambda: array_ops.forward([[1.0] * 16], W16x1, 1.0), "forward: inputs must all be numpy or all be cupy arrays"),
    (lambda: pack(np.array([[1, None]], dtype=object)), "pack: w is object; expected numbers -1, 0 or +1"),
    (lambda: pack(np.array([["1"]])), "pack: w is <U1; expected numbers"),
    (lambda: pack(np.zeros((3, 0))), "pack: w has shape (3, 0) (K x N); K and N must be >= 1"),
    (lambda: pack([[1, 0], [1]]), "pack: w is a ragged list"),
])
def test_a_bad_argument_is_named(call, says):
    with pytest.raises((LaunchError, PackError)) as info:
        call()
    assert one_line(str(info.value)).startswith(says)


@pytest.mark.parametrize("op, call, hint", [
    ("grad_weight", lambda: array_ops.grad_weight(np.ones((8, 4)), np.ones(8)), "dy.reshape(8, -1)"),
    ("grad_input", lambda: array_ops.grad_input(np.ones(8), pack(np.ones((16, 8))), 1.0, K=16), "dy.reshape(-1, 8)"),
])
def test_a_1d_operand_gets_a_reshape_that_fits(op, call, hint):
    """grad_weight's dY has X's rows (8 rows, one column here), grad_input's has W's N columns."""
    with pytest.raises(LaunchError) as info:
        call()
    assert str(info.value).endswith(f"reshape it, e.g. {hint}")
    fixed = {"grad_weight": lambda: array_ops.grad_weight(np.ones((8, 4)), np.ones(8).reshape(8, -1)),
             "grad_input": lambda: array_ops.grad_input(np.ones(8).reshape(-1, 8), pack(np.ones((16, 8))), 1.0, K=16)}
    assert fixed[op]().shape == {"grad_weight": (4, 1), "grad_input": (1, 16)}[op]


FWD = get_kernel("hslm_fwd_s8")


@pytest.mark.parametrize("dims, says", [
    (Dims(4.0, 32, 8), "hslm_fwd_s8: Dims.R=4.0 is a float; sizes are ints >= 1"),
    (Dims(4, "32", 8), "hslm_fwd_s8: Dims.K='32' is a str"),
    (Dims(4, 32, True), "hslm_fwd_s8: Dims.N=True is a bool"),
    (Dims(4, 0, 8), "hslm_fwd_s8: R, K, N must be >= 1"),
])
def test_dims_that_are_not_sizes_are_named(dims, says):
    with pytest.raises(LaunchError) as info:
        launch(FWD, lambda *a, **k: None, dims, {})
    assert str(info.value).startswith(says)


def test_a_read_only_output_is_refused():
    dims = Dims(4, 32, 8)
    out = np.zeros(FWD.output.layout.shape(dims), np.int32)
    out.flags.writeable = False
    with pytest.raises(LaunchError, match="output 'y' is read-only"):
        kernel_args(FWD, dims, out, {})
    codes = np.zeros((2, 2), np.int8)
    codes.flags.writeable = False
    with pytest.raises(ValueError, match="codes_into: out is read-only"):
        codes_into(np.ones((2, 2)), np.ones((2, 1)), codes)


def test_an_input_that_starts_off_a_16_byte_boundary_is_copied_or_refused():
    from hslm_ptx.arrays import kernel_function

    dims = Dims(4, 32, 8)
    x = np.zeros(129, np.int8)[1:].reshape(4, 32)
    x[:] = np.arange(32, dtype=np.int8) % 5 - 2
    assert x.__array_interface__["data"][0] % 16 == 1 and x.flags.c_contiguous
    w = pack(np.ones((32, 8)))
    y = launch(FWD, kernel_function(FWD.name, np), dims, {"x": x, "w": w})
    assert np.array_equal(y, np.repeat(x.astype(np.int32).sum(axis=1, keepdims=True), 8, axis=1))
    shifted = np.zeros(FWD.params[1].layout.shape(dims)[0] * FWD.params[1].layout.shape(dims)[1] + 1, np.int8)[1:]
    marked = KernelLayout(shifted.reshape(FWD.params[1].layout.shape(dims)))
    with pytest.raises(LaunchError, match="marked KernelLayout.*not 16-byte aligned"):
        kernel_args(FWD, dims, np.zeros(FWD.output.layout.shape(dims), np.int32), {"x": marked, "w": w})


@pytest.mark.parametrize("plant", ["a 0xff byte", "a folder"])
def test_a_committed_schema_that_is_not_utf8_text_is_drift_not_a_traceback(tmp_path, plant):
    from hslm_ptx.pipeline.core import schemas

    schemas.export(tmp_path)
    seal = tmp_path / "Seal.json"
    if plant == "a folder":
        seal.unlink()
        seal.mkdir()
    else:
        seal.write_bytes(seal.read_bytes() + b"\xff")
    assert [line.split(": ", 1)[1] for line in schemas.drift(tmp_path)] == ["differs from hslm_ptx.pipeline.core.models.Seal"]
