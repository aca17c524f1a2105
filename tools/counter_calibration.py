"""Nsight Compute's counters beside the CPU emulator's own figures, kernel by kernel, on
the same shape and inputs: what calibrates the emulator's traffic model.

    python3 tools/counter_calibration.py metrics [QUERY.txt]          (the --metrics list for ncu)
    python3 tools/counter_calibration.py emulate KERNELS SHAPE --out EMU.json [--jobs N]
    python3 tools/counter_calibration.py compare NCU.csv EMU.json --out CAL.json

``emulate`` runs each kernel's PTX once on the emulator (hslm_ptx.emu) with the verify
cell's inputs (tools/one_launch.py launches the same ones under ncu) and turns its launch
counts into the totals ncu reports under the names of :data:`EMULATED`: warp
instructions and mma executed, global requests and 32-byte sectors per instruction kind
(ld, st, red, cp.async), shared wavefronts and bank conflicts (wavefronts beyond the
conflict-free minimum) for ld.shared, st.shared and ldmatrix. ``compare`` puts the two
side by side with their ratio, ncu over emulator; a figure only one side has is listed
with the other empty. The PTX the emulator counts is not the SASS the GPU runs: the
instruction ratio is the SASS per PTX instruction, and the memory ratios are 1.0 where
the emulator's model (ptxemu/traffic.py) matches the hardware.
Bad input (a missing file, an unknown kernel or shape): one line, exit 2.
"""
from __future__ import annotations

import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
sys.path.insert(0, str(Path(__file__).resolve().parent))  # one_launch, beside this file

import numpy as np  # noqa: E402

from hslm_ptx.pipeline.core.artifacts import read_json, write_model

from hslm_ptx.pipeline.core.files import rel, write_atomic  # noqa: E402
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402
from hslm_ptx.pipeline.bench.counters import METRICS, available, left_out, parse_ncu_csv  # noqa: E402
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402
from hslm_ptx.pipeline.core.models import Record  # noqa: E402

# the extra names asked for beside hslm_ptx.pipeline.bench.counters.METRICS (the emulator counts them too)
EXTRA_METRICS = ("l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum",
                 "l1tex__t_requests_pipe_lsu_mem_global_op_red.sum",
                 "l1tex__t_sectors_pipe_lsu_mem_global_op_red.sum")
_GLOBAL = {"ld.global": "op_ld", "st.global": "op_st", "red.global": "op_red", "cp.async": "op_ldgsts"}
_SHARED = {"ld.shared": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
                         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
                         "smsp__inst_executed_op_shared_ld.sum"),
           "st.shared": ("l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
                         "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
                         "smsp__inst_executed_op_shared_st.sum"),
           "ldmatrix": ("sm__sass_l1tex_data_pipe_lsu_wavefronts_mem_shared_op_ldsm.sum",
                        "sm__sass_l1tex_data_bank_conflicts_pipe_lsu_mem_shared_op_ldsm.sum",
                        "smsp__sass_inst_executed_op_ldsm.sum")}
# ncu metric -> what the emulator's figure under that name is
EMULATED: dict[str, str] = {
    "smsp__inst_executed.sum": "PTX warp instructions (ncu: SASS)",
    "sm__inst_executed_pipe_tensor_op_imma.sum": "mma.sync executed (warp level)",
    **{f"l1tex__t_{kind}_pipe_lsu_mem_global_{op}.sum": f"{opcode} {kind}"
       for opcode, op in _GLOBAL.items() for kind in ("requests", "sectors")},
    **{name: f"{opcode} {what}" for opcode, names in _SHARED.items()
       for name, what in zip(names, ("wavefronts", "bank conflicts", "instructions"))},
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum": "shared bank conflicts, every shared access",
}


class CalibrationRow(Record):
    kernel: str
    metric: str
    emulator_figure: str
    ncu: float | None
    emulator: float | None
    ratio: float | None  # ncu / emulator


class Calibration(Record):
    shape: str
    rows: list[CalibrationRow]


def emulated_figures(stats: Any) -> dict[str, float]:
    """ncu metric name -> the emulator's total for it, from one launch's LaunchStats."""
    out: dict[str, float] = {"smsp__inst_executed.sum": stats.warp_instructions,
                             "sm__inst_executed_pipe_tensor_op_imma.sum": stats.by_opcode.get("mma", 0)}
    conflicts_all = 0
    for row in stats.memory:
        kind = ".".join(row.opcode.split(".")[:2]) if row.opcode.startswith(("ld.", "st.", "red.", "cp.")) \
            else row.opcode.split(".")[0]
        if kind in _GLOBAL:
            for field in ("requests", "sectors"):
                name = f"l1tex__t_{field}_pipe_lsu_mem_global_{_GLOBAL[kind]}.sum"
                out[name] = out.get(name, 0) + getattr(row, field)
        elif kind in _SHARED:
            wavefronts, conflicts, instructions = _SHARED[kind]
            out[wavefronts] = out.get(wavefronts, 0) + row.wavefronts
            out[conflicts] = out.get(conflicts, 0) + row.wavefronts - row.ideal_wavefronts
            out[instructions] = out.get(instructions, 0) + row.requests
        if row.space == "shared":
            conflicts_all += row.wavefronts - row.ideal_wavefronts
    out["l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"] = conflicts_all
    return out


