#!/usr/bin/env bash
# Runs ON the GPU machine, from the project root (the device tool's working dir).
# One device call does everything (prepare first, here: bash tools/prepare-wheels.sh):
#   run(command="bash tools/on-device.sh", carry=[".whl"], timeout_s=540)
# With no arguments it runs the issue-5 evidence: GPU facts, the CPU tests that also
# have a GPU case, `doit verify backend=gpu` on smoke, tails and hslm, and
# `doit bench shape=hslm`. Arguments replace that list: each is one shell command.
# What comes back under $OUT (the tool returns at most 8 files, 2 folders deep):
#   device.log, gpu.txt, bench-hslm.{json,md,png}, artifacts.tgz (all of artifacts/).
# It never changes the card's settings (clocks, power, persistence, MIG): read-only queries.
set -uo pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
log="$OUT/device.log"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || { echo "wheel install failed: run tools/prepare-wheels.sh here and carry .whl" | tee -a "$log"; exit 3; }
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH:/usr/local/cuda/bin
# ptxas for the ptxas stage (verify depends on it): the image's CUDA toolkit
if [ -z "${PTXAS:-}" ]; then
  PTXAS=$(command -v ptxas || ls /usr/local/cuda*/bin/ptxas 2>/dev/null | head -1 || true)
  [ -n "$PTXAS" ] && export PTXAS
fi
{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw --format=csv || true
  python3 -c 'import cupy, sys; print("python", sys.version.split()[0], "cupy", cupy.__version__, cupy.cuda.runtime.getDeviceCount(), "device(s)")'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' || true
  echo "ptxas: ${PTXAS:-not found} $(${PTXAS:-false} --version 2>/dev/null | tail -1)"
} 2>&1 | tee "$OUT/gpu.txt"
if [ $# -eq 0 ]; then
  set -- 'python3 -m pytest -q -p no:cacheprovider tests/test_ops.py tests/test_bench_report.py' \
         'doit verify backend=gpu shape=smoke,tails,hslm' \
         'doit bench shape=hslm'
fi
rc=0
for cmd in "$@"; do
  echo "=== $cmd" | tee -a "$log"
  start=$(date +%s)
  bash -c "$cmd" 2>&1 | tee -a "$log"
  status=${PIPESTATUS[0]}
  echo "=== exit $status after $(( $(date +%s) - start )) s: $cmd" | tee -a "$log"
  [ "$status" = 0 ] || rc=1
done
for f in artifacts/bench/*.json artifacts/bench/*.md artifacts/bench/*.png; do
  [ -f "$f" ] && cp "$f" "$OUT/bench-$(basename "$f")"
done
[ -d artifacts ] && tar czf "$OUT/artifacts.tgz" artifacts
ls -la "$OUT"
exit $rc
