#!/usr/bin/env bash
# tools/on-device.sh: the whole GPU session as one command, run ON the GPU machine from
# the project root:   bash tools/on-device.sh
# with .whl/ beside it (made here by `bash tools/prepare-wheels.sh` and carried along).
#
# Steps, in order; each is timed, has its own time limit, and a failing step is logged
# and the next one runs (the whole run is sized to end within TOTAL_S, 450 s):
#   wheels     pip-install .whl/*.whl into $SITE (doit, pydantic: the image lacks them)
#   facts      device, driver, clocks; nvidia-smi, ptxas, ncu, compute-sanitizer,
#              python, cupy, torch versions (read-only queries) -> facts.txt
#   verify     every kernel on smoke, tails, hslm on the GPU from the emitted PTX
#              (tools/gpu_verify.py: no ptxas, no doit; every cell runs)
#   bench      doit bench shape=hslm -> bench-hslm.{json,md,csv,png}; with a model column
#              when $MODEL_FILE was carried (doit model shape=hslm gpu=h200, made here)
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck, initcheck, each on one
#              launch of each kernel (tools/one_launch.py all attn_r27)
#   counters   Nsight Compute counters for one launch of each kernel on ffn_up_r1782
#              (--clock-control none: the card's clocks are left alone) -> ncu.csv
# What it writes under $OUT (default /tmp/out): 8 files, no folders:
#   device.log   every step's output and time, appended as it runs (a timeout keeps it)
#   facts.txt    "key: value" lines: device, driver, clocks, tool versions
#   bench-hslm.json, .md, .csv, .png   the bench record and its renderings
#   ncu.csv      the counters, as ncu --csv wrote them
#   rest.tgz     artifacts/ (PTX, verify reports) and each step's own log
# Land it afterwards, on the CPU machine: python -m pipeline.bench_land <folder they came back in>
# (copies them to bench/results/<gpu>/ with results.json and README.md).
# Knobs (environment): STEPS (names above, space-separated; default all), TOTAL_S,
# VERIFY_SETS ("smoke tails hslm"), BENCH_SET (hslm), BENCH_CEILING (8192; 0 skips the
# cuBLAS ceiling run), MODEL_FILE (artifacts/model/hslm-h200.predictions.json), SANITIZE_SHAPE (attn_r27), COUNTERS_SHAPE (ffn_up_r1782), SITE.
# It never changes the card's settings (clocks, power, persistence, MIG).
# Exit 0 when every step passed, 1 when any failed or was skipped for time.
set -uo pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
OUT=${OUT:-/tmp/out}
SITE=${SITE:-/tmp/site}
TOTAL_S=${TOTAL_S:-450}
STEPS=${STEPS:-wheels facts verify bench sanitize counters}
VERIFY_SETS=${VERIFY_SETS:-smoke tails hslm}
BENCH_SET=${BENCH_SET:-hslm}
BENCH_CEILING=${BENCH_CEILING:-8192}
MODEL_FILE=${MODEL_FILE:-artifacts/model/hslm-h200.predictions.json}
SANITIZE_SHAPE=${SANITIZE_SHAPE:-attn_r27}
COUNTERS_SHAPE=${COUNTERS_SHAPE:-ffn_up_r1782}
WORK=$(mktemp -d /tmp/on-device.XXXXXX)
mkdir -p "$OUT" "$SITE"
LOG="$OUT/device.log"
FACTS="$OUT/facts.txt"
: > "$LOG"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH:/usr/local/cuda/bin:/usr/local/nvidia/bin"
START=$(date +%s)
RC=0

note() { echo "$*" | tee -a "$LOG"; }

