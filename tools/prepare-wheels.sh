#!/usr/bin/env bash
# Run HERE (the CPU machine), from anywhere in the repo, before a device run.
# The GPU machine's python3 (3.12) already has cupy, torch, numpy, pyyaml, matplotlib and
# pytest (KINDS.md) but not doit or pydantic: fetch those as cp312 wheels, with their
# dependencies so pydantic and pydantic-core come as a matching pair, into .whl/, which
# git ignores through .git/info/exclude. Extra package names may be given as arguments.
# Then: device run with carry [".whl"] (see tools/on-device.sh).
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .whl "doit>=0.36" "pydantic>=2.5,<3" "$@"
ls .whl
du -sh .whl
