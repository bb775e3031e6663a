#!/usr/bin/env bash
# The accelerator check: every path that only runs off CPU, exercised once on a real GPU/TPU machine.
#
# CI has no accelerator, so these paths are covered here by hand when a machine is lent: xprof's hlo_stats
# per-op table, the published-peak table and achieved rates, device memory in doctor and --monitor, the
# profiler capture on the device, nan-hunt's recipes with the device as default backend, repro's jaxpr
# cutting on the device, jaxdbg.watch's output check and the overheads (bench_watch, bench_profile), real
# pipeline mode (which falls back to CPU devices when the host has fewer accelerators than stages), and
# hang-hunt with asynchronous dispatch and host callbacks on the runtime's threads (bench_hang).
#
#   OUT=/tmp/device_out bash scripts/device_check.sh                   # every check; PY=python3 by default
#   OUT=/tmp/device_out bash scripts/device_check.sh profile_function  # only the checks named
#
# Writes $OUT/log.txt (everything, step by step with exit codes) and $OUT/reports.tar.gz (every JSON report,
# pytest's junit files). xprof is installed from .whl/ when that folder holds its wheel (a machine with no
# registry access).
set -u
OUT=${OUT:-/tmp/device_out}
PY=${PY:-python3}
WORK=$(mktemp -d)
mkdir -p "$OUT" "$WORK/r"
LOG="$OUT/log.txt"
export PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$WORK/site" .whl/*.whl \
    >>"$LOG" 2>&1
fi
export PYTHONPATH="$PWD${WORK:+:$WORK/site}"

step() {  # step NAME TIMEOUT COMMAND...: run one check, log its output and exit code, never stop the script
  local name=$1 limit=$2; shift 2
  local began=$SECONDS
  echo "=== $name: $*" >>"$LOG"
  timeout "$limit" "$@" >>"$LOG" 2>&1
  echo "=== $name: exit $? in $((SECONDS - began)) s" | tee -a "$LOG"
}

J() { echo "--json $WORK/r/$1.json --out $WORK/o_$1"; }  # the report and artifacts of one step

ops_summary() {  # the per-op table of a function-mode report: top rows, and how much of the execute time it covers
  $PY - "$1" <<'PYEOF'
import json, sys
result = json.load(open(sys.argv[1]))["result"]
for f in result["functions"]:
    covered = sum(o["total_s"] for o in f["ops"]) / max(f["execute"]["total_s"], 1e-12)
    print(f["name"], "ops_source", f.get("ops_source"), "op time / execute time", round(covered, 3))
    for o in f["ops"][:5]:
        print("  ", o["name"], o["category"], o["count"], o["total_s"], (o.get("source") or {}).get("line"))
    print("  rates", f.get("rates"))
print("notes", result["notes"])
PYEOF
}

CHECKS=${*:-env doctor profile_script profile_function profile_monitor profile_recompile nan_hunt repro pipeline_real watch hang pytest}
for check in $CHECKS; do
  case $check in
  env) step env 60 bash -c "nvidia-smi -L; $PY -c 'import jax, jaxlib, sys; print(sys.version); print(jax.__version__, jaxlib.__version__, jax.devices(), jax.default_backend())'; $PY -c 'import xprof, os; print(\"xprof\", os.path.dirname(xprof.__file__))'" ;;
  doctor) step doctor 120 $PY -m jaxdbg doctor $(J doctor) ;;
  profile_script) step profile_script 120 $PY -m jaxdbg profile recipes/hot_op/train.py $(J profile_hot_op) ;;
  profile_function)  # a while loop of bf16 matmuls, with XLA's command buffers off (jaxdbg's default) and kept
    for mode in off keep; do
      extra=(); [ $mode = keep ] && extra=(--command-buffers)
      step "profile_function_cb_$mode" 120 $PY -m jaxdbg profile recipes/run_heavy/train.py::power_iterations \
        --args "${MATMUL_ARGS:-bf16[4096,4096]}" --runs 10 "${extra[@]}" $(J "profile_function_$mode")
      ops_summary "$WORK/r/profile_function_$mode.json" >>"$LOG" 2>&1
      mkdir -p "$WORK/r/hlo_$mode"; cp "$WORK"/o_profile_function_$mode/hlo/*optimized* "$WORK/r/hlo_$mode/" 2>/dev/null
      find "$WORK/o_profile_function_$mode/trace" -name "*.xplane.pb" -exec cp {} "$WORK/r/hlo_$mode/" \;
    done ;;
  profile_monitor) step profile_monitor 120 $PY -m jaxdbg profile recipes/host_transfer/train.py --monitor $(J profile_monitor) ;;
  profile_recompile) step profile_recompile 120 $PY -m jaxdbg profile recipes/recompile_storm/train.py $(J profile_recompile) ;;
  nan_hunt) step nan_hunt_scan 120 $PY -m jaxdbg nan-hunt recipes/nan_scan/train.py $(J nan_scan) ;;
  repro) step repro_nan_graph 150 $PY -m jaxdbg repro recipes/repro_nan_graph/train.py $(J repro_nan_graph) ;;
  pipeline_real) step pipeline_real 150 env XLA_FLAGS=--xla_force_host_platform_device_count=4 \
    $PY -m jaxdbg pipeline-bench --mode real --stages 4 --microbatches 8 --seeds 2 --xprof $(J pipeline_real) ;;
  watch)  # jaxdbg.watch and nan-hunt against a plain run on the tutorial loop; profile's overhead (owed)
    step bench_watch 300 $PY scripts/bench_watch.py --model cnn --pairs 1 --steps 200
    step bench_profile 300 $PY scripts/bench_profile.py --pairs 3 ;;
  hang)  # hang-hunt on the device: async dispatch (a call returns before its results are ready: the ready check),
    # a stuck host loop with calls in flight, a callback on an XLA thread (not the caller's, as on CPU); the
    # recorder's overhead on a GPU step (tens of microseconds: where the fixed cost per call weighs most)
    step hang_stuck 150 $PY -m jaxdbg hang-hunt tests/corpus/hang_stuck_read/train.py --stall 10 $(J hang_stuck)
    step hang_lock 150 $PY -m jaxdbg hang-hunt tests/corpus/hang_callback_lock/train.py --stall 10 $(J hang_lock)
    step bench_hang 300 $PY scripts/bench_hang.py --rounds 20 --stall 5 ;;
  pytest)  # suites whose code paths change with the backend, with the accelerator as jax's default backend
    for suite in nan_recipes repro_cut jit_layer live_watch hang_units; do
      step "pytest_$suite" 240 env JAX_PLATFORMS= $PY -m pytest -q -p no:cacheprovider \
        --junitxml "$WORK/r/junit_$suite.xml" "tests/test_$suite.py"
    done ;;
  *) echo "unknown check '$check'" | tee -a "$LOG" ;;
  esac
done
tar -czf "$OUT/reports.tar.gz" -C "$WORK" r
echo "done" | tee -a "$LOG"
