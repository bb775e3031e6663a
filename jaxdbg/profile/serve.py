"""``--serve``: xprof's web UI over a capture, on localhost only, in its own process.

xprof's own launcher listens on every interface and starts a gRPC worker; jaxdbg builds the same web app
from xprof's plugin and binds it to 127.0.0.1 (port 0 picks a free port), in a child process that is
stopped when jaxdbg is done with it.

Example:
    >>> server = start_xprof("out/trace")        # doctest: +SKIP
    >>> server.url                               # doctest: +SKIP
    'http://127.0.0.1:40213/'
    >>> server.stop()                            # doctest: +SKIP
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from jaxdbg._errors import TargetFailedError

_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@dataclass
class XprofServer:
    url: str
    process: subprocess.Popen

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def wait(self, announce: Callable[[], None] | None = None) -> None:
        """Block until the server exits or Ctrl-C; either way the server is stopped and this returns.

        Ctrl-C sets a flag rather than raising: a KeyboardInterrupt raised while the server is being stopped
        (the terminal sends SIGINT to the server too, so it may already be gone) would escape as exit 130.
        ``announce`` (printing the address) runs once that handler is in place, so a user (or a test) who
        presses Ctrl-C as soon as the address shows cannot hit the default handler.
        """
        interrupted = threading.Event()
        previous = signal.signal(signal.SIGINT, lambda *_: interrupted.set())
        try:
            if announce is not None:
                announce()
            while self.process.poll() is None and not interrupted.wait(0.2):
                pass
        finally:
            self.stop()
            signal.signal(signal.SIGINT, previous)


def start_xprof(logdir: str, port: int = 0, timeout: float = 60.0) -> XprofServer:
    """Start xprof on ``logdir`` at http://127.0.0.1:PORT/ and return once it listens."""
    if not os.path.isdir(logdir):
        raise TargetFailedError(f"--serve: no capture folder '{logdir}' to serve")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_PARENT, env.get("PYTHONPATH")) if p)
    process = subprocess.Popen(
        [sys.executable, "-m", "jaxdbg.profile.serve", os.path.abspath(logdir), str(port)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env, text=True,
    )
    stdout = process.stdout
    assert stdout is not None  # stdout=PIPE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready, _, _ = select.select([stdout], [], [], 0.2)
        if ready:
            line = stdout.readline()
            if line.startswith("LISTENING "):
                return XprofServer(f"http://127.0.0.1:{int(line.split()[1])}/", process)
            if not line and process.poll() is not None:
                break
        elif process.poll() is not None:
            break
    XprofServer("", process).stop()
    raise TargetFailedError("--serve: xprof did not start; check that the xprof package is installed "
                            "(pip install xprof) and run 'xprof --logdir <trace folder>' yourself")


def main(argv: list[str]) -> int:
    """Child side: build xprof's web app for ``logdir`` and serve it on 127.0.0.1:``port``."""
    from cheroot import wsgi
    from xprof import server

    logdir, port = argv[0], int(argv[1])
    context = server.TBContext(logdir, server.DataProvider(logdir), server.TBContext.Flags(False))
    context.hide_capture_profile_button = True
    context.enable_tab_name_label = False
    context.src_prefix = None
    plugin = server.ProfilePluginLoader().load(context)
    httpd = wsgi.Server(("127.0.0.1", port), server.make_wsgi_app(plugin))
    httpd.prepare()
    print(f"LISTENING {httpd.bind_addr[1]}", flush=True)
    try:
        httpd.serve()
    finally:
        httpd.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
