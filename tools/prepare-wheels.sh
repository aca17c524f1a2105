#!/usr/bin/env bash
# tools/prepare-wheels.sh: run HERE (a machine with a package index), from anywhere in
# the repository, before a GPU session:   bash tools/prepare-wheels.sh [EXTRA_PACKAGE ...]
#
# The GPU machine's python3 (3.12, x86_64) has CuPy, numpy and torch (with torch's own
# dependencies) only, and it cannot reach a package index. This fetches, as cp312
# manylinux wheels with their dependencies (so pydantic and pydantic-core come as a
# matching pair): doit, pydantic and pyyaml (the pipeline), pytest and hypothesis (the
# torch layer's CUDA tests that tools/on-device.sh runs), plus any extra names given
# (matplotlib draws the bench's PNG; without it the PNG is left out with one line), into
# .whl/ at the repository root, and marks .whl/ ignored in git's local exclude file so it
# is never committed. numpy, torch, CuPy and NVIDIA library wheels a dependency pulls in
# are removed: the device's own builds must be the ones imported. tools/on-device.sh
# installs on the GPU machine only the wheels whose modules the image's python cannot
# import (tools/wheel_imports.py), so the image's own pytest, pyyaml, ... are never
# shadowed; take .whl/ along with the working tree (the device tool's `carry`).
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
  "${plat[@]}" -d .whl "doit>=0.36" "pydantic>=2.5,<3" "pyyaml>=6" "pytest>=7.4" "hypothesis>=6.90" "$@"
rm -f .whl/numpy-*.whl .whl/torch-*.whl .whl/cupy*.whl .whl/nvidia_*.whl .whl/nvidia-*.whl
ls .whl
du -sh .whl
