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

from jaxdbg.memory.program import ProgramInfo as ProgramInfo
from jaxdbg.memory.program import analyse as analyse
from jaxdbg.memory.result import MemoryResult as MemoryResult
from jaxdbg.memory.result import ProgramMemory as ProgramMemory
from jaxdbg.memory.run import MemoryOptions as MemoryOptions
from jaxdbg.memory.run import MemoryRun as MemoryRun
from jaxdbg.memory.run import memory as memory
from jaxdbg.memory.units import format_bytes as format_bytes
from jaxdbg.memory.units import parse_bytes as parse_bytes
