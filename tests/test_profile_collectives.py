"""Per-op rows of collectives name the sharding that put them there: which argument, which op, which line.

One process with 4 CPU devices (tests/conftest.py) on a 2x2 mesh: the weight ``w1`` and the batch's features
are split over the ``model`` axis, so the forward dot_general contracts over a split dimension (partial sums,
an all-reduce over ``model``), and the batch is split over ``data``, so the gradients are summed over
``data``. The multi-process case (the gradient's all-reduce across processes) is checked in
tests/test_multiprocess.py.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import jsonschema

from jaxdbg.profile.collectives import device_groups
from jaxdbg.schema import schema

PROGRAM = '''\
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))


@jax.jit
def step(params, batch):
    def loss(params):
        h = jnp.tanh(batch["x"] @ params["w1"])  # contracting over the model-split features
        return jnp.mean((h @ params["w2"]) ** 2)
    grads = jax.grad(loss)(params)
    return jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)


params = {"w1": jax.device_put(jnp.ones((16, 32)) * 0.01, NamedSharding(mesh, P("model", None))),
          "w2": jax.device_put(jnp.ones((32, 4)) * 0.01, NamedSharding(mesh, P()))}
batch = {"x": jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P("data", "model")))}
for _ in range(3):
    params = step(params, batch)
print(float(params["w2"].sum()))
'''


def test_collective_rows_name_the_argument_axis_and_op_that_put_them_there(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(PROGRAM)
    line = next(i for i, text in enumerate(PROGRAM.splitlines(), start=1) if "contracting over" in text)
    done = subprocess.run([sys.executable, "-m", "jaxdbg", "profile", str(script), "--out", str(tmp_path / "out"),
                           "--json", str(tmp_path / "r.json"), "--top", "50", "--csv", str(tmp_path / "csv")],
                          capture_output=True, text=True, timeout=240, env={**os.environ, "COLUMNS": "200"})
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "r.json").read_text())
    jsonschema.validate(report, schema())
    (step,) = [f for f in report["result"]["functions"] if f["name"] == "step"]
    causes = {tuple(op["sharding_cause"]["axes"]): op["sharding_cause"] for op in step["ops"]
              if op["category"] == "collective"}
    assert all(op["sharding_cause"] is None for op in step["ops"] if op["category"] != "collective")
    # Forward: the contracting dimension is split over 'model' by both operands of the dot.
    forward = causes[("model",)]
    assert [(a["argument"], a["sharding"]) for a in forward["arguments"]] == [
        ("params['w1']", "P('model', None)"), ("batch['x']", "P('data', 'model')")]
    assert (forward["op"], forward["op_name"]) == ("dot_general", "jit(step)/jvp()/dot_general")
    assert forward["source"]["line"] == line and forward["source"]["file"] == str(script)
    # Backward: the gradients are summed over 'data', because the batch is split there (the weights are not).
    backward = causes[("data",)]
    assert [a["argument"] for a in backward["arguments"]] == ["batch['x']"]
    assert backward["op_name"].startswith("jit(step)/transpose(")
    assert device_groups(backward["devices"]) == [[0, 2], [1, 3]]  # XLA writes them as a list or in iota form
    assert os.path.exists(step["hlo"]["shardings"])
    assert "over mesh axis 'model': params['w1'] P('model', None), batch['x'] P('data', 'model') split" in done.stdout
    with open(tmp_path / "csv" / "ops.csv", newline="") as handle:  # the same cause in the flat table
        rows = {row["sharding_axes"]: row for row in csv.DictReader(handle) if row["function"] == "step"}
    assert rows["model"]["sharding_arguments"] == "params['w1'] P('model', None); batch['x'] P('data', 'model')"
    assert rows["data"]["sharding_arguments"] == "batch['x'] P('data', 'model')"


def test_hlo_sharding_forms_and_groups_read_without_a_mesh(tmp_path):
    """A capture's HLO (no shardings.json): the HLO's own sharding text names the argument's pieces. Then a
    collective inside a scan's body: followed out of the loop to the arguments, its mesh axis named."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding
    from jax.sharding import PartitionSpec as P

    from jaxdbg.profile.collectives import argument_specs, read_specs, sharding_cause, write_specs
    from jaxdbg.profile.hlo import parse_hlo

    mesh = Mesh(np.array(jax.devices()[:4]), ("data",))
    x = jax.device_put(jnp.ones((8, 4)), NamedSharding(mesh, P("data")))
    w = jax.device_put(jnp.ones((4, 4)), NamedSharding(mesh, P()))
    module = parse_hlo(jax.jit(lambda w, x: x.T @ jnp.tanh(x @ w)).lower(w, x).compile().as_text())
    (cause,) = [sharding_cause(module, name) for name, op in module.ops.items() if op.category == "collective"]
    assert [a.argument for a in cause.arguments] == ["x"] and cause.arguments[0].sharding.startswith("{devices=[4")
    assert cause.axes == () and cause.op == "dot_general"

    mesh = Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("data", "model"))
    w = jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P("model", None)))
    xs = jax.device_put(jnp.ones((3, 4, 16)), NamedSharding(mesh, P(None, None, "model")))
    unused = jax.device_put(jnp.ones(2), NamedSharding(mesh, P("data")))

    def scanned(w, unused, xs):
        return jax.lax.scan(lambda c, x: (c + jnp.sum(x @ w), None), 0.0, xs)[0]

    compiled = jax.jit(scanned).lower(w, unused, xs).compile()
    module = parse_hlo(compiled.as_text())
    write_specs(str(tmp_path / "s.json"), argument_specs(compiled))
    read_specs(module, str(tmp_path / "s.json"))  # the unused argument is dropped: xs is still matched by name
    (cause,) = [sharding_cause(module, name) for name, op in module.ops.items() if op.category == "collective"]
    assert [(a.argument, a.sharding) for a in cause.arguments] == [("w", "P('model', None)"),
                                                                   ("xs", "P(None, None, 'model')")]
    assert cause.axes == ("model",) and cause.op_name.endswith("dot_general") and "while" in cause.op_name
