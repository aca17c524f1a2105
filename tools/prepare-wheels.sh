#!/usr/bin/env bash
# tools/prepare-wheels.sh: run HERE (a machine with a package index), from anywhere in
# the repository, before a GPU session:   bash tools/prepare-wheels.sh [EXTRA_PACKAGE ...]
#
# The GPU machine's python3 (3.12, x86_64) has cupy, torch, numpy, pyyaml, matplotlib
# and pytest but not doit or pydantic, and it cannot reach a package index. This fetches
# doit and pydantic as cp312 manylinux wheels, with their dependencies (so pydantic and
# pydantic-core come as a matching pair), plus any extra names given, into .whl/ at
# the repository root, and marks .whl/ ignored in git's local exclude file so it is
# never committed. tools/on-device.sh installs whatever it finds in .whl/ on the GPU
# machine; take .whl/ along with the working tree.
# Writes: .whl/*.whl (replacing an earlier .whl/), one line in git's info/exclude.
# Exit: 0 when the wheels are there, non-zero (pip's message) when a download failed.
set -euo pipefail
cd "$(git rev-parse --show-toplevel)"
exclude=$(git rev-parse --git-path info/exclude)  # a worktree's lives in the common git dir
mkdir -p "$(dirname "$exclude")"
grep -qx '/.whl/' "$exclude" 2>/dev/null || echo '/.whl/' >> "$exclude"
rm -rf .whl && mkdir -p .whl
plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
      --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
python3 -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  "${plat[@]}" -d .whl "doit>=0.36" "pydantic>=2.5,<3" "$@"
ls .whl
du -sh .whl
