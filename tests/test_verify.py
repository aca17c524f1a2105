"""verify: exact comparison, seeded inputs, recorded errors, backend choice.

The plumbing tests stand in a Python launch function for the backend (it writes a
chosen answer into the output buffer, or raises), so they test verify itself, not
the emulator. The end-to-end cells run the real PTX on the emulator, and on a GPU
only where CuPy sees one (skipped otherwise, never faked).
"""
from __future__ import annotations

import re
import time
from types import SimpleNamespace

import numpy as np
import pytest

from hslm_ptx.catalog.registry import KERNELS
from hslm_ptx.kernel.pitch import output_pitch, pitch
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.runtime import backends
from hslm_ptx.pipeline.core import config
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.errors import ArtifactError, UserError
from hslm_ptx.pipeline.stages.emit import emit
from hslm_ptx.pipeline.core.models import Shape, VerifyReport
from hslm_ptx.pipeline.stages.verify import (check_work, compare, heartbeat, launch_stats, resolve_backend, seed,
                                             verdict, verify_cell)

SHAPE = Shape(name="odd", R=33, K=31, N=9)
SPEC = KERNELS["hslm_fwd_s8"]


@pytest.fixture
def artifacts(tmp_path, monkeypatch):
    """Emit into a temp artifacts folder so tests never touch the project's."""
    monkeypatch.setattr(config, "PTX_DIR", tmp_path / "ptx")
    monkeypatch.setattr(config, "VERIFY_DIR", tmp_path / "verify")
    emit(SPEC)
    return tmp_path


def expected(spec, shape: Shape) -> np.ndarray:
    dims = Dims(shape.R, shape.K, shape.N)
    return spec.reference(dims, spec.make_inputs(dims, np.random.default_rng(seed(spec.name, shape))))


def fake_backend(monkeypatch, answer=None, exc: Exception | None = None):
    """load_function returns a launch fn that writes ``answer`` into the output, or raises."""
    calls = []

    def fn(grid, block, args, shared_mem=0):
        calls.append((grid, block, [a.shape if isinstance(a, np.ndarray) else int(a) for a in args]))
        if exc is not None:
            raise exc
        args[0][:, :answer.shape[1]] = answer  # the output's rows x width, inside its pitch

    monkeypatch.setattr(backends, "load_ptx", lambda backend, ptx, entry: fn)
    return calls


def test_compare():
    want = np.arange(12, dtype=np.int32).reshape(3, 4)
    assert compare(want.copy(), want) == (0, 0, None)
    got = want.copy()
    got[2, 1] = -2**31
    got[1, 3] += 5
    count, max_abs, first = compare(got, want)
    assert (count, max_abs) == (2, 2**31 + 9)  # int64 difference: no int32 wrap-around
    assert (first.row, first.col, first.got, first.want) == (1, 3, 12, 7)
    with pytest.raises(ValueError, match=r"output shape \(4, 3\) != reference shape \(3, 4\)"):
        compare(want.T, want)


def test_seed_is_stable_and_distinct():
    assert seed("hslm_fwd_s8", SHAPE) == 552362551  # crc32(b"hslm_fwd_s8/odd"): pinned so reports stay reproducible
    other = {seed(k, s) for k in KERNELS for s in (SHAPE, SHAPE.model_copy(update={"name": "o"}))}
    assert len(other) == 2 * len(KERNELS)


def test_exact_answer_passes(artifacts, monkeypatch):
    calls = fake_backend(monkeypatch, answer=expected(SPEC, SHAPE))
    report = verify_cell(SPEC, "tails", SHAPE, "emulator")
    assert report.passed and report.rows_checked == 33 and report.max_abs_diff == 0
    assert report.device == "cpu-emulator" and report.driver is None
    assert calls == [(SPEC.geometry(Dims(33, 31, 9)).grid, SPEC.geometry(Dims(33, 31, 9)).block,
                      [(33, output_pitch(9)), (33, pitch(31)), (2, 512), 33, 31, 9, pitch(31), output_pitch(9), 64])]  # W in planes (2 x 4 x 128 words); one split of 64
    on_disk = read_model(artifacts / "verify" / SPEC.name / "tails" / "odd.json", VerifyReport)
    assert on_disk == report
    assert verdict(report).startswith("hslm_fwd_s8 tails/odd R=33 K=31 N=9: ok, 33 rows exact")


def test_mismatch_names_the_first_one(artifacts, monkeypatch):
    answer = expected(SPEC, SHAPE)
    answer[4, 7] += 3
    answer[20, 0] -= 1
    fake_backend(monkeypatch, answer=answer)
    report = verify_cell(SPEC, "tails", SHAPE, "emulator")
    assert not report.passed and report.mismatches == 2 and report.max_abs_diff == 3
    assert verdict(report) == (
        f"hslm_fwd_s8 tails/odd R=33 K=31 N=9: 2 mismatches (max |diff| 3); first at "
        f"(row 4, col 7): got {answer[4, 7]}, want {answer[4, 7] - 3}")


def test_launch_error_is_recorded(artifacts, monkeypatch):
    fake_backend(monkeypatch, exc=RuntimeError("out of bounds\n  at line 7"))
    report = verify_cell(SPEC, "tails", SHAPE, "emulator")
    assert report.error == "RuntimeError: out of bounds at line 7"
    assert not report.passed and report.rows_checked == 0
    assert verdict(report).endswith(": emulator error: RuntimeError: out of bounds at line 7")


