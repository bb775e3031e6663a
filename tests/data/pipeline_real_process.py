"""One process of a two-process real pipeline run (tests/test_pipeline_real_processes.py starts two).

Each process joins the job, runs its own stages, and writes the merged runs it got to OUT/process-<i>.json.
Then one more run, where process 0 plays a party that alters its first note in the coordination service (an
earlier arrival time for the input it carries): each process records why that run stopped."""

import json
import sys

from jaxdbg.pipeline.transport import join_job

transport = join_job("127.0.0.1", 120.0)  # before anything starts jax's backend


class AlteringStore:
    """The coordination-service client, but the first note written through it has its arrival moved earlier
    (its HMAC left as it was)."""

    def __init__(self, client):
        self.client, self.altered = client, False

    def __getattr__(self, name):
        return getattr(self.client, name)

    def key_value_set(self, key, value, *args, **kwargs):
        if "/note/" in key and not self.altered:
            sealed = json.loads(value)
            note = json.loads(sealed["note"])
            note["arrival"] -= 0.001
            value, self.altered = json.dumps({**sealed, "note": json.dumps(note)}), True
        return self.client.key_value_set(key, value, *args, **kwargs)



from jaxdbg import multihost  # noqa: E402
from jaxdbg.pipeline.policies import make_policies  # noqa: E402
from jaxdbg.pipeline.real import ModelSpec, RealPipeline  # noqa: E402
from jaxdbg.pipeline.schedules import build_schedule, shape_for  # noqa: E402
from jaxdbg.pipeline.variability import Costs, parse_variability, realise  # noqa: E402

FAST = Costs(forward_s=0.002, backward_s=0.004, comm_s=0.0002)
shape = shape_for("1f1b", 4, 4, 1)
pipe = RealPipeline(shape, ModelSpec(width=16, rows=4), transport=transport)
durations = realise(parse_variability("jitter:cv=0.3+comm:cv=0.5", 4), shape, FAST, 0)
runs = []
for policy, hint, cap, comm in [("fixed", None, 1, "async"), ("ready", "bf", 2, "sync")]:
    schedule = build_schedule("1f1b", shape)
    run = pipe.run(make_policies(policy, shape, schedule, hint, cap, costs=FAST), durations, comm, timeout=120)
    r = run.record
    runs.append({"policy": policy, "hint": hint, "cap": cap, "comm": comm, "start": r.start.tolist(),
                 "end": r.end.tolist(), "blocked": list(r.blocked_s), "memory_wait": list(r.memory_wait_s),
                 "peak": list(r.peak_inflight), "decisions": r.decisions, "decision_ns": r.decision_ns,
                 "delay": run.message_delay.tolist(), "grad_diff": run.max_abs_grad_diff,
                 "grad_max": run.max_abs_grad})
if transport.index == 0:
    transport.client = AlteringStore(transport.client)
try:
    pipe.run(make_policies("fixed", shape, build_schedule("1f1b", shape)), durations, "async", timeout=60)
    stopped = None
except Exception as err:  # noqa: BLE001 - the run must stop; what it says is the test's
    stopped = f"{type(err).__name__}: {err}"
with open(f"{sys.argv[1]}/process-{transport.index}.json", "w") as handle:
    json.dump({"index": transport.index, "count": transport.count, "owner": pipe.owner,
               "stage_processes": [d.process_index for d in pipe.devices], "runs": runs, "tampered": stopped}, handle)
multihost.leave_job()
