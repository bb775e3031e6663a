"""The child side of a contained run (see :mod:`jaxdbg.runner`): ``python -m jaxdbg._child WORKDIR``.

Reads ``WORKDIR/job.pkl`` (a :class:`~jaxdbg.protocol.Request`), calls the handler its type picks,
``handler(request, channel)``, and reports
an escaping exception over the channel. Fatal signals and hangs are seen by the parent; faulthandler
prints the Python stack of a crash, and of a hang when the parent sends SIGUSR1 before killing.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import signal
import sys
import traceback

from jaxdbg.launch import COMMAND_VARIABLE, XLA_FLAGS_VARIABLE
from jaxdbg.protocol import Channel, ChildFailed, describe_exception, handler_for

_current: Channel | None = None


def current_channel() -> Channel | None:
    """The channel of this contained run, or None outside one (lets deep hooks send results)."""
    return _current


def main(workdir: str) -> int:
    global _current
    faulthandler.enable(file=sys.stderr, all_threads=True)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    with open(os.path.join(workdir, "job.pkl"), "rb") as handle:
        request = pickle.load(handle)
    handler = handler_for(type(request))
    _install_job_agreement()
    if os.environ.get(XLA_FLAGS_VARIABLE):
        from jaxdbg._compat import add_xla_flags_at_backend_start  # it imports jax: only when flags are to add

        add_xla_flags_at_backend_start(os.environ[XLA_FLAGS_VARIABLE])
    channel = _current = Channel(os.path.join(workdir, "channel.bin"))
    try:
        handler(request, channel)
    except SystemExit as done:
        # A deliberate exit is not an exception: the parent sees status 'exit' and the code.
        if done.code in (None, 0):
            return 0
        if not isinstance(done.code, int):
            print(done.code, file=sys.stderr)
        return done.code if isinstance(done.code, int) else 1
    except BaseException as err:  # noqa: BLE001 - everything the target raises is reported to the parent
        channel.send(ChildFailed(describe_exception(err)))
        traceback.print_exc()
        return 1
    finally:
        _leave_job()
        channel.close()
        sys.stdout.flush()
        sys.stderr.flush()
    return 0


def _install_job_agreement() -> None:
    """A process of a jaxdbg command (the command line sets COMMAND_VARIABLE) compares its command with the other
    processes' of its jax.distributed job at the program's first jitted call: processes running different
    commands would each wait in the other's collectives (multihost.agree_on_command)."""
    if os.environ.get(COMMAND_VARIABLE) is None:
        return
    from jaxdbg.multihost import agree_at_first_call  # it imports jax: only in the run of a jaxdbg command

    agree_at_first_call()


def _leave_job() -> None:
    """In a jax.distributed job, exit together with the other processes (see multihost.leave_job): the child
    ends with os._exit, which skips jax's own exit handler that would do so."""
    if "jax" not in sys.modules:
        return
    from jaxdbg.multihost import leave_job

    with contextlib.suppress(Exception):  # never let leaving hide the run's own outcome
        leave_job()


if __name__ == "__main__":
    # Run through the importable module (not this __main__ copy) so current_channel() sees the channel.
    from jaxdbg._child import main as _importable_main

    code = _importable_main(sys.argv[1])
    sys.stdout.flush()
    sys.stderr.flush()
    # os._exit skips interpreter teardown, where jax's threads have been seen to hang or crash.
    os._exit(code)
