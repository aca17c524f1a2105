"""The bench as one job of an executor (``doit bench executor=ray devices=sm_89,sm_90``).

A cluster runs one bench per GPU kind: each is a Ray task that asks for one GPU and the
resource naming its arch (hslm_ptx.pipeline.stages.executor), and this function is what
that task runs on the node it lands on. The PTX comes from the driver as text, so what is
timed is what the driver emitted; the bench itself runs as its own process
(``python -m hslm_ptx.pipeline.bench.run``), with its own CUDA context, so a sticky CUDA
error costs that process and the fresh ones it starts, never the Ray worker. The record
goes back as the return value; the driver writes it and its tables. A run cut short
(a time limit, a lost context past its fresh processes) returns the rows it finished.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

from hslm_ptx.pipeline.bench.record import BenchReport
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.config import ROOT
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.runtime.backends import node_name

RECORD_STEM = "bench"


def bench_on_node(shape_set: str, ceiling_n: int, ptx: dict[str, str], predictions: str | None) -> BenchReport:
    """Bench ``ptx`` (kernel -> PTX text) on ``shape_set`` on this node's GPU; the record it wrote."""
    with tempfile.TemporaryDirectory(prefix="hslm-bench-") as tmp:
        folder = Path(tmp)
        (folder / "ptx").mkdir()
        for kernel, text in ptx.items():
            (folder / "ptx" / f"{kernel}.ptx").write_text(text)
        command = [sys.executable, "-m", "hslm_ptx.pipeline.bench.run", shape_set, "--out", str(folder),
                   "--stem", RECORD_STEM, "--ceiling", str(ceiling_n), "--ptx-dir", str(folder / "ptx"),
                   "--kernels", ",".join(ptx)]
        if predictions is not None:
            (folder / "model.json").write_text(predictions)
            command += ["--model", str(folder / "model.json")]
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        record = folder / f"{RECORD_STEM}.json"
        if not record.is_file():
            said = (done.stdout + done.stderr).strip().splitlines()
            raise UserError(f"bench on {node_name()}: exit {done.returncode}, no record; "
                            f"{said[-1] if said else 'it printed nothing'}")
        return read_model(record, BenchReport)