def test_damaged_ptx_is_refused(artifacts, monkeypatch):
    fake_backend(monkeypatch, answer=expected(SPEC, SHAPE))
    ptx = artifacts / "ptx" / f"{SPEC.name}.ptx"
    ptx.write_text(ptx.read_text() + "// edited by hand\n")
    with pytest.raises(ArtifactError, match="does not match the recorded"):
        verify_cell(SPEC, "tails", SHAPE, "emulator")


def test_backend_choice():
    assert resolve_backend("emulator") == "emulator"
    assert resolve_backend("auto") == ("gpu" if backends.gpu_available() else "emulator")
    with pytest.raises(UserError, match=r"^unknown backend 'cuda'; known: auto, gpu, emulator$"):
        resolve_backend("cuda")
    assert backends.array_module("emulator") is np
    assert backends.device_info("emulator") == ("cpu-emulator", None, None)


def test_forced_gpu_without_device_is_refused():
    if backends.gpu_available():
        pytest.skip("a GPU is present: backend=gpu is allowed")
    with pytest.raises(UserError, match=r"^backend=gpu: CuPy sees no CUDA device; pip install"):
        resolve_backend("gpu")


@pytest.mark.parametrize("backend", ["emulator", "gpu"])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_real_kernel_on_smoke(tmp_path, monkeypatch, backend, kernel):
    if backend == "gpu" and not backends.gpu_available():
        pytest.skip("no CUDA device visible to CuPy")
    monkeypatch.setattr(config, "PTX_DIR", tmp_path / "ptx")
    monkeypatch.setattr(config, "VERIFY_DIR", tmp_path / "verify")
    spec = KERNELS[kernel]
    emit(spec)
    report = verify_cell(spec, "smoke", Shape(name="k_tail", R=8, K=40, N=24), backend)
    assert report.passed, verdict(report)
    assert report.rows_checked == 8 and report.backend == backend
    stats = report.launch_stats
    if backend == "emulator":  # the emulator's counts of the launch travel with the report
        assert stats.warp_instructions == sum(stats.by_opcode.values())
        assert (stats.by_opcode.get("mma", 0) > 0) == bool(spec.tile)  # only the tiled products run mma
    else:
        assert stats is None


def test_launch_stats_carry_memory_rows():
    row = dict(line=12, opcode="ld.global.u32", space="global", in_loop=True, requests=4, bytes_used=512,
               sectors=16, lines=4, wavefronts=4, ideal_wavefronts=4)
    fn = SimpleNamespace(stats=SimpleNamespace(warp_instructions=10, by_opcode={"mma": 2, "ld.global": 8},
                                               memory=(SimpleNamespace(_asdict=lambda: row),)))
    stats = launch_stats(fn)
    assert stats.warp_instructions == 10 and stats.memory[0].sectors == 16 and stats.memory[0].in_loop
    older = SimpleNamespace(stats=SimpleNamespace(warp_instructions=3, by_opcode={"mma": 3}))  # no memory rows
    assert launch_stats(older).memory == [] and launch_stats(SimpleNamespace()) is None


def test_emulator_work_budget_refuses_big_cells_unless_forced(artifacts, monkeypatch):
    big = Shape(name="sq4096", R=4096, K=4096, N=4096)
    with pytest.raises(UserError, match=r"^verify hslm_fwd_s8 large/sq4096 on the emulator: R\*K\*N = 6.9e\+10 "
                                        r"multiply-adds, about \d+ s, over the emulator budget 4.3e\+09; run it "
                                        r"with backend=gpu, or force it with force=1$"):
        verify_cell(SPEC, "large", big, "emulator")
    check_work(SPEC.name, "large", big, "gpu", force=False)  # a GPU has no budget
    check_work(SPEC.name, "large", big, "emulator", force=True)
    check_work(SPEC.name, "tails", SHAPE, "emulator", force=False)


def test_heartbeat_prints_while_a_long_cell_runs(capsys):
    with heartbeat("k smoke/x", expected_s=100.0, every=0.02):
        time.sleep(0.1)
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(re.fullmatch(r"k smoke/x: \d+ s of about 100 s", line) for line in lines)
    with heartbeat("quiet", expected_s=0.01, every=0.02):
        time.sleep(0.05)
    assert capsys.readouterr().out == ""


def test_a_worker_whose_code_differs_from_the_drivers_is_refused(artifacts):
    """run_cell as an executor runs it: the driver's inputs hash must be the worker's own."""
    from hslm_ptx.pipeline.core.models import EmitResult
    from hslm_ptx.pipeline.stages.verify import cell_inputs
    from hslm_ptx.pipeline.stages.verify import run_cell

    emitted = read_model(config.emit_json(SPEC.name), EmitResult)
    ptx = config.ptx_path(SPEC.name).read_text()
    same = cell_inputs(SPEC.name, SHAPE, "emulator")
    assert run_cell(SPEC.name, "tails", SHAPE, "emulator", False, ptx, emitted, same).passed
    with pytest.raises(UserError, match="this worker's reference, emulator or launch code differs from the driver's"):
        run_cell(SPEC.name, "tails", SHAPE, "emulator", False, ptx, emitted, "0" * 64)
