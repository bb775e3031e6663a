"""A compile's HLO written under ``--out``: its StableHLO, its optimised HLO and, where it is sharded, the
PartitionSpecs of its arguments (``hlo/<name>.stablehlo.mlir``, ``.optimized.hlo.txt``, ``.shardings.json``).

Example:
    >>> import tempfile
    >>> paths = write_hlo(tempfile.mkdtemp(), "train_step", 1, "module @m {}", "HloModule m")
    >>> sorted(os.path.basename(p) for p in paths.values())
    ['train_step.1.optimized.hlo.txt', 'train_step.1.stablehlo.mlir']
"""

from __future__ import annotations

import os
import re

from jaxdbg.profile.collectives import argument_specs, write_specs


def write_hlo(out_dir: str, name: str, index: int, stablehlo: str, optimized: str,
              compiled: object = None) -> dict[str, str]:
    """Write one compile's StableHLO and optimised HLO under ``out_dir/hlo`` (with ``compiled``, also its
    arguments' PartitionSpecs where it is sharded: ``shardings.json``); returns their paths."""
    folder = os.path.join(out_dir, "hlo")
    os.makedirs(folder, exist_ok=True)
    stem = re.sub(r"[^\w.\-]", "_", name) + (f".{index}" if index else "")
    paths = {"stablehlo": os.path.join(folder, f"{stem}.stablehlo.mlir"),
             "optimized_hlo": os.path.join(folder, f"{stem}.optimized.hlo.txt")}
    with open(paths["stablehlo"], "w") as handle:
        handle.write(stablehlo)
    with open(paths["optimized_hlo"], "w") as handle:
        handle.write(optimized)
    specs = argument_specs(compiled) if compiled is not None else None
    if specs is not None:
        paths["shardings"] = os.path.join(folder, f"{stem}.shardings.json")
        write_specs(paths["shardings"], specs)
    return paths


def later_compiles(path: str, compiles: int) -> list[str]:
    """The optimised HLO files of a function's later compiles, given its first one's (``write_hlo`` numbers them
    ``<stem>.<n>``), those that exist.

        >>> later_compiles("/nowhere/hlo/f.optimized.hlo.txt", 3)
        []
    """
    suffix = ".optimized.hlo.txt"
    if not path.endswith(suffix):
        return []
    stem = path[: -len(suffix)]
    return [p for p in (f"{stem}.{n}{suffix}" for n in range(1, compiles)) if os.path.exists(p)]
