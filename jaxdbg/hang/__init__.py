"""``hang-hunt``: which process of a JAX job is stuck, where, and what the others wait in.

A flight recorder (:mod:`jaxdbg.hang.recorder`, a jit-layer hook) keeps each process's last calls and host
callbacks; a watchdog thread (:mod:`jaxdbg.hang.watchdog`) notices a stall (no progress and no work for
``--stall`` seconds, SIGUSR1, ``--timeout``) and takes every thread's stack; the job's processes meet
through JAX's coordination service (:mod:`jaxdbg.hang.job`), and :func:`jaxdbg.hang.verdict.judge` names the
stuck process, what the others wait in, a divergence between processes, a dead process, or a deadlock.
:func:`hunt` runs a target contained (the command line); :func:`hunt_pids` looks at processes already
running (py-spy); :class:`StallWatch` is the in-process form behind ``jaxdbg.watch(stall_after=...)``.

Importing this package imports no jax.
"""

from jaxdbg.hang.api import HangOptions as HangOptions
from jaxdbg.hang.api import HangRun as HangRun
from jaxdbg.hang.api import hunt as hunt
from jaxdbg.hang.result import HangResult as HangResult
