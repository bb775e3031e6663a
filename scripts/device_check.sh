#!/usr/bin/env bash
# The accelerator check: every path that only runs off CPU, exercised once on a real GPU/TPU machine.
#
# CI has no accelerator, so these paths are covered here by hand when a machine is lent: xprof's hlo_stats
# per-op table, the published-peak table and achieved rates, device memory in doctor and --monitor, the
# profiler capture on the device, nan-hunt's recipes with the device as default backend, repro's jaxpr
# cutting on the device, jaxdbg.watch's output check and the overheads (bench_watch, bench_profile), profile's
# host side where copies to the device are asynchronous (the input-pipeline verdict, syncs, a pmap), real
# pipeline mode (which falls back to CPU devices when the host has fewer accelerators than stages), and
# jaxdbg memory (the device's limit as the budget, its measured peak beside the estimate, a real out-of-memory
# error under XLA_PYTHON_CLIENT_MEM_FRACTION, whether jax.checkpoint lowers the temporaries there),
# and hang-hunt with asynchronous dispatch and host callbacks on the runtime's threads (bench_hang).
#
#   OUT=/tmp/device_out bash scripts/device_check.sh                   # env + benches: <= 8 min on an H200
#   OUT=/tmp/device_out bash scripts/device_check.sh all               # every check (~20 min)
#   OUT=/tmp/device_out bash scripts/device_check.sh profile_function  # only the checks named
#   DEADLINE=540 OUT=/tmp/device_out bash scripts/device_check.sh all  # as many as fit in 540 s, in that order
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
  if [ -n "${DEADLINE:-}" ]; then  # a lease is short: cut each limit to what is left, skip once under 10 s
    local left=$((DEADLINE - SECONDS))
    [ "$left" -lt 10 ] && { echo "=== $name: skipped, $left s left of DEADLINE=$DEADLINE" | tee -a "$LOG"; return; }
    [ "$left" -lt "$limit" ] && limit=$left
  fi
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

memory_summary() {  # a memory report in brief: the device's own peak beside the estimate, misfits, the OOM
  $PY - "$1" <<'PYEOF'
import json, sys
report = json.load(open(sys.argv[1]))
result = report["result"]
print("exit", report["exit_code"], "found", result.get("found"), "budget", result.get("budget"))
print("peak", result.get("peak"))
for d in result.get("devices", []):
    print("  device", d["device"], "limit", d["limit_bytes"], "estimate", d["peak_bytes"], "live", d["peak_live_bytes"],
          "measured", d["measured_peak_bytes"])
for f in result.get("functions", []):
    print("  function", f["name"], "peak", f["peak_bytes"], "temp", f["temp_bytes"], "xla_peak", f["xla_peak_bytes"],
          "schedule_peak", f["schedule_peak_bytes"], "needs", f["needs_bytes"], "fits", f["fits"], "dump", bool(f["dump"]))
oom = result.get("out_of_memory")
if oom:
    print("oom", oom["function"], oom["call_index"], oom["requested_bytes"], oom["at_compile"], oom["message"])
for hint in result.get("hints", []):
    print("  hint", hint["kind"], hint["saves_bytes"], hint["text"][:160])
print("notes", result.get("notes"))
PYEOF
}

