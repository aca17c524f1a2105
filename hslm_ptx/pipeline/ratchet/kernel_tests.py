"""The kernel-marked tests, run in a fresh pytest under the assert-counting plugin.

The counts (hslm_ptx.pipeline.ratchet.assertcount -> :class:`KernelTestRun`) are what seals and the
ledger's ``tests`` cells use. pytest runs with a pycache of its own (see
hslm_ptx.pipeline.ratchet.assertcount: rewritten modules must have the assertion-pass hook), a fixed
hypothesis seed (a gate verdict must not depend on the examples drawn), and in its
own process group, ended with the run that started it (hslm_ptx.pipeline.core.proc).
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from hslm_ptx.pipeline.core import proc
from hslm_ptx.pipeline.core.artifacts import read_model
from hslm_ptx.pipeline.core.files import rel
from hslm_ptx.pipeline.core.config import ROOT, TESTS_JSON, TESTS_PYCACHE
from hslm_ptx.pipeline.core.errors import ArtifactError
from hslm_ptx.pipeline.core.models import KernelTestRun


def command(out: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-m", "kernel", "-p", "hslm_ptx.pipeline.ratchet.assertcount",
            "-o", "enable_assertion_pass_hook=true", f"--test-counts={out}", "-q",
            "-p", "no:cacheprovider", "--hypothesis-seed=0", *args]


def run_kernel_tests(out: Path = TESTS_JSON, *args: str) -> KernelTestRun:
    """Run them and read the counts back; :class:`ArtifactError` when pytest wrote none
    (it crashed or was misused)."""
    out = Path(out)
    out.unlink(missing_ok=True)
    env = {**os.environ, "PYTHONPYCACHEPREFIX": str(TESTS_PYCACHE)}
    done = proc.run(command(out, *args), cwd=ROOT, env=env)
    if not out.exists():
        tail = (done.stdout + done.stderr).strip().splitlines()[-1:] or ["no output"]
        raise ArtifactError(f"pytest -m kernel wrote no {rel(out)} (exit {done.returncode}): {tail[0]}")
    return read_model(out, KernelTestRun)
