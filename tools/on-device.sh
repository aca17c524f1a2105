#!/usr/bin/env bash
# tools/on-device.sh: the whole GPU session as one command, run ON the GPU machine from
# the project root:   bash tools/on-device.sh
# with .whl/ beside it (made here by `bash tools/prepare-wheels.sh` and carried along) and,
# for the bench's model column, $MODEL_FILE (made here by `doit model shape=hslm gpu=h200`;
# artifacts/ is not tracked, so carry artifacts/model).
#
# Steps, in order; each has a time cap, from tools/device-plan.txt (written on the CPU
# machine by tools/device_plan.py from counts and measured costs; docs/gpu-run.md shows
# each step's arithmetic); the caps of the steps run add to at most TOTAL_S less PACKAGE_S
# and the checkpoints, the plan (cap and expected time per step) is printed before the
# first starts, a step is killed at its cap (what it wrote so far is kept: each writes as
# it goes), after each step summary.md and rest.tgz are rewritten under $OUT (so a run
# the device kills whole still returns every finished step's records), and a failing
# step is logged and the next one runs:
#   wheels       pip-install into $SITE only the .whl/ wheels whose packages the image's
#                python cannot import (each probed first: doit, pydantic and its three
#                dependencies, as the image stands); the image's own pytest, pyyaml, ...
#                are never shadowed, and a carried pytest runs without plugin autoload
#   warm-up      one launch of every kernel on $WARM_SHAPE (tools/one_launch.py), untimed:
#                it fills the driver's JIT cache and CuPy's kernel cache before anything
#                is timed or probed, and is itself the first result on every kernel
#   facts        device, driver, clocks; nvidia-smi, ptxas, ncu, compute-sanitizer, python,
#                cupy, torch versions (read-only queries) -> facts.txt; ncu and
#                compute-sanitizer each probed once on one tiny launch: a tool that cannot
#                run here makes its steps skipped with one line, not retried; a probe
#                that runs out of time is "slow", and its steps are tried anyway
#   verify       every kernel on $VERIFY_SETS on the GPU from the emitted PTX against the integer
#                CPU reference (tools/gpu_verify.py: no ptxas, no doit; $VERIFY_JOBS processes;
#                set by set, so a cut-short run has covered every kernel on the first set;
#                no cell starts in the step's last VERIFY_TAIL_S s) -> verify.json in rest.tgz
#   bench        python -m hslm_ptx.pipeline.bench.run $BENCH_SET -> bench-<set>.{json,md} (CSV and PNG in
#                rest.tgz); the record is rewritten after every row and the bench stops
#                starting rows before its cap, so a cut-off run still returns its rows
#   layer        python -m hslm_ptx.pipeline.bench.layer (TernaryLinear fwd+bwd, eager
#                and CUDA-graph replayed, against bf16 nn.Linear, the hslm shapes and
#                R=8192 K=N=4096) -> bench-layer.json, rewritten after every row
#   torch-tests  the tests of $TORCH_TESTS that skip without CUDA (tools/cuda_tests.py finds
#                them; a skip there counts as a failure), when pytest imports, in the files'
#                order: the layer step's cases first, the cold torch.compile last
#   sanitize     compute-sanitizer memcheck, racecheck, synccheck, initcheck, each on one
#                launch of each configuration (tools/one_launch.py $SANITIZE_KERNELS $SANITIZE_SHAPE)
#   counters     Nsight Compute counters for one launch of each of $COUNTER_KERNELS on
#                $COUNTERS_SHAPE (--clock-control none: the card's clocks are left alone),
#                $COUNTER_BATCH kernels per ncu run -> ncu.csv; meanwhile the CPU emulator
#                counts the same launches (tools/counter_calibration.py): both side by side
#                in calibration.json, rewritten after every batch
# What it writes under $OUT (default /tmp/out): at most 8 files, no folders:
#   device.log   every step's output and time, appended as it runs (a timeout keeps it)
#   facts.txt    "key: value" lines: device, driver, clocks, tool versions, tool probes
#   summary.md   each step's cap, time and exit, and what each found (tools/device_summary.py)
#   bench-<set>.json, .md         the bench record and its table
#   bench-layer.json              the layer step's rows
#   ncu.csv      the counters, as ncu --csv wrote them
#   rest.tgz     artifacts/ (PTX, verify reports), bench-<set>.csv and .png, verify.json and the
#                cells' verdicts, the emulator's counts and calibration.json, each step's log
# Land it afterwards, on the CPU machine: python -m hslm_ptx.pipeline.bench.land <folder they came back in>
# (copies them to bench/results/<gpu>/ with results.json and README.md).
# Knobs (environment): STEPS (names above, space-separated; default all), TOTAL_S (480),
# PACKAGE_S (15), PACKAGE_TOOL_S (PACKAGE_S / 3: the bench's tables, the summary), PLAN
# (name:cap_s:expected_s ...; default tools/device-plan.txt), CHECKPOINT_S (the plan's
# checkpoint after each step), PLAN_ONLY (1: print the plan, run nothing), WARM_SHAPE (tiny),
# VERIFY_SETS ("smoke tails hslm"), VERIFY_KERNELS (all), VERIFY_JOBS (8), VERIFY_TAIL_S (8), BENCH_SET (hslm),
# BENCH_CEILING (8192; 0 skips the cuBLAS ceiling run), BENCH_KERNELS (all int8 GEMMs), MODEL_FILE
# (artifacts/model/$BENCH_SET-h200.predictions.json), TORCH_TESTS (test files), LAUNCH_KERNELS
# (all: the kernels under the sanitizers, or a comma list), PROBE_SHAPE (tiny), SANITIZE_SHAPE
# (300x330x270), SANITIZE_KERNELS (representative: each configuration once), COUNTER_KERNELS (16 representative kernels, below), COUNTERS_SHAPE
# (ffn_up_r1782), COUNTER_BATCH (8), CALIBRATION_JOBS (8), MIN_BUDGET_S (5: the least --budget-s a
# step's tool is given), SITE.
# It never changes the card's settings (clocks, power, persistence, MIG).
# Exit 0 when every step passed, 1 when any failed, or was skipped for time or because
# its tool cannot run here; 2 when the plan does not fit TOTAL_S.
set -uo pipefail
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
# every setting the steps read is exported: they run in a child bash (under timeout)
export OUT=${OUT:-/tmp/out}
export SITE=${SITE:-/tmp/site}
export TOTAL_S=${TOTAL_S:-480}
export PACKAGE_S=${PACKAGE_S:-15}
export PACKAGE_TOOL_S=${PACKAGE_TOOL_S:-$(( PACKAGE_S / 3 ))}  # each of the two tools packaging runs
export STEPS=${STEPS:-wheels warm-up facts verify bench layer torch-tests sanitize counters}
export VERIFY_SETS=${VERIFY_SETS:-smoke tails hslm}
export VERIFY_KERNELS=${VERIFY_KERNELS:-all}  # every registry kernel, or a comma list
export VERIFY_JOBS=${VERIFY_JOBS:-8}      # processes: the CPU reference is most of a cell's time
export VERIFY_TAIL_S=${VERIFY_TAIL_S:-8}  # of the verify cap, kept for the cells in flight and the summary
export BENCH_SET=${BENCH_SET:-hslm}
export BENCH_CEILING=${BENCH_CEILING:-8192}
export BENCH_KERNELS=${BENCH_KERNELS:-}   # empty: every int8 GEMM kernel (the bench's default)
export BENCH_TAIL_S=${BENCH_TAIL_S:-20}  # of the bench's cap, kept for its tables and exit
export MODEL_FILE=${MODEL_FILE:-artifacts/model/$BENCH_SET-h200.predictions.json}
export LAYER_TAIL_S=${LAYER_TAIL_S:-12}  # of the layer cap: a row started before it ends inside it
export MIN_BUDGET_S=${MIN_BUDGET_S:-5}  # the least --budget-s verify, bench and layer are given, whatever their tail leaves
export TORCH_TESTS=${TORCH_TESTS:-tests/test_layer_step.py tests/test_torch_linear.py tests/test_torch_compile.py}
export LAUNCH_KERNELS=${LAUNCH_KERNELS:-all}  # what one_launch.py launches in the warm-up and the probes
# under the sanitizers: each configuration once, or LAUNCH_KERNELS where it names kernels
[ "$LAUNCH_KERNELS" = all ] && sanitized=representative || sanitized=$LAUNCH_KERNELS
export SANITIZE_KERNELS=${SANITIZE_KERNELS:-$sanitized}
export PROBE_SHAPE=${PROBE_SHAPE:-tiny}
export WARM_SHAPE=${WARM_SHAPE:-tiny}
export PROBE_S=${PROBE_S:-12}  # each of the two probes: facts stays inside its cap
# every reduction (K for forward, N for dX, R for dW) spans 5 or more 64-deep chunks, so the
# 4-stage ring wraps, and no dimension is a multiple of 16: the tails' predicates run too
export SANITIZE_SHAPE=${SANITIZE_SHAPE:-300x330x270}
# one of each kind of kernel the layer step launches (bf16, as bench_layer runs it) and the int8 GEMMs
export COUNTER_KERNELS=${COUNTER_KERNELS:-hslm_fwd_s8,hslm_fwd_s8_m32,hslm_fwd_s8_m32n16,hslm_dx_s8,hslm_dw_s8,hslm_dw_s8_m16n16,hslm_dw_s8_m256,hslm_fwd_bf16,hslm_fwd_splitk_bf16,hslm_dx_bf16,hslm_dx_splitk_bf16,hslm_dw_bf16,hslm_dw_splitk_bf16,hslm_wsum_bf16,hslm_fwdw_bf16_bf16,hslm_bwd_bf16_bf16}
export COUNTERS_SHAPE=${COUNTERS_SHAPE:-ffn_up_r1782}
export COUNTER_BATCH=${COUNTER_BATCH:-8}     # kernels per ncu run: a run cut off loses only its batch
export COUNTER_TAIL_S=${COUNTER_TAIL_S:-12}  # of the counters cap: no batch starts in it
export CALIBRATION_JOBS=${CALIBRATION_JOBS:-8}
# name:cap_s:expected_s, each step's arithmetic after a '#' (tools/device_plan.py writes it)
PLAN_FILE=tools/device-plan.txt
PLAN_FROM_FILE=0
if [ -z "${PLAN:-}" ]; then PLAN=$(sed 's/#.*//' "$PLAN_FILE" 2>/dev/null); PLAN_FROM_FILE=1; fi
export CHECKPOINT_S=${CHECKPOINT_S:-3}  # summary.md and rest.tgz after each step (tools/device_plan.py's checkpoint)
export WORK=$(mktemp -d /tmp/on-device.XXXXXX)
mkdir -p "$OUT" "$SITE"
export LOG="$OUT/device.log"
export FACTS="$OUT/facts.txt"
: > "$LOG"
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PATH="$SITE/bin:$PATH:/usr/local/cuda/bin:/usr/local/nvidia/bin"
START=$(date +%s)
RC=0
BACK=(device.log facts.txt summary.md "bench-$BENCH_SET.json" "bench-$BENCH_SET.md"
      bench-layer.json ncu.csv rest.tgz)  # what comes back: the device tool's 8 files