memory_oom() {  # real out-of-memory errors on the device, under a 5% share of its memory (about 7 GiB on an H200)
  if [ "$($PY -c 'import jax; print(jax.default_backend())' 2>/dev/null)" = cpu ]; then  # no device limit there:
    echo "=== memory_oom: skipped on CPU (it would allocate 16 GiB and more of host memory)" | tee -a "$LOG"
    return
  fi
  # (1) [65536, 65536] f32 temporaries with no matmul: RESOURCE_EXHAUSTED at execution, raised asynchronously
  # (by the eager op that reads the result); (2) the same size from a matmul: XLA's GEMM autotuner finds no
  # configuration it can run and compilation fails with NOT_FOUND (H200, jax 0.11.2, 2026-12-04).
  cat > "$WORK/oom.py" <<'PYEOF'
import jax, jax.numpy as jnp

@jax.jit
def top_scores(q, k):
    scores = jnp.exp(q[:, None] - k[None, :])  # [65536, 65536] f32: 16 GiB, no matmul
    return jnp.sort(scores, axis=1)[:, -8:]

kept = [jnp.ones((4096, 4096)) * i for i in range(4)]  # 256 MiB live beside it
q, k = jnp.linspace(0, 1, 65536), jnp.linspace(1, 2, 65536)
print(float(top_scores(q, k)[0, 0]))
PYEOF
  cat > "$WORK/oom_gemm.py" <<'PYEOF'
import jax, jax.numpy as jnp

@jax.jit
def top_scores(q, k):
    return jnp.sort(q @ k.T, axis=1)[:, -8:]  # [65536, 65536] f32 scores from a matmul

q, k = jnp.ones((65536, 64)), jnp.ones((65536, 64))
print(float(top_scores(q, k)[0, 0]))
PYEOF
  for name in oom oom_gemm; do
    step "memory_$name" 120 env XLA_PYTHON_CLIENT_MEM_FRACTION=0.05 $PY -m jaxdbg memory "$WORK/$name.py" \
      $(J "memory_$name")
    memory_summary "$WORK/r/memory_$name.json" >>"$LOG" 2>&1
  done
}

