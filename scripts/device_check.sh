#!/usr/bin/env bash
# The accelerator check: every path that only runs off CPU, exercised once on a real GPU/TPU machine.
#
# CI has no accelerator, so these paths are covered here by hand when a machine is lent: xprof's hlo_stats
# per-op table, the published-peak table and achieved rates, device memory in doctor and --monitor, the
# profiler capture on the device, nan-hunt's recipes with the device as default backend, repro's jaxpr
# cutting on the device, jaxdbg.watch's output check and the overheads (bench_watch, bench_profile), and real
# pipeline mode (which falls back to CPU devices when the host has fewer accelerators than stages).
#
#   OUT=/tmp/device_out bash scripts/device_check.sh                   # env + benches: <= 8 min on an H200
#   OUT=/tmp/device_out bash scripts/device_check.sh all               # every check (~20 min)
#   OUT=/tmp/device_out bash scripts/device_check.sh profile_function  # only the checks named
#
# `benches` runs every benchmark that has a GPU path, each under its own time limit (the sum stays under
# 8 minutes), and prints one table of ratios (scripts/bench_summary.py; also $OUT/ratios.txt): the jit layer's
# cost per call (bench_layer), profile (bench_profile), jaxdbg.watch on the MLP and CNN loops in one process
# (bench_watch --only-interleaved), nan-hunt's answers and watch overhead (bench_nan_hunt), the memory command's
# benchmark when it exists (bench_memory), nan-hunt on sharded arrays (4 host devices: a mesh cannot mix the
# GPU with them) and a 2-process job (bench_multihost on host devices, then one job with the GPU visible).
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

benches() {  # every benchmark with a GPU path, one table of ratios at the end
  export JAXDBG_BENCH_SUMMARY="$OUT/ratios.jsonl"
  rm -f "$JAXDBG_BENCH_SUMMARY"
  local host=(env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4)
  step bench_layer 60 $PY scripts/bench_layer.py --rounds 5 --calls 2000
  step bench_profile 150 $PY scripts/bench_profile.py --pairs 2 --steps 200
  step bench_watch 100 $PY scripts/bench_watch.py --model both --only-interleaved --steps 100
  step bench_nan_hunt 70 $PY scripts/bench_nan_hunt.py --pairs 1 --steps 100 --recipes nan_scan,nan_backward
  [ -f scripts/bench_memory.py ] && step bench_memory 40 $PY scripts/bench_memory.py
  step nan_hunt_sharded 30 "${host[@]}" $PY -m jaxdbg --processes 2 nan-hunt tests/corpus/multihost_nan/train.py \
    $(J nan_sharded)
  step bench_multihost 60 "${host[@]}" $PY scripts/bench_multihost.py --processes 2 --pairs 1 --steps 100
  step job_on_gpu 30 $PY -m jaxdbg --processes 2 profile tests/corpus/multihost_dp/train.py $(J job_on_gpu)
  $PY - "$WORK/r" >>"$JAXDBG_BENCH_SUMMARY" <<'PYEOF'
import json, os, sys
for name, figure in (("nan_sharded", "2 processes x 4 host devices: NaN origin"),
                     ("job_on_gpu", "2 processes on the GPU: profile")):
    try:
        report = json.load(open(os.path.join(sys.argv[1], f"{name}.json")))
        result, code = report["result"], report.get("exit_code")
        first = result.get("first") or {}
        found = f"{first.get('primitive')} process {first.get('process')}" if first else result.get("error", "")
    except (OSError, ValueError, KeyError) as err:
        code, found = None, f"no report ({type(err).__name__})"
    print(json.dumps({"bench": "jobs", "figure": figure, "value": None, "unit": "x", "target": "",
                      "spread": f"exit {code}: {found}"[:60], "load": round(os.getloadavg()[0], 1), "time": ""}))
PYEOF
  $PY scripts/bench_summary.py "$JAXDBG_BENCH_SUMMARY" | tee "$OUT/ratios.txt" | tee -a "$LOG"
  cp "$JAXDBG_BENCH_SUMMARY" "$WORK/r/" 2>/dev/null
}

ALL="env doctor profile_script profile_function profile_monitor profile_recompile nan_hunt repro pipeline_real benches pytest"
CHECKS=${*:-env benches}
[ "$CHECKS" = all ] && CHECKS=$ALL
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
  benches) benches ;;
  pytest)  # suites whose code paths change with the backend, with the accelerator as jax's default backend
    for suite in nan_recipes repro_cut jit_layer live_watch; do
      step "pytest_$suite" 240 env JAX_PLATFORMS= $PY -m pytest -q -p no:cacheprovider \
        --junitxml "$WORK/r/junit_$suite.xml" "tests/test_$suite.py"
    done ;;
  *) echo "unknown check '$check'" | tee -a "$LOG" ;;
  esac
done
tar -czf "$OUT/reports.tar.gz" -C "$WORK" r
echo "done" | tee -a "$LOG"