note() { echo "$*" | tee -a "$LOG"; }

wanted() { case " $STEPS " in *" $1 "*|*" ${1%%-*} "*) return 0 ;; *) return 1 ;; esac; }

declare -A CAP EXPECT
plan() {  # the caps of the wanted steps, scaled down to fit TOTAL_S less PACKAGE_S
  local entry name cap expect sum=0 expected=0 names=()
  for entry in $PLAN; do
    IFS=: read -r name cap expect <<< "$entry"
    wanted "$name" || continue
    CAP[$name]=$cap; EXPECT[$name]=$expect; names+=("$name")
    sum=$(( sum + cap )); expected=$(( expected + expect ))
  done
  local room=$(( TOTAL_S - PACKAGE_S - ${#names[@]} * CHECKPOINT_S ))  # a checkpoint after each step
  if [ "$room" -lt 1 ]; then
    note "=== plan: TOTAL_S $TOTAL_S s leaves no time after PACKAGE_S $PACKAGE_S s"; exit 2
  fi
  if [ "$sum" -gt "$room" ]; then
    for name in "${names[@]}"; do CAP[$name]=$(( ${CAP[$name]} * room / sum )); done
    note "=== plan: the caps ($sum s) are scaled to the $room s that TOTAL_S $TOTAL_S s leaves"
    sum=0; for name in "${names[@]}"; do sum=$(( sum + ${CAP[$name]} )); done
  fi
  note "=== plan: ${#names[@]} steps, caps $sum s + $PACKAGE_S s packaging of TOTAL_S $TOTAL_S s; expected ~$expected s"
  for name in "${names[@]}"; do
    local why=""
    [ "$PLAN_FROM_FILE" = 1 ] && why=$(grep "^$name:" "$PLAN_FILE" | sed -n 's/^[^#]*# *//p' | head -1)
    note "$(printf '=== plan: %-18s cap %4s s, expected ~%s s' "$name" "${CAP[$name]}" "${EXPECT[$name]}")${why:+  ($why)}"
  done
}

# step NAME COMMAND...: run COMMAND with its output appended to the log and to
# $WORK/NAME.log, under min(its cap, time left before TOTAL_S less PACKAGE_S); the command
# sees its limit as $STEP_LIMIT_S.
step() {
  local name=$1; shift
  local cap=${CAP[$name]:-0}
  local left=$(( START + TOTAL_S - PACKAGE_S - CHECKPOINT_S - $(date +%s) ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 5 ]; then
    note "=== step $name: skipped, out of time ($left s left)"; RC=1; return
  fi
  note "=== step $name (limit ${limit}s, expected ~${EXPECT[$name]:-?} s): $*"
  local t0=$(date +%s)
  STEP_LIMIT_S=$limit timeout -k 5 "$limit" bash -c '"$@"' "$name" "$@" 2>&1 | tee -a "$LOG" "$WORK/$name.log"
  local status=${PIPESTATUS[0]}
  note "=== step $name: exit $status after $(( $(date +%s) - t0 )) s (at $(( $(date +%s) - START )) s)"
  [ "$status" = 0 ] || RC=1
  checkpoint
}

# summary.md and rest.tgz as they stand, under $OUT: what comes back if the device kills
# the whole command before packaging (each under CHECKPOINT_S; the next checkpoint or
# packaging replaces them)
checkpoint() {
  ON_DEVICE_RC=$RC timeout -k 1 "$CHECKPOINT_S" python3 tools/device_summary.py "$OUT" "$WORK" >> "$LOG" 2>&1
  local parts=() extra=() f
  mapfile -t parts < <(cd "$WORK" && ls -A)
  for f in "$OUT"/*; do  # the bench's CSV and PNG: in $OUT until packaging moves them
    [ -e "$f" ] || continue
    case " ${BACK[*]} " in *" $(basename "$f") "*) ;; *) extra+=("$(basename "$f")") ;; esac
  done
  timeout -k 1 "$CHECKPOINT_S" tar czf "$OUT/rest.tgz.tmp" -C "$WORK" "${parts[@]}" \
    ${extra[0]+-C "$OUT" "${extra[@]}"} 2>>"$LOG" && mv "$OUT/rest.tgz.tmp" "$OUT/rest.tgz"
  rm -f "$OUT/rest.tgz.tmp"
}

skip() {  # skip NAME WHY COUNTS: one line; COUNTS=1 when the run should have done it
  note "=== step $1: skipped, $2"
  [ "${3:-0}" = 1 ] && RC=1
  return 0
}

tool() {  # the first of: PATH, the CUDA toolkits, Nsight Compute's own folder
  command -v "$1" 2>/dev/null && return
  ls /usr/local/cuda*/bin/"$1" /opt/nvidia/nsight-compute/*/"$1" 2>/dev/null | head -1
}

usable() {  # usable NAME: the facts step's probe found it working or slow, or did not probe it
  [ ! -f "$WORK/probe-$1" ] || grep -qE '^(ok|slow)' "$WORK/probe-$1"
}

install_wheels() {
  shopt -s nullglob
  local wheels=(.whl/*.whl) keep=() w
  shopt -u nullglob
  if [ ${#wheels[@]} -eq 0 ]; then
    echo "no wheels in .whl/: run tools/prepare-wheels.sh on the CPU machine and carry .whl"
    return 3
  fi
  for w in "${wheels[@]}"; do  # only what the image's python cannot import: its own packages are never shadowed
    if PYTHONPATH=$PWD python3 tools/wheel_imports.py "$w"; then
      echo "left alone (the image has it): $(basename "$w")"
    else keep+=("$w"); fi
  done
  if [ ${#keep[@]} -eq 0 ]; then echo "the image has every carried package: nothing installed"; return 0; fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target "$SITE" "${keep[@]}" && echo "installed: ${keep[*]##*/}"
}

probe() {  # probe NAME: one tiny launch under the tool; "ok" or why not, in $WORK/probe-NAME
  local name=$1 path out status verdict first
  case $name in ncu) path=$(tool ncu) ;; compute-sanitizer) path=$(tool compute-sanitizer) ;; esac
  first=$(python3 tools/one_launch.py --list "$LAUNCH_KERNELS" 2>/dev/null | head -1)
  if [ -z "$path" ]; then verdict="not found"
  elif [ -z "$first" ]; then verdict="not probed: tools/one_launch.py --list $LAUNCH_KERNELS named no kernel"
  elif [ "$name" = ncu ]; then
    out=$(timeout -k 5 "$PROBE_S" "$path" --clock-control none --target-processes all \
          --kernel-name regex:^hslm_ --launch-count 1 --metrics gpu__time_duration.sum --csv \
          --log-file "$WORK/probe-ncu.csv" python3 tools/one_launch.py "$first" "$PROBE_SHAPE" 2>&1); status=$?
    # the tool works when it profiled the launch, whatever the kernels computed
    if grep -q gpu__time_duration "$WORK/probe-ncu.csv" 2>/dev/null; then verdict=ok
    elif [ "$status" = 124 ] || [ "$status" = 137 ]; then verdict="slow (no answer in PROBE_S $PROBE_S s), tried anyway"
    else verdict="cannot run here (exit $status): $(grep -iE 'error|fail' <<< "$out" | tail -1 | cut -c1-200)"; fi
  else
    out=$(timeout -k 5 "$PROBE_S" "$path" --tool memcheck --error-exitcode 1 \
          python3 tools/one_launch.py "$first" "$PROBE_SHAPE" 2>&1); status=$?
    # the tool works when it watched the program to its summary and did not refuse the device
    if grep -q "ERROR SUMMARY: " <<< "$out" && ! grep -qiE "not supported|unsupported|LibraryNotLoaded" <<< "$out"; then
      verdict=ok
    elif [ "$status" = 124 ] || [ "$status" = 137 ]; then verdict="slow (no answer in PROBE_S $PROBE_S s), tried anyway"
    else verdict="cannot run here (exit $status): $(grep -iE 'error|fail' <<< "$out" | tail -1 | cut -c1-200)"; fi
  fi
  echo "$verdict" > "$WORK/probe-$name"
  echo "$verdict"
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
    echo "pytest: $(python3 -c 'import pytest; print(pytest.__version__)' 2>&1 | tail -1)"
    echo "ncu_probe: $(probe ncu)"
    echo "compute_sanitizer_probe: $(probe compute-sanitizer)"
  } > "$FACTS"
  cat "$FACTS"
  [ -n "$nvsmi" ]
}

