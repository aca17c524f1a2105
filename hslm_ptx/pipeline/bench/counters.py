"""Nsight Compute counters for one launch of each kernel: which to ask for, and what they say.

The CPU emulator counts per-kernel figures (warp instructions, global and shared loads
per mma); the same figures read from the hardware calibrate it. tools/on-device.sh asks
``ncu --metrics`` for :data:`METRICS`, keeping only the names the device's ncu lists
(``ncu --query-metrics``), since one unknown name makes ncu profile nothing; the names
left out are said on stderr, never dropped in silence. This module then turns the CSV
ncu wrote into ratios per kernel (:func:`derive`).

Since sm_80 the staged operand loads have counters of their own: ``cp.async`` runs as
LDGSTS (global to shared, no register) and ``ldmatrix`` as LDSM, and neither is counted
by the plain global-load (``op_ld``) or shared-load metrics; those see only the direct
loads and the epilogue. The LDGSTS and LDSM names below are the ones Nsight Compute's
Profiling Guide ("Metrics Decoder": ``op_ldgsts``, ``op_ldsm``, the ``sm__sass_``
instrumented counters) and public ``ncu --metrics`` lists for sm_80 / sm_90 use; the
run-time filter says which the device's ncu does not list.

``python -m hslm_ptx.pipeline.bench.counters metrics [QUERY.txt]`` prints the comma list to pass;
``python -m hslm_ptx.pipeline.bench.counters table NCU.csv [--out FILE.md]`` prints the ratios.
"""
from __future__ import annotations

import csv
import io
import re
import sys
from pathlib import Path

from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli

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
    # cp.async (LDGSTS): the staged A / dY / X tiles; .cg is the L1-bypassing form
    "smsp__inst_executed_op_ldgsts.sum": "LDGSTS (cp.async) instructions",
    "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum": "LDGSTS global requests",
    "l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum": "LDGSTS global sectors (32 B)",
    "sm__sass_l1tex_t_requests_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum":
        "LDGSTS.BYPASS (cp.async.cg) global requests, instrumented",
    "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum":
        "LDGSTS.BYPASS (cp.async.cg) global sectors (32 B), instrumented",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum": "LDGSTS shared-side wavefronts",
    # ldmatrix (LDSM): the fragments read from the staged tiles
    "smsp__sass_inst_executed_op_ldsm.sum": "LDSM (ldmatrix) instructions, instrumented",
    "sm__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum": "LDSM wavefronts, instrumented",
    "sm__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum":
        "LDSM bank conflicts, instrumented",
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
    "cp.async instructions per mma": ("smsp__inst_executed_op_ldgsts.sum",
                                      "sm__inst_executed_pipe_tensor_op_imma.sum"),
    "cp.async sectors per request": ("l1tex__t_sectors_pipe_lsu_mem_global_op_ldgsts.sum",
                                     "l1tex__t_requests_pipe_lsu_mem_global_op_ldgsts.sum"),
    "cp.async.cg sectors per request": (
        "sm__sass_l1tex_t_sectors_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum",
        "sm__sass_l1tex_t_requests_pipe_lsu_mem_global_op_ldgsts_cache_bypass.sum"),
    "cp.async shared wavefronts per instruction": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ldgsts.sum",
                                                   "smsp__inst_executed_op_ldgsts.sum"),
    "ldmatrix instructions per mma": ("smsp__sass_inst_executed_op_ldsm.sum",
                                      "sm__inst_executed_pipe_tensor_op_imma.sum"),
    "ldmatrix wavefronts per instruction": ("sm__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
                                            "smsp__sass_inst_executed_op_ldsm.sum"),
}


def listed_names(query_text: str) -> set[str]:
    """The metric base names an ``ncu --query-metrics`` listing names."""
    return set(re.findall(r"^\s*([a-z0-9_]+__[a-z0-9_]+)", query_text, flags=re.M))


def available(query_text: str, wanted: tuple[str, ...] = tuple(METRICS)) -> list[str]:
    """The names in ``wanted`` whose base (before the first '.') ``ncu --query-metrics``
    listed; all of them when the listing names none (it could not be read)."""
    listed = listed_names(query_text)
    keep = [m for m in wanted if m.split(".")[0] in listed]
    return keep or list(wanted)


def left_out(query_text: str, wanted: tuple[str, ...] = tuple(METRICS)) -> str | None:
    """One line naming what :func:`available` leaves out of ``wanted``, or None when nothing."""
    if not listed_names(query_text):
        return ("ncu --query-metrics listed no metric names (its output could not be read): "
                f"asking for all {len(wanted)}, unchecked")
    keep = available(query_text, wanted)
    missing = [m for m in wanted if m not in keep]
    if not missing:
        return None
    return (f"ncu does not list {len(missing)} of the {len(wanted)} metrics, left out: "
            + ", ".join(missing))


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


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.bench.counters",
                      description="The Nsight Compute counters tools/on-device.sh asks for, and their ratios.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{metrics,core,table}")
    m = sub.add_parser("metrics", help="print the comma list of metrics to pass to ncu --metrics; "
                                       "the names the listing lacks go to stderr")
    m.add_argument("query", nargs="?", type=Path,
                   help="what `ncu --query-metrics` printed (without it: every name, unchecked)")
    sub.add_parser("core", help="print the two core counters (the retry when a full list fails)")
    t = sub.add_parser("table", help="the ratios per kernel from an `ncu --csv --log-file` file, as markdown")
    t.add_argument("csv", type=Path, help="the CSV ncu wrote")
    t.add_argument("--out", type=Path, help="write the markdown table here (default: stdout)")
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    if opts.command == "metrics":
        query = opts.query.read_text(errors="replace") if opts.query and opts.query.is_file() else ""
        if opts.query and not opts.query.is_file():
            print(f"{rel(opts.query)}: missing; asking for every metric, unchecked", file=sys.stderr)
        elif (line := left_out(query)) is not None:
            print(line, file=sys.stderr)
        print(",".join(available(query)))
    elif opts.command == "core":
        print(",".join(CORE))
    else:
        if not opts.csv.is_file():
            raise UserError(f"{rel(opts.csv)}: missing; it is what `ncu --csv --log-file` wrote")
        table = ratio_table(derive(parse_ncu_csv(opts.csv.read_text(errors="replace"))))
        if opts.out:
            write_atomic(opts.out, table)
            print(f"wrote {rel(opts.out)}")
        else:
            print(table, end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