wanted() { case " $STEPS " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# step NAME LIMIT_S COMMAND...: run COMMAND with its output appended to the log and to
# $WORK/NAME.log, under min(LIMIT_S, time left before TOTAL_S less 20 s to package).
step() {
  local name=$1 cap=$2; shift 2
  local left=$(( START + TOTAL_S - 20 - $(date +%s) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 5 ]; then
    note "=== step $name: skipped, out of time ($left s left)"; RC=1; return
  fi
  note "=== step $name (limit ${limit}s): $*"
  local t0=$(date +%s)
  timeout -k 10 "$limit" bash -c '"$@"' "$name" "$@" 2>&1 | tee -a "$LOG" "$WORK/$name.log"
  local status=${PIPESTATUS[0]}
  note "=== step $name: exit $status after $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - START )) s)"
  [ "$status" = 0 ] || RC=1
}

tool() {  # the first of: PATH, the CUDA toolkits, Nsight Compute's own folder
  command -v "$1" 2>/dev/null && return
  ls /usr/local/cuda*/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" 2>/dev/null | head -1
}

install_wheels() {
  shopt -s nullglob
  local wheels=(.whl/*.whl)
  shopt -u nullglob
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "no wheels in .whl/: run tools/prepare-wheels.sh on the CPU machine and carry .whl"
    return 3
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${wheels[@]}" && ls "$SITE"
}

facts() {
  local fields=name,driver_version,compute_cap,clocks.sm,clocks.mem,clocks.max.sm,clocks.max.mem,temperature.gpu,power.draw
  local nvsmi ptxas ncu sanitizer
  nvsmi=$(tool nvidia-smi); ptxas=${PTXAS:-$(tool ptxas)}; ncu=$(tool ncu); sanitizer=$(tool compute-sanitizer)
  {
    echo "date: $(date -u +%FT%TZ)"
    echo "nvidia_smi_fields: $fields"
    echo "nvidia_smi: $(${nvsmi:-false} --query-gpu=$fields --format=csv,noheader,nounits --id=0 2>&1 | head -1)"
    echo "ptxas: ${ptxas:-not found} $(${ptxas:-false} --version 2>/dev/null | tail -1)"
    echo "ncu: ${ncu:-not found} $(${ncu:-false} --version 2>/dev/null | tail -1)"
    echo "compute_sanitizer: ${sanitizer:-not found} $(${sanitizer:-false} --version 2>/dev/null | grep -i version | tail -1)"
    echo "python: $(python3 -c 'import sys; print(sys.version.split()[0])' 2>&1)"
    echo "cupy: $(python3 -c 'import cupy; print(cupy.__version__, "devices", cupy.cuda.runtime.getDeviceCount(), "driver", cupy.cuda.runtime.driverGetVersion(), "runtime", cupy.cuda.runtime.runtimeGetVersion())' 2>&1 | tail -1)"
    echo "torch: $(python3 -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, torch.cuda.is_available())' 2>&1 | tail -1)"
    echo "doit: $(python3 -m doit --version 2>&1 | head -1)"
    echo "pydantic: $(python3 -c 'import pydantic; print(pydantic.VERSION)' 2>&1 | tail -1)"
  } > "$FACTS"
  cat "$FACTS"
  [ -n "$nvsmi" ]
}

bench() {
  # the model's predictions, when made on the CPU machine (`doit model`) and carried along
  local model=""; [ -f "$MODEL_FILE" ] && model="model=$MODEL_FILE"
  python3 -m doit bench shape="$BENCH_SET" ceiling="$BENCH_CEILING" $model; local status=$?
  for f in artifacts/bench/"$BENCH_SET".{json,md,csv,png}; do
    [ -f "$f" ] && cp "$f" "$OUT/bench-$(basename "$f")"
  done
  return $status
}

sanitize() {  # one tool: compute-sanitizer --tool $1 on one launch of each kernel
  local sanitizer; sanitizer=$(tool compute-sanitizer)
  [ -n "$sanitizer" ] || { echo "compute-sanitizer not found"; return 127; }
  "$sanitizer" --tool "$1" --target-processes all --error-exitcode 1 --print-limit 20 \
    python3 tools/one_launch.py all "$SANITIZE_SHAPE"
}

counters() {
  local ncu metrics; ncu=$(tool ncu)
  [ -n "$ncu" ] || { echo "ncu not found"; return 127; }
  "$ncu" --query-metrics > "$WORK/ncu-query.txt" 2>&1
  metrics=$(python3 -m pipeline.bench_counters metrics "$WORK/ncu-query.txt")
  local run=("$ncu" --clock-control none --target-processes all --kernel-name regex:^hslm_
             --launch-count 3 --csv --log-file "$OUT/ncu.csv")
  echo "metrics: $metrics"
  if ! "${run[@]}" --metrics "$metrics" python3 tools/one_launch.py all "$COUNTERS_SHAPE"; then
    echo "ncu failed with the full list; once more with the core counters"
    "${run[@]}" --metrics "$(python3 -m pipeline.bench_counters core)" \
      python3 tools/one_launch.py all "$COUNTERS_SHAPE" || return 1
  fi
  python3 -m pipeline.bench_counters table "$OUT/ncu.csv"
}

package() {
  trap - EXIT TERM INT
  note "=== packaging after $(( $(date +%s) - START )) s"
  if [ -d artifacts ]; then
    tar czf "$OUT/rest.tgz" -C "$WORK" . -C "$PWD" artifacts 2>>"$LOG"
  else
    tar czf "$OUT/rest.tgz" -C "$WORK" . 2>>"$LOG"
  fi
  ls -la "$OUT" | tee -a "$LOG"
  note "=== done: exit $RC after $(( $(date +%s) - START )) s"
}
trap 'RC=1; package; exit 1' TERM INT
# steps run under timeout in a child bash: it needs the functions and settings
export -f tool install_wheels facts bench sanitize counters
export OUT SITE WORK LOG FACTS BENCH_SET BENCH_CEILING SANITIZE_SHAPE COUNTERS_SHAPE

note "=== on-device.sh in $PWD at $(date -u +%FT%TZ); steps: $STEPS"
wanted wheels && step wheels 60 install_wheels
wanted facts && step facts 60 facts
# shellcheck disable=SC2086  # VERIFY_SETS is a list of words
wanted verify && step verify 150 python3 tools/gpu_verify.py $VERIFY_SETS
wanted bench && step bench 240 bench
if wanted sanitize; then
  for t in memcheck racecheck synccheck initcheck; do step "sanitize-$t" 60 sanitize "$t"; done
fi
wanted counters && step counters 90 counters
package
exit $RC
