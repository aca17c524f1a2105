"""The bench record rendered: markdown tables, CSV, the plot, and the files beside the record.

No GPU is needed, so all of it is tested on the CPU against recorded sample data
(tests/data/bench/sample_*.json, marked ``synthetic``).
``python -m hslm_ptx.pipeline.bench.report FILE.json [PREDICTIONS.json] [--out DIR]`` re-renders a
record's markdown, CSV and PNG (beside it, or in DIR), with a performance model's
predictions when given. The PNG needs matplotlib; where it is not importable (a bare GPU
image) the plot is left out with one line and the rest is written.
"""
from __future__ import annotations

import csv
import io
import sys
from pathlib import Path

from hslm_ptx.catalog.registry import KERNELS, choose
from hslm_ptx.kernel.spec import Dims
from hslm_ptx.pipeline.core.artifacts import read_model, write_model
from hslm_ptx.pipeline.core.files import rel, write_atomic
from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli
from hslm_ptx.pipeline.bench.record import IMPLS, BenchReport, Row, Timing, load_predictions, with_predictions
from hslm_ptx.pipeline.core.errors import UserError
from hslm_ptx.pipeline.core.models import Record


SYNTHETIC_BANNER = (
    "> **SYNTHETIC SAMPLE DATA: not a measurement.** These numbers were made up to test "
    "the report code; no GPU ran them."
)


def _us(t: Timing | None) -> str:
    return f"{t.median_us:.2f}" if t else "-"


def _spread(t: Timing | None) -> str:
    return f"{t.p10_us:.2f}-{t.p90_us:.2f}" if t else "-"


def _num(x: float | None, fmt: str) -> str:
    return format(x, fmt) if x is not None else "-"


def _check(row: Row) -> str:
    if row.error:
        return "not run" if row.not_run else "FAILED"
    if row.check is None:
        return "-"
    if row.check.tolerance == 0:
        return "exact" if row.check.passed else f"WRONG (max err {row.check.max_abs_err:g})"
    verdict = "ok" if row.check.passed else "WRONG"
    return f"{verdict} rel {row.check.rel_err:.1e}"