benches() {  # every benchmark with a GPU path, one table of ratios at the end
  export JAXDBG_BENCH_SUMMARY="$OUT/ratios.jsonl"
  rm -f "$JAXDBG_BENCH_SUMMARY"
  local host=(env JAX_PLATFORMS=cpu XLA_FLAGS=--xla_force_host_platform_device_count=4)
  step bench_layer 60 $PY scripts/bench_layer.py --rounds 5 --calls 2000
  step bench_profile 150 $PY scripts/bench_profile.py --pairs 2 --steps 200
  step bench_watch 100 $PY scripts/bench_watch.py --model both --only-interleaved --steps 100
  if [ "$($PY -c 'import jax; print(jax.default_backend())' 2>/dev/null)" != cpu ]; then
    # a training step of >= 5 ms (issue 22's second figure): the same loops, wide enough to keep the device busy
    step bench_profile_train 120 $PY scripts/bench_profile.py --only a --pairs 2 --steps 60 --width 4096 --batch 4096
    step bench_watch_train 100 $PY scripts/bench_watch.py --model mlp --only-interleaved --steps 60 --width 4096 \
      --batch 4096
  fi
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

# (watch: bench_watch and bench_profile at length, by name only: benches runs both)
ALL="env doctor profile_script profile_function profile_monitor profile_recompile profile_host nan_hunt repro pipeline_real memory hang hang_bench call_cost benches pytest"
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
  profile_host)  # the input-pipeline verdict, syncs and transfers where device_put is asynchronous, and pmap
    step profile_host_numpy 180 $PY -m jaxdbg profile tests/corpus/linen_mnist_numpy_feed/train.py \
      --trace-calls 0 $(J profile_host_numpy)
    step profile_host_device 180 $PY -m jaxdbg profile tests/corpus/linen_mnist_numpy_feed/train.py \
      --trace-calls 0 $(J profile_host_device) -- --feed device
    step profile_pmap 180 $PY -m jaxdbg profile tests/corpus/pmap_data_parallel/train.py --trace-calls 3 $(J profile_pmap)
    step bench_profile_host 400 $PY scripts/bench_profile.py --pairs 3 --only e ;;
  nan_hunt) step nan_hunt_scan 120 $PY -m jaxdbg nan-hunt recipes/nan_scan/train.py $(J nan_scan) ;;
  repro) step repro_nan_graph 150 $PY -m jaxdbg repro recipes/repro_nan_graph/train.py $(J repro_nan_graph) ;;
  pipeline_real) step pipeline_real 150 env XLA_FLAGS=--xla_force_host_platform_device_count=4 \
    $PY -m jaxdbg pipeline-bench --mode real --stages 4 --microbatches 8 --seeds 2 --xprof $(J pipeline_real) ;;
  benches) benches ;;
  watch)  # jaxdbg.watch and nan-hunt against a plain run on the tutorial loop; profile's overhead (owed)
    step bench_watch 300 $PY scripts/bench_watch.py --model cnn --pairs 1 --steps 200
    step bench_profile 300 $PY scripts/bench_profile.py --pairs 3 ;;
  hang)  # hang-hunt on the device: async dispatch (a call returns before its results are ready: the ready check),
    # a stuck host loop with calls in flight, a callback on an XLA thread (not the caller's, as on CPU); the
    # recorder's overhead on a GPU step (tens of microseconds: where the fixed cost per call weighs most)
    step hang_stuck 150 $PY -m jaxdbg hang-hunt tests/corpus/hang_stuck_read/train.py --stall 10 $(J hang_stuck)
    step hang_lock 150 $PY -m jaxdbg hang-hunt tests/corpus/hang_callback_lock/train.py --stall 10 $(J hang_lock) ;;
  call_cost) step call_cost 120 $PY scripts/diag_call_cost.py ;;  # where a watched/profiled call's time goes
  hang_bench) step bench_hang 300 $PY scripts/bench_hang.py --rounds 20 --stall 5 ;;
  pytest)  # suites whose code paths change with the backend, with the accelerator as jax's default backend
    for suite in nan_recipes repro_cut jit_layer live_watch hang_units; do
      step "pytest_$suite" 240 env JAX_PLATFORMS= $PY -m pytest -q -p no:cacheprovider \
        --junitxml "$WORK/r/junit_$suite.xml" "tests/test_$suite.py"
    done ;;
  memory_oom) memory_oom ;;
  memory)  # jaxdbg memory on the device: its limit as the budget, its own peak beside the estimate, a real OOM
    step memory_remat 180 $PY -m jaxdbg memory recipes/memory_remat/train.py $(J memory_remat)
    memory_summary "$WORK/r/memory_remat.json" >>"$LOG" 2>&1
    step memory_leak 180 $PY -m jaxdbg memory recipes/memory_leak/train.py $(J memory_leak)
    memory_summary "$WORK/r/memory_leak.json" >>"$LOG" 2>&1
    memory_oom
    # Does jax.checkpoint on groups of layers lower the temporaries on this backend? (XLA:CPU: no; the hint says so)
    step memory_remat_gain 180 $PY - <<'PYEOF'
import jax, jax.numpy as jnp
DEPTH, WIDTH, BATCH = 12, 512, 2048
def make(group):
    def block(x, ws):
        for w in ws:
            x = jnp.tanh(x @ w)
        return x
    if group:
        block = jax.checkpoint(block, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
    def loss(params, x):
        g = group or DEPTH
        for i in range(0, DEPTH, g):
            x = block(x, params[i:i + g])
        return jnp.mean(x ** 2)
    return jax.jit(lambda params, x: jax.grad(loss)(params, x))
params, x = [jnp.ones((WIDTH, WIDTH))] * DEPTH, jnp.ones((BATCH, WIDTH))
for group in (0, 1, 2, 3, 4, 6, 12):
    stats = make(group).lower(params, x).compile().memory_analysis()
    print("checkpoint groups of", group or "none", "temp MiB", stats.temp_size_in_bytes / 2**20)
PYEOF
    step bench_memory 300 $PY scripts/bench_memory.py --only interleaved ;;
  *) echo "unknown check '$check'" | tee -a "$LOG" ;;
  esac
done
tar -czf "$OUT/reports.tar.gz" -C "$WORK" r
echo "done" | tee -a "$LOG"