warm_up() {  # one launch of every kernel on a tiny shape: the caches filled, every kernel tried once
  python3 tools/one_launch.py "$LAUNCH_KERNELS" "$WARM_SHAPE"
}

verify() {
  local budget=$(( STEP_LIMIT_S - VERIFY_TAIL_S ))
  # shellcheck disable=SC2086  # VERIFY_SETS is a list of words
  python3 tools/gpu_verify.py $VERIFY_SETS --kernels "$VERIFY_KERNELS" --jobs "$VERIFY_JOBS" --budget-s $(( budget < MIN_BUDGET_S ? MIN_BUDGET_S : budget )) \
    --summary "$WORK/verify.json"
}

bench() {
  # the model's predictions, when made on the CPU machine (`doit model`) and carried along
  local model=() kernels=()
  if [ -f "$MODEL_FILE" ]; then model=(--model "$MODEL_FILE")
  else echo "no model file at $MODEL_FILE: the model column stays empty"; fi
  [ -n "$BENCH_KERNELS" ] && kernels=(--kernels "$BENCH_KERNELS")
  python3 tools/gpu_verify.py --emit-only > /dev/null || return
  local budget=$(( STEP_LIMIT_S - BENCH_TAIL_S ))
  python3 -m hslm_ptx.pipeline.bench.run "$BENCH_SET" --out "$OUT" --stem "bench-$BENCH_SET" \
    --ceiling "$BENCH_CEILING" --budget-s $(( budget < MIN_BUDGET_S ? MIN_BUDGET_S : budget )) "${model[@]}" "${kernels[@]}"
}