def markdown(report: BenchReport) -> str:
    """The bench table: per kernel, one line per shape x implementation, then the summary."""
    dev = report.device
    lines = [f"# bench: shape set `{report.shape_set}`", ""]
    if report.synthetic:
        lines += [SYNTHETIC_BANNER, ""]
    if not report.complete or report.stopped:
        lines += [f"> **Partial record** ({len(report.rows)} rows"
                  + ("" if report.complete else ", the run did not finish")
                  + (f"; {report.stopped}" if report.stopped else "") + ").", ""]
    clocks = ", ".join(f"{k} {v}" for k, v in dev.clocks.items()) or "not read"
    libs = ", ".join(f"{k} {v}" for k, v in dev.libraries.items())
    peak = (f"{dev.peak_int8_tops:g} TOPS int8 dense, no sparsity ({dev.peak_source})"
            if dev.peak_int8_tops else "unknown for this device (not in PEAKS)")
    m = report.method
    lines += [
        f"- device: {dev.name}, driver {dev.driver or '?'}, CUDA {dev.cuda_runtime or '?'}, "
        f"cc {dev.compute_capability or '?'}, {dev.sm_count or '?'} SMs, "
        f"L2 {dev.l2_bytes / 2**20:.0f} MiB" if dev.l2_bytes else f"- device: {dev.name}",
        f"- clocks ({dev.clocks_source or 'no source'}): {clocks}",
        f"- libraries: {libs or '-'}",
        f"- peak: {peak}",
        "- measured int8 ceiling: " + (f"{dev.ceiling_int8_tops:.0f} TOPS ({dev.ceiling_source})"
                                        if dev.ceiling_int8_tops else dev.ceiling_source or "not measured"),
        f"- method: {m.warmup} warm-up, {m.repeats} timed samples of >= {m.target_sample_us:g} us "
        f"each; {m.timer}; working set rotated over >= {m.l2_multiple:g}x L2; "
        f"{m.baseline_operands}",
        f"- created {report.created}",
        "",
        "Times are device microseconds per call: median (p10-p90) over samples. `graph` is "
        "the same launches replayed from a CUDA graph (launch overhead removed). "
        "GOP/s counts 2*R*K*N. Ratio = ours / best correct baseline (time; < 1: ours faster). "
        "`model us` is the performance model's prediction for ours, where one was given.",
        "",
    ]
    for kernel in dict.fromkeys(r.kernel for r in report.rows):
        lines += [f"## {kernel}", "",
                  "| shape | R x K x N | impl | us | p10-p90 | graph us | model us | GOP/s "
                  "| % int8 peak | check | sets | note |",
                  "| --- | --- | --- | ---: | --- | ---: | ---: | ---: | ---: | --- | ---: | --- |"]
        for r in (r for r in report.rows if r.kernel == kernel):
            rate = r.gops()
            frac = rate / (dev.peak_int8_tops * 1e3) if rate and dev.peak_int8_tops else None
            note = "; ".join(x for x in (r.note, r.error and f"error: {r.error}",
                                         r.graph_error and f"graph: {r.graph_error}") if x)
            lines.append(
                f"| {r.shape} | {r.R}x{r.K}x{r.N} | {r.impl} | {_us(r.stream)} | "
                f"{_spread(r.stream)} | {_us(r.graph)} | {_num(r.model_us, '.2f')} | "
                f"{_num(rate, '.0f')} | "
                f"{_num(frac and frac * 100, '.2f')} | {_check(r)} | {r.buffer_sets} | {note} |")
        lines.append("")
    lines += race_lines(report)
    lines += ["## summary: ours / best baseline", "",
              "| kernel | shape | ours us | model us | best baseline | its us | ratio "
              "| ours graph us | best graph | its us | graph ratio | GOP/s | % int8 peak |",
              "| --- | --- | ---: | ---: | --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    for s in report.summary:
        lines.append(
            f"| {s.kernel} | {s.shape} | {_num(s.ours_us, '.2f')} | {_num(s.model_us, '.2f')} | "
            f"{s.best_baseline or '-'} | "
            f"{_num(s.best_us, '.2f')} | {_num(s.ratio, '.2f')} | {_num(s.ours_graph_us, '.2f')} | "
            f"{s.best_graph_baseline or '-'} | {_num(s.best_graph_us, '.2f')} | "
            f"{_num(s.graph_ratio, '.2f')} | {_num(s.gops, '.0f')} | "
            f"{_num(s.peak_fraction and s.peak_fraction * 100, '.2f')} |")
    return "\n".join(lines) + "\n"


class ConfigurationRace(Record):
    """One family on one shape: its configurations' measured times, the fastest, and the one
    the tile rule picks (hslm_ptx.catalog.registry.choose), so a GPU run shows whether the rule is right."""

    family: str
    shape: str
    times_us: dict[str, float]  # configuration -> median us, correct runs only
    fastest: str
    chosen: str


def configuration_races(report: BenchReport) -> list[ConfigurationRace]:
    """Per family and shape with two or more correct configurations timed."""
    races = []
    families = {name: spec.family_name for name, spec in KERNELS.items()}
    for family in dict.fromkeys(families.values()):
        for shape in dict.fromkeys(r.shape for r in report.rows):
            rows = [r for r in report.rows if r.impl == "ours" and r.shape == shape and r.ok
                    and families.get(r.kernel) == family]
            if len(rows) < 2:
                continue
            times = {r.kernel: r.stream.median_us for r in rows}
            races.append(ConfigurationRace(family=family, shape=shape, times_us=times,
                                           fastest=min(times, key=times.get),
                                           chosen=choose(family, Dims(rows[0].R, rows[0].K, rows[0].N)).name))
    return races


def race_lines(report: BenchReport) -> list[str]:
    """The markdown section of :func:`configuration_races` (nothing when no family raced)."""
    races = configuration_races(report)
    if not races:
        return []
    lines = ["## configurations: the fastest measured and the rule's pick", "",
             "| family | shape | times us | fastest | rule picks | rule right |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in races:
        times = ", ".join(f"{k} {v:.2f}" for k, v in r.times_us.items())
        lines.append(f"| {r.family} | {r.shape} | {times} | {r.fastest} | {r.chosen} | "
                     f"{'yes' if r.fastest == r.chosen else 'no'} |")
    return lines + [""]


CSV_COLUMNS = ("kernel", "shape", "R", "K", "N", "impl", "gemm", "disposition", "us", "p10_us",
               "p90_us", "graph_us", "model_us", "gops", "pct_int8_peak", "max_abs_err", "rel_err",
               "tolerance", "buffer_sets", "calls_per_sample", "note", "error", "graph_error")


def csv_text(report: BenchReport) -> str:
    """One line per row with its disposition (passed / incorrect / failed / not_run); empty
    cells where a figure does not exist. Full precision: the table rounds, this does not."""
    peak = report.device.peak_int8_tops
    buf = io.StringIO()
    out = csv.writer(buf, lineterminator="\n")
    out.writerow(CSV_COLUMNS)
    for r in report.rows:
        rate = r.gops()
        c = r.check
        out.writerow([
            r.kernel, r.shape, r.R, r.K, r.N, r.impl, "x".join(map(str, r.gemm)), r.disposition,
            r.stream.median_us if r.stream else "", r.stream.p10_us if r.stream else "",
            r.stream.p90_us if r.stream else "", r.graph.median_us if r.graph else "",
            "" if r.model_us is None else r.model_us, "" if rate is None else rate,
            rate / (peak * 1e3) * 100 if rate and peak else "",
            c.max_abs_err if c else "", c.rel_err if c else "", c.tolerance if c else "",
            r.buffer_sets, r.stream.calls_per_sample if r.stream else "", r.note, r.error or "",
            r.graph_error or ""])
    return buf.getvalue()


# ---------------------------------------------------------------- plot

class Bar(Record):
    """One implementation's bar in the plot: where it goes and what it shows."""

    kernel: str
    group: str  # the shape, "name\nR x K x N"
    impl: str
    disposition: str
    us: float | None  # stream median: the bar's height (None: no bar, a label instead)
    p10_us: float | None
    p90_us: float | None
    graph_us: float | None  # graph replay, drawn as a marker on the bar
    model_us: float | None  # the model's prediction, drawn as a marker


def bars(report: BenchReport) -> list[Bar]:
    """Every row as a bar: a time when it ran (a wrong result is still drawn, and marked),
    a label in place of the bar when it failed or did not run."""
    out = []
    for r in report.rows:
        t = r.stream if r.stream and r.disposition in ("passed", "incorrect") else None
        out.append(Bar(kernel=r.kernel, group=f"{r.shape}\n{r.R}x{r.K}x{r.N}", impl=r.impl,
                       disposition=r.disposition, us=t and t.median_us, p10_us=t and t.p10_us,
                       p90_us=t and t.p90_us, graph_us=r.graph.median_us if t and r.graph else None,
                       model_us=r.model_us))
    return out


PLOT_LABELS = {"incorrect": "WRONG", "failed": "failed", "not_run": "not run"}


def plot_png(report: BenchReport) -> bytes:
    """Grouped bars per shape (one bar per implementation), log time, one panel per kernel:
    stream median with p10-p90, graph replay and the model's prediction as markers, WRONG
    bars hatched and labelled, failed and not-run rows labelled where their bar would be."""
    import matplotlib  # optional: only needed to draw

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    plan = bars(report)
    kernels = list(dict.fromkeys(b.kernel for b in plan))
    colors = dict(zip(IMPLS, ("#d62728", "#1f77b4", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b")))
    timed = [v for b in plan for v in (b.p10_us, b.graph_us, b.model_us) if v]
    floor = min(timed, default=1.0) / 2
    width = 0.8 / len(IMPLS)
    groups_max = max(len({b.group for b in plan if b.kernel == k}) for k in kernels) if kernels else 1
    size = (max(6.0, 1.6 * groups_max + 1) + 2.2, 4.2 * len(kernels))  # + room for the legend
    fig, axes = plt.subplots(len(kernels), 1, figsize=size, squeeze=False)
    for ax, kernel in zip(axes[:, 0], kernels):
        mine = [b for b in plan if b.kernel == kernel]
        groups = list(dict.fromkeys(b.group for b in mine))
        for b in mine:
            x = groups.index(b.group) + (IMPLS.index(b.impl) - (len(IMPLS) - 1) / 2) * width
            if b.us is None:
                ax.text(x, floor * 1.15, PLOT_LABELS.get(b.disposition, b.disposition), rotation=90,
                        ha="center", va="bottom", fontsize=7, color="dimgray")
            else:
                wrong = b.disposition == "incorrect"
                ax.bar(x, b.us - floor, width, bottom=floor, color=colors[b.impl],
                       alpha=0.35 if wrong else 0.9, hatch="xx" if wrong else None,
                       edgecolor="red" if wrong else colors[b.impl],
                       yerr=[[b.us - b.p10_us], [b.p90_us - b.us]], capsize=2)
                if wrong:
                    ax.text(x, b.p90_us * 1.1, "WRONG", rotation=90, ha="center", va="bottom",
                            fontsize=7, color="red", fontweight="bold")
            if b.graph_us:
                ax.plot([x], [b.graph_us], marker="_", markersize=9, mew=2.5, color="black")
            if b.model_us:
                ax.plot([x], [b.model_us], marker="*", markersize=9, color="gold", mec="black")
        ax.set_yscale("log")
        ax.set_xlim(-0.5, len(groups) - 0.5)
        ax.set_xticks(range(len(groups)), groups, fontsize=8)
        ax.set_ylabel("us per call, log (median, p10-p90)")
        ax.set_title(kernel)
        ax.grid(True, axis="y", which="both", alpha=0.3)
        handles = [plt.Rectangle((0, 0), 1, 1, color=colors[i]) for i in IMPLS]
        handles += [plt.Line2D([], [], marker="_", mew=2.5, markersize=9, color="black", ls=""),
                    plt.Line2D([], [], marker="*", markersize=9, color="gold", mec="black", ls="")]
        ax.legend(handles, list(IMPLS) + ["graph replay", "model"], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0))
    title = f"bench {report.shape_set} on {report.device.name}"
    if report.synthetic:
        title = "SYNTHETIC SAMPLE DATA, NOT A MEASUREMENT\n" + title
    fig.suptitle(title, color="red" if report.synthetic else "black")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    return buf.getvalue()


OUTPUT_SUFFIXES = (".json", ".md", ".csv", ".png")


def output_paths(folder: Path, stem: str) -> list[Path]:
    """<stem>.json, .md, .csv, .png under ``folder``."""
    return [Path(folder) / f"{stem}{suffix}" for suffix in OUTPUT_SUFFIXES]


def write_outputs(report: BenchReport, folder: Path, stem: str | None = None,
                  json_too: bool = True) -> list[Path]:
    """The record and what is rendered from it, atomically; returns the paths written (the
    PNG is left out, with one line, where matplotlib is not importable)."""
    paths = output_paths(folder, stem or report.shape_set)
    if json_too:
        write_model(paths[0], report)
    write_atomic(paths[1], markdown(report))
    write_atomic(paths[2], csv_text(report))
    written = paths if json_too else paths[1:]
    try:
        png = plot_png(report)
    except ImportError as exc:  # matplotlib is optional (the `plot` extra)
        print(f"{rel(paths[3])}: not drawn, matplotlib is not importable ({exc}); "
              "re-render it elsewhere with python -m hslm_ptx.pipeline.bench.report", flush=True)
        return written[:-1]
    write_atomic(paths[3], png)
    return written


def parser() -> OneLineParser:
    p = OneLineParser(prog="python -m hslm_ptx.pipeline.bench.report",
                      description="Re-render a bench record's markdown, CSV and PNG.")
    p.add_argument("record", type=Path, help="the bench record (bench-<set>.json)")
    p.add_argument("predictions", nargs="?", type=Path,
                   help="a prediction file (`doit model`): fills model_us, and the record is rewritten with it")
    p.add_argument("--out", type=Path, help="folder for what is written (default: beside the record)")
    return p


def _main(args: list[str]) -> int:
    opts = parser().parse_args(args)
    path = opts.record
    if opts.out is not None and opts.out.exists() and not opts.out.is_dir():
        raise UserError(f"--out {opts.out}: not a folder; give the folder the markdown, CSV and PNG are written in")
    report = read_model(path, BenchReport)
    preds = load_predictions(opts.predictions) if opts.predictions else None
    if preds is not None:
        report = with_predictions(report, preds)
    for written in write_outputs(report, opts.out or path.parent, path.stem, json_too=preds is not None):
        print(f"wrote {rel(written)}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m hslm_ptx.pipeline.bench.report FILE.json [PREDICTIONS.json] [--out DIR]``: re-render the
    markdown, CSV and PNG beside FILE or in DIR (and FILE itself, or its copy in DIR, with
    the predictions filled in)."""
    return run_cli(_main, argv)


if __name__ == "__main__":
    sys.exit(main())
