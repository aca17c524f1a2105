"""Nsight Compute counters for one launch of each kernel: which to ask for, and what they say.

The CPU emulator counts per-kernel figures (warp instructions, global and shared loads
per mma); the same figures read from the hardware calibrate it. tools/on-device.sh asks
``ncu --metrics`` for :data:`METRICS`, keeping only the names the device's ncu lists
(``ncu --query-metrics``), since one unknown name makes ncu profile nothing; this module
then turns the CSV it wrote into ratios per kernel (:func:`derive`).

``python -m pipeline.bench_counters metrics [QUERY.txt]`` prints the comma list to pass;
``python -m pipeline.bench_counters table NCU.csv`` prints the ratios.
"""
from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

from pipeline.artifacts import rel
from pipeline.errors import UserError
from pipeline.bench_cli import run_cli

# name -> what it counts (warp-level unless it says otherwise)
METRICS: dict[str, str] = {
    "gpu__time_duration.sum": "kernel duration, ns (clocks as found: --clock-control none)",
    "smsp__inst_executed.sum": "warp instructions executed",
    "sm__inst_executed_pipe_tensor_op_imma.sum": "IMMA (int8 tensor core) instructions",
    "smsp__inst_executed_op_global_ld.sum": "global load instructions",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum": "global load requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum": "global load sectors (32 B)",
    "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum": "global store requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum": "global store sectors (32 B)",
    "smsp__inst_executed_op_shared_ld.sum": "shared load instructions",
    "smsp__inst_executed_op_shared_st.sum": "shared store instructions",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum": "shared load wavefronts",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum": "shared store wavefronts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum": "shared load bank conflicts",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum": "shared store bank conflicts",
    "dram__bytes_read.sum": "DRAM bytes read",
    "dram__bytes_write.sum": "DRAM bytes written",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy, %",
}
CORE = ("gpu__time_duration.sum", "smsp__inst_executed.sum")  # the retry when a full list fails

# derived figure -> (numerator, denominator), the emulator's figures and the coalescing ones
RATIOS: dict[str, tuple[str, str]] = {
    "warp instructions per mma": ("smsp__inst_executed.sum", "sm__inst_executed_pipe_tensor_op_imma.sum"),
    "global load instructions per mma": ("smsp__inst_executed_op_global_ld.sum",
                                         "sm__inst_executed_pipe_tensor_op_imma.sum"),
    "shared load instructions per mma": ("smsp__inst_executed_op_shared_ld.sum",
                                         "sm__inst_executed_pipe_tensor_op_imma.sum"),
    "global load sectors per request": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
                                        "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum"),
    "global store sectors per request": ("l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
                                         "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum"),
    "shared load wavefronts per instruction": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                                               "smsp__inst_executed_op_shared_ld.sum"),
    "shared store wavefronts per instruction": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
                                                "smsp__inst_executed_op_shared_st.sum"),
}


def available(query_text: str, wanted: tuple[str, ...] = tuple(METRICS)) -> list[str]:
    """The names in ``wanted`` whose base (before the first '.') ``ncu --query-metrics``
    listed; all of them when the listing names none (it could not be read)."""
    listed = set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", query_text, flags=re.M))
    keep = [m for m in wanted if m.split(".")[0] in listed]
    return keep or list(wanted)


def _number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def parse_ncu_csv(text: str) -> dict[str, dict[str, float]]:
    """{kernel: {metric: value}} from ``ncu --csv`` output (details page); lines before
    the header (ncu's own ==PROF== messages) are skipped. Later launches of a kernel
    overwrite earlier ones."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith('"ID"')), None)
    if start is None:
        raise UserError("ncu CSV: no header line starting with \"ID\"; was ncu run with --csv?")
    out: dict[str, dict[str, float]] = {}
    for row in csv.DictReader(io.StringIO("\n".join(lines[start:]))):
        value = _number(row.get("Metric Value") or "")
        if value is not None and row.get("Kernel Name") and row.get("Metric Name"):
            kernel = row["Kernel Name"].split("(")[0].strip()
            out.setdefault(kernel, {})[row["Metric Name"]] = value
    return out


def derive(counters: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """{kernel: {ratio name: value}} for every ratio whose two counters exist (denominator > 0)."""
    return {kernel: {name: found[num] / found[den] for name, (num, den) in RATIOS.items()
                     if found.get(num) is not None and found.get(den)}
            for kernel, found in counters.items()}


def ratio_table(ratios: dict[str, dict[str, float]]) -> str:
    """Markdown: one line per kernel, the ratios (:func:`derive`) as columns."""
    names = [n for n in RATIOS if any(n in r for r in ratios.values())]
    lines = ["| kernel | " + " | ".join(names) + " |", "| --- |" + " ---: |" * len(names)]
    for kernel, found in ratios.items():
        lines.append(f"| {kernel} | " + " | ".join(f"{found[n]:.2f}" if n in found else "-"
                                                    for n in names) + " |")
    return "\n".join(lines) + "\n"


def _main(args: list[str]) -> int:
    if args[:1] == ["metrics"] and len(args) <= 2:
        query = Path(args[1]) if len(args) == 2 else None
        print(",".join(available(query.read_text(errors="replace") if query and query.is_file() else "")))
    elif args == ["core"]:
        print(",".join(CORE))
    elif args[:1] == ["table"] and len(args) == 2:
        path = Path(args[1])
        if not path.is_file():
            raise UserError(f"{rel(path)}: missing; it is what `ncu --csv --log-file` wrote")
        print(ratio_table(derive(parse_ncu_csv(path.read_text(errors="replace")))), end="")
    else:
        print("usage: python -m pipeline.bench_counters metrics [QUERY.txt] | core | table NCU.csv",
              file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