layer() {
  local budget=$(( STEP_LIMIT_S - LAYER_TAIL_S ))
  python3 -m hslm_ptx.pipeline.bench.layer --out "$OUT/bench-layer.json" --budget-s $(( budget < MIN_BUDGET_S ? MIN_BUDGET_S : budget ))
}

torch_tests() {
  local present=() f
  for f in $TORCH_TESTS; do [ -f "$f" ] && present+=("$f"); done
  case $(python3 -c 'import pytest; print(pytest.__file__)' 2>/dev/null) in
    "$SITE"/*) export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1  # a carried pytest: the image's plugins were built for another
               echo "pytest carried in $SITE: plugin autoload off" ;;
  esac
  python3 tools/cuda_tests.py run "${present[@]}"
}

sanitize() {  # one tool: compute-sanitizer --tool $1 on one launch of each kernel
  "$(tool compute-sanitizer)" --tool "$1" --target-processes all --error-exitcode 1 --print-limit 20 \
    python3 tools/one_launch.py "$SANITIZE_KERNELS" "$SANITIZE_SHAPE"
}

counters() {  # ncu in batches of COUNTER_BATCH launches; the emulator counts the same meanwhile
  local ncu metrics kernels=() batch=() i part=0 emulator status=0
  ncu=$(tool ncu)
  "$ncu" --query-metrics > "$WORK/ncu-query.txt" 2>&1
  metrics=$(python3 tools/counter_calibration.py metrics "$WORK/ncu-query.txt")  # what is left out: stderr
  mapfile -t kernels < <(python3 tools/one_launch.py --list "$COUNTER_KERNELS")
  python3 tools/counter_calibration.py emulate "$COUNTER_KERNELS" "$COUNTERS_SHAPE" --out "$WORK/emulated.json" \
    --jobs "$CALIBRATION_JOBS" > "$WORK/emulate.log" 2>&1 &
  emulator=$!
  echo "metrics: $metrics"
  echo "profiling ${#kernels[@]} launches, one per kernel, $COUNTER_BATCH per ncu run, on $COUNTERS_SHAPE"
  for (( i = 0; i < ${#kernels[@]}; i += COUNTER_BATCH )); do
    if (( SECONDS > STEP_LIMIT_S - COUNTER_TAIL_S )); then
      echo "not profiled, the step's time ran out: ${kernels[*]:i}"; status=1; break
    fi
    batch=("${kernels[@]:i:COUNTER_BATCH}")
    local names; names=$(IFS=,; echo "${batch[*]}")
    local run=("$ncu" --clock-control none --target-processes all --kernel-name regex:^hslm_
               --launch-count "${#batch[@]}" --csv --log-file "$WORK/ncu-$part.csv")
    if ! "${run[@]}" --metrics "$metrics" python3 tools/one_launch.py "$names" "$COUNTERS_SHAPE"; then
      echo "ncu failed with the full list on $names; once more with the core counters"
      "${run[@]}" --metrics "$(python3 -m hslm_ptx.pipeline.bench.counters core)" \
        python3 tools/one_launch.py "$names" "$COUNTERS_SHAPE" || status=1
    fi
    part=$(( part + 1 ))
    # one CSV of every batch so far, one header: what comes back even when a later batch is cut off
    awk 'FNR == 1 { on = 0 } /^"ID"/ { on = 1; if (seen++) next } on' "$WORK"/ncu-[0-9]*.csv > "$OUT/ncu.csv.tmp" \
      && mv "$OUT/ncu.csv.tmp" "$OUT/ncu.csv"
    if [ -n "$emulator" ]; then  # done long before the first batch, as a rule (a few seconds on every core)
      wait "$emulator" || { echo "the emulator's counts failed: $(tail -3 "$WORK/emulate.log")"; status=1; }
      emulator=""; cat "$WORK/emulate.log"
    fi
    if [ -s "$WORK/emulated.json" ]; then  # the batches so far beside the emulator's: kept if a later one is cut off
      python3 tools/counter_calibration.py compare "$OUT/ncu.csv" "$WORK/emulated.json" \
        --out "$WORK/calibration.json" > /dev/null 2>&1 && echo "calibration.json: batches 0-$(( part - 1 ))"
    fi
  done
  if [ -n "$emulator" ]; then
    wait "$emulator" || { echo "the emulator's counts failed: $(tail -3 "$WORK/emulate.log")"; status=1; }
    cat "$WORK/emulate.log"
  fi
  [ -s "$OUT/ncu.csv" ] || { echo "ncu wrote no counters"; return 1; }
  python3 -m hslm_ptx.pipeline.bench.counters table "$OUT/ncu.csv"
  python3 tools/counter_calibration.py compare "$OUT/ncu.csv" "$WORK/emulated.json" --out "$WORK/calibration.json" \
    || status=1
  return $status
}

package() {
  trap - EXIT TERM INT
  note "=== packaging after $(( $(date +%s) - START )) s"
  local record="$OUT/bench-$BENCH_SET.json" f
  if [ -f "$record" ] && [ ! -f "${record%.json}.md" ]; then  # the bench was cut off: its tables now
    timeout -k 2 "$PACKAGE_TOOL_S" python3 -m hslm_ptx.pipeline.bench.report "$record" >> "$LOG" 2>&1
  fi
  ON_DEVICE_RC=$RC timeout -k 2 "$PACKAGE_TOOL_S" python3 tools/device_summary.py "$OUT" "$WORK" >> "$LOG" 2>&1 \
    || note "=== summary.md not written (tools/device_summary.py failed or ran out of time)"
  mkdir -p "$WORK/out"
  for f in "$OUT"/*; do  # anything but the files that come back travels in rest.tgz
    [ -e "$f" ] || continue
    case " ${BACK[*]} " in *" $(basename "$f") "*) ;; *) mv "$f" "$WORK/out/" ;; esac
  done
  local parts=(); mapfile -t parts < <(cd "$WORK" && ls -A)  # members by name: never a '.' entry
  if [ -d artifacts ]; then
    tar czf "$OUT/rest.tgz" -C "$WORK" "${parts[@]}" -C "$PWD" artifacts 2>>"$LOG"
  else
    tar czf "$OUT/rest.tgz" -C "$WORK" "${parts[@]}" 2>>"$LOG"
  fi
  ls -la "$OUT" | tee -a "$LOG"
  note "=== done: exit $RC after $(( $(date +%s) - START )) s"
}
trap 'RC=1; package; exit 1' TERM INT
# steps run under timeout in a child bash: it needs the functions
export -f tool install_wheels probe facts warm_up verify bench layer torch_tests sanitize counters

note "=== on-device.sh in $PWD at $(date -u +%FT%TZ); steps: $STEPS"
plan
if [ "${PLAN_ONLY:-0}" = 1 ]; then  # the plan alone: what would run, within what time
  [ "$PLAN_FROM_FILE" = 1 ] && grep '^# total' "$PLAN_FILE" | sed 's/^# /=== plan: /' | tee -a "$LOG"
  exit 0
fi
wanted wheels && step wheels install_wheels
wanted warm-up && step warm-up warm_up
wanted facts && step facts facts
wanted verify && step verify verify
wanted bench && step bench bench
if wanted layer; then
  if [ -f hslm_ptx/pipeline/bench/layer.py ]; then step layer layer
  else skip layer "hslm_ptx/pipeline/bench/layer.py is not in this tree"; fi
fi
if wanted torch-tests; then
  present=""; for f in $TORCH_TESTS; do [ -f "$f" ] && present+=" $f"; done
  if [ -z "$present" ]; then skip torch-tests "none of $TORCH_TESTS is in this tree"
  elif ! python3 -c 'import pytest' 2>/dev/null; then
    skip torch-tests "pytest does not import (carry it: bash tools/prepare-wheels.sh)" 1
  else step torch-tests torch_tests; fi
fi
for t in memcheck racecheck synccheck initcheck; do
  wanted "sanitize-$t" || continue
  if [ -z "$(tool compute-sanitizer)" ]; then skip "sanitize-$t" "compute-sanitizer not found" 1
  elif ! usable compute-sanitizer; then
    skip "sanitize-$t" "compute-sanitizer $(head -1 "$WORK/probe-compute-sanitizer")" 1
  else step "sanitize-$t" sanitize "$t"; fi
done
if wanted counters; then
  if [ -z "$(tool ncu)" ]; then skip counters "ncu not found" 1
  elif ! usable ncu; then skip counters "ncu $(head -1 "$WORK/probe-ncu")" 1
  else step counters counters; fi
fi
package
exit $RC
