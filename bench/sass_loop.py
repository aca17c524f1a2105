"""SASS per tensor-core op in each kernel's steady-state loop: a benchmark that prints.

    python bench/sass_loop.py                  # every kernel, sm_89
    python bench/sass_loop.py --arch sm_80 hslm_fwd_s8

Assembles each kernel's PTX with ptxas, disassembles the cubin with nvdisasm
(``pip install nvidia-cuda-nvdisasm``; found as $NVDISASM or in that wheel) and walks
every loop (a branch back to an earlier address) from its head along the path that
takes unconditional branches and falls through conditional ones (the steady state:
the no-tail path), up to its back edge. It prints the instructions on that path, the
IMMA among them, SASS per IMMA and memory (LSU) instructions per IMMA. These are
static counts of the machine code, not GPU time.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kernels.registry import KERNELS  # noqa: E402
from pipeline.ptxas import find_ptxas  # noqa: E402

LINE = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
LABEL = re.compile(r"^(\.L_x_\d+):")
TARGET = re.compile(r"`\((\.L_x_\d+)\)")
LSU = {"LDG", "STG", "LDS", "STS", "LDSM", "LDGSTS", "LD", "ST", "ATOM", "ATOMG", "ATOMS", "RED"}


def find_nvdisasm() -> str:
    if os.environ.get("NVDISASM"):
        return os.environ["NVDISASM"]
    spec = importlib.util.find_spec("nvidia")
    for base in spec.submodule_search_locations if spec else []:
        for hit in Path(base).glob("cu*/bin/nvdisasm"):
            return str(hit)
    sys.exit("error: nvdisasm not found; pip install nvidia-cuda-nvdisasm (or set NVDISASM)")


def disassemble(ptx: str, arch: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        src, cubin = Path(tmp) / "k.ptx", Path(tmp) / "k.cubin"
        src.write_text(ptx)
        subprocess.run([find_ptxas(), f"-arch={arch}", "-o", str(cubin), str(src)], check=True)
        return subprocess.run([find_nvdisasm(), "-c", str(cubin)], check=True,
                              capture_output=True, text=True).stdout


def instructions(sass: str) -> tuple[list[tuple[str, bool, str]], dict[str, int]]:
    """[(opcode, guarded, branch target label or "")], label -> index."""
    out, labels = [], {}
    for line in sass.splitlines():
        label = LABEL.match(line.strip())
        if label:
            labels[label.group(1)] = len(out)
            continue
        m = LINE.search(line)
        if m and m.group(3) != "NOP":
            target = TARGET.search(m.group(4))
            out.append((m.group(3).split(".")[0], bool(m.group(2)), target.group(1) if target else ""))
    return out, labels


def loops(sass: str) -> list[tuple[int, int, int]]:
    """Per loop with IMMA: (instructions, IMMA, LSU) along its steady-state path."""
    ins, labels = instructions(sass)
    found = []
    for end, (op, _, target) in enumerate(ins):
        if op != "BRA" or not target or labels[target] > end:
            continue
        i, path = labels[target], []
        while i <= end and len(path) <= len(ins):
            op_i, guarded, tgt = ins[i]
            path.append(op_i)
            if i == end:
                break
            i = labels[tgt] if op_i == "BRA" and tgt and not guarded and labels[tgt] > i else i + 1
        imma = path.count("IMMA")
        if imma:
            found.append((len(path), imma, sum(op in LSU for op in path)))
    return found


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("kernels", nargs="*", default=list(KERNELS))
    ap.add_argument("--arch", default="sm_89")
    args = ap.parse_args()
    print(f"{'kernel':<16} {'arch':<6} {'loop':>4} {'SASS':>5} {'IMMA':>5} {'LSU':>4} "
          f"{'SASS/IMMA':>9} {'LSU/IMMA':>8}")
    for name in args.kernels:
        for n, (total, imma, lsu) in enumerate(loops(disassemble(KERNELS[name].emit(), args.arch))):
            print(f"{name:<16} {args.arch:<6} {n:>4} {total:>5} {imma:>5} {lsu:>4} "
                  f"{total / imma:>9.2f} {lsu / imma:>8.2f}")


if __name__ == "__main__":
    main()