def emulate_one(name: str, shape_text: str) -> tuple[str, dict[str, float] | str]:
    """(kernel, its figures) or (kernel, why it could not run), on the emulator."""
    from hslm_ptx.runtime import backends
    from hslm_ptx.runtime.launch import launch_outputs
    from hslm_ptx.catalog.registry import KERNELS
    from hslm_ptx.kernel.spec import Dims
    from one_launch import find_shape
    from hslm_ptx.pipeline.stages.verify import launch_stats, one_line, seed

    try:
        shape = find_shape(shape_text)
        spec, dims = KERNELS[name], Dims(shape.R, shape.K, shape.N)
        inputs = spec.make_inputs(dims, np.random.default_rng(seed(name, shape)))
        fn = backends.load_ptx("emulator", spec.emit(), name)
        launch_outputs(spec, fn, dims, inputs, np)
        return name, emulated_figures(launch_stats(fn))
    except Exception as exc:  # one kernel's failure is its own line; the others still count
        return name, f"emulator: {one_line(exc)}"


def compare(ncu: dict[str, dict[str, float]], emulated: dict[str, Any], shape: str) -> Calibration:
    rows = []
    for kernel in list(dict.fromkeys([*emulated, *ncu])):
        mine = emulated.get(kernel) if isinstance(emulated.get(kernel), dict) else {}
        theirs = ncu.get(kernel, {})
        for metric, figure in EMULATED.items():
            a, b = theirs.get(metric), mine.get(metric)
            if a is None and b is None:
                continue
            rows.append(CalibrationRow(kernel=kernel, metric=metric, emulator_figure=figure, ncu=a, emulator=b,
                                       ratio=round(a / b, 4) if a is not None and b else None))
    return Calibration(shape=shape, rows=rows)


def table(cal: Calibration) -> str:
    """Markdown, one line per kernel and figure."""
    def num(v: float | None) -> str:
        return "-" if v is None else f"{v:g}"

    lines = [f"counters on {cal.shape}: ncu beside the emulator", "",
             "| kernel | ncu metric | emulator figure | ncu | emulator | ncu / emulator |",
             "| --- | --- | --- | ---: | ---: | ---: |"]
    lines += [f"| {r.kernel} | {r.metric} | {r.emulator_figure} | {num(r.ncu)} | {num(r.emulator)} | {num(r.ratio)} |"
              for r in cal.rows]
    return "\n".join(lines) + "\n"


def parser() -> OneLineParser:
    p = OneLineParser(prog="python3 tools/counter_calibration.py",
                      description="Nsight Compute's counters beside the emulator's figures.")
    sub = p.add_subparsers(dest="command", required=True, metavar="{metrics,emulate,compare}")
    m = sub.add_parser("metrics", help="the comma list for ncu --metrics (names the device lacks: stderr)")
    m.add_argument("query", nargs="?", type=Path, help="what `ncu --query-metrics` printed")
    e = sub.add_parser("emulate", help="the emulator's figures for KERNELS (comma list) on SHAPE")
    e.add_argument("kernels")
    e.add_argument("shape")
    e.add_argument("--out", type=Path, required=True)
    e.add_argument("--jobs", type=int, default=1)
    c = sub.add_parser("compare", help="ncu's CSV and the emulator's figures side by side")
    c.add_argument("csv", type=Path)
    c.add_argument("emulated", type=Path)
    c.add_argument("--out", type=Path, required=True)
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    if opts.command == "metrics":
        wanted = (*METRICS, *EXTRA_METRICS)
        query = opts.query.read_text(errors="replace") if opts.query and opts.query.is_file() else ""
        if (line := left_out(query, wanted)) is not None:
            print(line, file=sys.stderr)
        print(",".join(available(query, wanted)))
        return 0
    if opts.command == "emulate":
        from hslm_ptx.catalog.registry import KERNELS
        from one_launch import find_shape, pick_kernels

        names = pick_kernels(opts.kernels)
        find_shape(opts.shape)  # an unknown shape is refused before any work
        with ProcessPoolExecutor(max_workers=max(1, min(opts.jobs, len(names)))) as pool:
            found = dict(pool.map(emulate_one, names, [opts.shape] * len(names)))
        write_atomic(opts.out, json.dumps({"shape": opts.shape, "kernels": found}, indent=1) + "\n")
        bad = [f"{k}: {v}" for k, v in found.items() if isinstance(v, str)]
        print(f"emulated {len(names) - len(bad)} of {len(names)} kernels on {opts.shape} -> {rel(opts.out)}"
              + "".join(f"\n{b}" for b in bad))
        return 1 if bad or not set(names) <= set(KERNELS) else 0
    for path in (opts.csv, opts.emulated):
        if not path.is_file():
            raise UserError(f"{rel(path)}: missing; `ncu --csv --log-file` and `emulate --out` write them")
    emulated = read_json(opts.emulated)
    if not isinstance(emulated, dict) or not isinstance(emulated.get("kernels"), dict):
        raise UserError(f"{rel(opts.emulated)}: expected {{\"shape\": ..., \"kernels\": {{...}}}} "
                        "as `emulate --out` writes it; run emulate again")
    cal = compare(parse_ncu_csv(opts.csv.read_text(errors="replace")), emulated["kernels"],
                  str(emulated.get("shape", "?")))
    write_model(opts.out, cal)
    print(table(cal), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
