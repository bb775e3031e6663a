"""``jaxdbg memory``: what fills device memory, per jitted function, over the run, and at an out-of-memory error.

A library first (the command line in :mod:`jaxdbg.cli.memory` only parses and renders):

- :func:`memory` runs a script or one function contained and returns a :class:`MemoryRun`;
- :func:`analyse` reads one ``Compiled`` object's memory and XLA buffer assignment (in any program);
- :func:`parse_bytes` / :func:`format_bytes` read and write byte counts (``16GiB``).

Example:
    >>> from jaxdbg.target import parse_target
    >>> options = MemoryOptions(device_memory=parse_bytes("16GiB"))
    >>> run = memory(parse_target("train.py"), options, "out")           # doctest: +SKIP
    >>> [(f.name, f.peak_bytes, f.fits) for f in run.result.functions]   # doctest: +SKIP
    [('train_step', 21474836480, False)]
"""

from typing import Any

from jaxdbg._lazy import attribute
from jaxdbg.memory.messages import MemoryOptions as MemoryOptions
from jaxdbg.memory.result import MemoryResult as MemoryResult
from jaxdbg.memory.result import ProgramMemory as ProgramMemory
from jaxdbg.memory.units import format_bytes as format_bytes
from jaxdbg.memory.units import parse_bytes as parse_bytes

_LAZY = {  # loaded on first use: the job's child needs neither (it unpickles MemoryOptions from messages), and
    # they bring in the profile package's modules, the report's writers and the program's analysis
    "memory": "jaxdbg.memory.run", "MemoryRun": "jaxdbg.memory.run",
    "analyse": "jaxdbg.memory.program", "ProgramInfo": "jaxdbg.memory.program",
}


def __getattr__(name: str) -> Any:
    return attribute(__name__, _LAZY, name)
