#!/bin/sh
# Re-record the real `ptxas -v` outputs that tests/test_ptxas.py parses.
# Usage: tests/data/ptxas/record.sh  (from anywhere; needs the venv's wheel ptxas and,
# for the 13.0 set, /usr/local/bin/ptxas). Writes <version>/<case>.<arch>.stderr + .rc.
set -u
here=$(cd "$(dirname "$0")" && pwd)
wheel=$(python -c 'from hslm_ptx.pipeline.stages.ptxas import wheel_ptxas; print(wheel_ptxas() or "")')
for ptxas in "$wheel" /usr/local/bin/ptxas; do
  [ -x "$ptxas" ] || continue
  ver=$("$ptxas" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
  mkdir -p "$here/$ver"
  for case in small spill bad newver; do
    for arch in sm_80 sm_86 sm_89 sm_90; do
      (cd "$here" && "$ptxas" -v -arch=$arch -o /dev/null $case.ptx) \
        2>"$here/$ver/$case.$arch.stderr" >/dev/null
      echo $? >"$here/$ver/$case.$arch.rc"
    done
  done
done
