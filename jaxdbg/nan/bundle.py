"""The failing call, saved so ``jaxdbg repro`` (or a person) can start from it.

Files written into the output folder:

- ``nan_inputs.npz``: the call's flat inputs ``arg0, arg1, ...`` in the order of the jaxpr's inputs (when
  every argument is a plain array, that is also the function's positional order, usable as ``--inputs``);
  bfloat16 arrays are stored as float32 (npz cannot name bfloat16) and listed in the manifest; a typed PRNG
  key array as its key data (uint32, one more dimension), its manifest dtype ``key<IMPL>``:
  ``jax.random.wrap_key_data(data, impl=IMPL)`` gives it back, and ``--inputs nan_inputs.npz`` does so itself.
- ``nan_jaxpr.txt``: the traced jaxpr of the failing function.
- ``nan_function.stablehlo.mlir``: its StableHLO, as jit lowers it for these inputs.
- ``nan_bundle.json``: the manifest: function, call index, input names/shapes/dtypes, the origin.

In a multi-process job an input that spans other processes' devices cannot be copied to one host: each
process saves the shards it holds (``argI_shardK``, with their index ranges in the manifest), in its own
``process-<index>/`` folder.

Example:
    >>> artifacts = save_bundle("out", call, closed, first)     # doctest: +SKIP
    >>> sorted(artifacts)                                        # doctest: +SKIP
    ['bundle', 'inputs', 'jaxpr', 'stablehlo']
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from jaxdbg import _compat
from jaxdbg.memory.live import device_name
from jaxdbg.nan.calls import Call
from jaxdbg.nan.placement import index_ranges
from jaxdbg.nan.result import Origin
from jaxdbg.nonfinite import host_readable
from jaxdbg.report import to_jsonable
from jaxdbg.storable import is_key, key_impl, key_name, restore, storable
from jaxdbg.target import TREE_KEY, short_dtype

if TYPE_CHECKING:
    from jaxdbg.nan.analyses import Findings


def _storable(value: Any) -> tuple[np.ndarray, str]:
    """The array as npz can hold it, and its dtype's name in the manifest: bfloat16 is stored as float32, a typed
    PRNG key array as its key data, named ``key<IMPL>`` (:mod:`jaxdbg.storable`)."""
    data, name = storable(value)
    if key_impl(name) is not None:
        return data, str(name)
    host = restore(data, name)
    dtype = short_dtype(host.dtype)
    return (host.astype(np.float32) if dtype == "bf16" else host), dtype


def _store_shards(arrays: dict, key: str, value: Any) -> list[dict]:
    """Store this process's shards of a global array; returns where each piece goes in the whole."""
    pieces = []
    for k, shard in enumerate(sorted(value.addressable_shards, key=lambda s: s.device.id)):
        arrays[f"{key}_shard{k}"], _ = _storable(shard.data)
        pieces.append({"key": f"{key}_shard{k}", "device": device_name(shard.device),
                       "index": [list(r) for r in index_ranges(shard.index, value.shape)]})
    return pieces


def save_bundle(out_dir: str, call: Call, closed: Any, first: Origin | None,
                artifacts: dict[str, str] | None = None) -> dict[str, str]:
    """Write the bundle files; returns ``artifacts`` (``{artifact name: path}``), filled as each file is written
    (one that fails leaves those before it listed)."""
    os.makedirs(out_dir, exist_ok=True)
    artifacts = {} if artifacts is None else artifacts
    leaves = call.leaves()
    names = call.leaf_names()
    arrays: dict[str, Any] = {}  # (Any: np.savez's **kwds would otherwise clash with its allow_pickle)
    dtypes, shards = [], {}
    for i, leaf in enumerate(leaves):
        if not host_readable(leaf):
            shards[f"arg{i}"] = _store_shards(arrays, f"arg{i}", leaf)
            dtypes.append(key_name(leaf) if is_key(leaf) else short_dtype(leaf.dtype))
            continue
        host, dtype = _storable(leaf)
        arrays[f"arg{i}"] = host
        dtypes.append(dtype)
    keys = {f"arg{i}": d for i, d in enumerate(dtypes) if key_impl(d) is not None and f"arg{i}" in arrays}
    if keys:  # `--inputs nan_inputs.npz` gives the keys back (jaxdbg.target.load_npz_inputs)
        arrays[TREE_KEY] = np.array(json.dumps({"args": [{"leaf": i} for i in range(len(leaves))], "dtypes": keys}))
    inputs_path = os.path.join(out_dir, "nan_inputs.npz")
    np.savez(inputs_path, **arrays)
    artifacts["inputs"] = inputs_path
    if closed is not None:
        jaxpr_path = os.path.join(out_dir, "nan_jaxpr.txt")
        with open(jaxpr_path, "w") as handle:
            handle.write(str(closed) + "\n")
        artifacts["jaxpr"] = jaxpr_path
        hlo = _stablehlo(closed, leaves)
        if hlo is not None:
            hlo_path = os.path.join(out_dir, "nan_function.stablehlo.mlir")
            with open(hlo_path, "w") as handle:
                handle.write(hlo)
            artifacts["stablehlo"] = hlo_path
    _, dyn_args, dyn_kwargs = call.dynamic()
    positional = not dyn_kwargs and len(dyn_args) == len(leaves) and len(dyn_args) == len(call.args)
    manifest = {
        "function": call.name,
        "call_index": call.call_index,
        "call_site": call.call_site,
        "inputs": [{"key": f"arg{i}", "name": n, "shape": list(np.shape(v)), "dtype": d}
                   for i, (n, v, d) in enumerate(zip(names, leaves, dtypes))],
        "inputs_are_positional_arguments": positional,
        "static_arguments": {str(k): repr(v) for k, v in _statics(call).items()},
        "origin": first,
        "local_shards": shards,  # inputs stored shard by shard (multi-process job): key -> stored pieces
    }
    bundle_path = os.path.join(out_dir, "nan_bundle.json")
    with open(bundle_path, "w") as handle:
        json.dump(to_jsonable(manifest), handle, indent=2)
    artifacts["bundle"] = bundle_path
    return artifacts


def _statics(call: Call) -> dict:
    nums, names = call._static_sets()
    found = {i: a for i, a in enumerate(call.args) if i in nums}
    found.update({k: v for k, v in call.kwargs.items() if k in names})
    return found


def _stablehlo(closed: Any, leaves: list) -> str | None:
    jaxpr, consts = _compat.open_jaxpr(closed)

    def replay(*xs: Any) -> list:
        return jax.core.eval_jaxpr(jaxpr, consts, *xs)

    try:
        return jax.jit(replay).lower(*leaves).as_text()
    except Exception:  # noqa: BLE001 - the bundle is a courtesy: a function that will not lower is skipped
        return None


def analyse(findings: Findings) -> None:
    """The ``bundle`` analysis: a jitted finding's call saved under ``--out`` (this process's folder in a job)."""
    from jaxdbg import multihost

    out_dir = findings.options.out_dir
    if out_dir and findings.call is not None:
        closed = getattr(findings.localisation, "closed_jaxpr", None)
        save_bundle(multihost.process_folder(out_dir), findings.call, closed, findings.first, findings.artifacts)
