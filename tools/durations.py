"""Measure how long the README's commands take here, and write docs/durations.md.

    python tools/durations.py verify-cold   # artifacts/ removed, then `doit verify`
    python tools/durations.py verify-noop   # `doit verify` with nothing to re-run, 8 times
    python tools/durations.py pytest        # the README's test command (CI=true)
    python tools/durations.py verify-ray    # the hslm set of 8 kernels on a Ray cluster of 1, then 2 one-CPU nodes

Each measurement replaces its own row of docs/durations.json (the record) and the page
docs/durations.md is rendered from the record, so a re-measure is a change to those two
generated files and never an edit of the README or another page. Run it on an otherwise
idle machine; the page says which machine and when.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD = ROOT / "docs" / "durations.json"
PAGE = ROOT / "docs" / "durations.md"
COMMANDS = {
    "verify-cold": "doit verify, from nothing (artifacts/ removed first)",
    "verify-noop": "doit verify, nothing to re-run (8 runs)",
    "pytest": "pytest -n auto --dist loadgroup, CI=true",
    "verify-ray": "doit verify executor=ray shape=hslm, 8 kernels (48 cells), 2 one-CPU nodes against 1",
}
RAY_KERNELS = ("hslm_fwd_s8", "hslm_fwd_s8_m32", "hslm_fwd_s8_m32n16", "hslm_dx_s8", "hslm_dx_s8_m32",
               "hslm_dx_s8_m32n16", "hslm_dw_s8", "hslm_dw_s8_m64")


def write_atomic(path: Path, text: str) -> None:
    with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as out:
        out.write(text)
    os.replace(out.name, path)


def run(cmd: list[str], **env: str) -> tuple[float, str]:
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})
    took = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}: exit {done.returncode}; {(done.stdout + done.stderr).strip()[-400:]}")
    return took, done.stdout


def clock(seconds: float) -> str:
    minutes, rest = divmod(round(seconds), 60)
    return f"{minutes} min {rest} s" if minutes else f"{seconds:.2f} s"


def on_cluster(nodes: int) -> float:
    """Wall seconds of the hslm cells of :data:`RAY_KERNELS` on a Ray cluster on this machine:
    a head that runs no cell and ``nodes`` one-CPU nodes (ray.cluster_utils.Cluster), the
    kernels' verify records removed first; the second of two runs (the first starts the
    workers and imports the project there)."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        command = ["doit", "-n", "2", "-P", "thread", *(f"verify:{k}" for k in RAY_KERNELS),
                   "shape=hslm", "executor=ray", f"address={cluster.address}"]
        took = 0.0
        for _ in range(2):
            for kernel in RAY_KERNELS:
                shutil.rmtree(ROOT / "artifacts" / "verify" / kernel, ignore_errors=True)
            took, _ = run(command)
        return took
    finally:
        cluster.shutdown()


SPIN = "x = 0\nfor i in range(20_000_000):\n    x += i\n"


def two_at_once() -> float:
    """This machine's own two-way ceiling: the wall time of two copies of a CPU-bound loop
    run at once over that of the two run one after the other (0.5 on two free cores)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", SPIN], check=True)
    one = time.perf_counter() - start
    start = time.perf_counter()
    pair = [subprocess.Popen([sys.executable, "-c", SPIN]) for _ in range(2)]
    for process in pair:
        process.wait()
    return (time.perf_counter() - start) / (2 * one)


def measure(what: str) -> dict:
    if what == "verify-ray":
        run(["doit", "emit"])
        one, two = on_cluster(1), on_cluster(2)
        ceiling = statistics.median(two_at_once() for _ in range(3))
        return {"figure": f"{two / one:.2f}x ({two:.1f} s against {one:.1f} s)", "seconds": round(two, 1),
                "detail": f"{len(RAY_KERNELS) * 6} cells; this machine runs two CPU-bound processes at once "
                          f"in {ceiling:.2f}x the time of one after the other"}
    if what == "verify-cold":
        shutil.rmtree(ROOT / "artifacts", ignore_errors=True)
        took, out = run(["doit", "verify"])
        return {"figure": clock(took), "seconds": round(took, 1), "detail": out.strip().splitlines()[-1][:200]}
    if what == "verify-noop":
        times = [run(["doit", "verify"])[0] for _ in range(8)]
        return {"figure": f"median {statistics.median(times):.2f} s ({min(times):.2f}-{max(times):.2f} s)",
                "seconds": round(statistics.median(times), 2), "detail": "8 runs"}
    took, out = run([sys.executable, "-m", "pytest", "-n", "auto", "--dist", "loadgroup"], CI="true")
    summary = [line for line in out.splitlines() if " passed" in line]
    return {"figure": clock(took), "seconds": round(took, 1), "detail": summary[-1].strip("= ") if summary else ""}


def render(record: dict) -> str:
    lines = ["# Durations", "", "Generated by `python tools/durations.py <command>` (do not edit): how long the",
             "README's commands took on the machine named, each measured by that command.", "",
             "| command | took | detail | machine | measured |", "| --- | --- | --- | --- | --- |"]
    for key, text in COMMANDS.items():
        row = record.get(key)
        if row:
            lines.append(f"| {text} | {row['figure']} | {row['detail']} | {row['machine']} | {row['when']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=sorted(COMMANDS))
    args = parser.parse_args(argv)
    record = json.loads(RECORD.read_text()) if RECORD.is_file() else {}
    row = measure(args.command)
    row["machine"] = f"{os.cpu_count()} cores, {platform.machine()}, Python {platform.python_version()}"
    row["when"] = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    record[args.command] = row
    write_atomic(RECORD, json.dumps(record, indent=1, sort_keys=True) + "\n")
    write_atomic(PAGE, render(record))
    print(f"{args.command}: {row['figure']} ({row['detail']}) -> {PAGE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
