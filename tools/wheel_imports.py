"""Whether the image's python already has what a wheel carries: tools/on-device.sh installs
a carried wheel only when it does not, so the image's own packages (pytest and the plugins
built for it, pyyaml, ...) are never shadowed by a copy first on the path.

    python3 tools/wheel_imports.py WHEEL

Every top-level module of the wheel (its ``top_level.txt``, else the top-level entries of
its file list) is imported, with nothing of the carried site on the path. Exit 0 when all
import (the image has it: leave the wheel alone), 1 when one does not (install it), 2
when the file is not a readable wheel; one line each way.
"""
from __future__ import annotations

import importlib
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere

from hslm_ptx.pipeline.core.cli import OneLineParser, run_cli  # noqa: E402 (argparse only: runs before any wheel)
from hslm_ptx.pipeline.core.errors import UserError  # noqa: E402


def top_level(wheel: Path) -> list[str]:
    """The importable top-level names a wheel installs."""
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        listed = [n for n in names if n.endswith(".dist-info/top_level.txt")]
        if listed:
            found = zf.read(listed[0]).decode().split()
        else:
            found = [n.split("/")[0] for n in names
                     if not n.split("/")[0].endswith((".dist-info", ".data")) and not n.startswith("__pycache__")]
    tops = [name.split(".")[0] if name.endswith((".py", ".so", ".pyd")) else name for name in found]
    return sorted({name for name in tops if name.isidentifier()})


def main(argv: list[str]) -> int:
    p = OneLineParser(prog="python3 tools/wheel_imports.py",
                      description="Exit 0 when the image's python imports every module a wheel carries.")
    p.add_argument("wheel", type=Path, metavar="WHEEL")
    wheel = p.parse_args(argv).wheel
    try:
        modules = top_level(wheel)
    except (OSError, zipfile.BadZipFile) as exc:
        raise UserError(f"{wheel}: not a readable wheel ({type(exc).__name__}); run tools/prepare-wheels.sh again") \
            from None
    missing = []
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # not there, or there but broken: carry ours
            missing.append(name)
    if missing or not modules:
        print(f"{wheel.name}: the image cannot import {', '.join(missing) or 'anything it names'}")
        return 1
    print(f"{wheel.name}: the image imports {', '.join(modules)}")
    return 0


if __name__ == "__main__":
    sys.exit(run_cli(main))
