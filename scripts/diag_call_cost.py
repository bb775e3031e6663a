"""Where the time of one watched or profiled call of a tiny jitted function goes, on this machine's default backend.

bench_layer.py says how much jaxdbg adds per call; this says where it goes, for a device session of a few minutes:
the costs of the jax primitives the hooks use (a dispatch, ``copy_to_host_async``, ``is_ready``, ``np.asarray``
of a copied vector), then per call plain / watched / profiled, with cProfile's top functions of each hooked loop.

    python scripts/diag_call_cost.py [--calls 2000] [--top 20]

Measured on an H200 (jax 0.11.2, 2026-12-04): a plain tiny call 26-33 us, ``copy_to_host_async`` of a fresh
call's output ~50 us more, ``np.asarray`` of a vector already copied ~6 us; the watch then added ~108 us per call,
of which one ``copy_to_host_async`` per call was ~30 us (cProfile) before the vectors were copied 16 at a time.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import tempfile
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np


def per_call(f: Callable, x: Any, calls: int) -> float:
    """Wall microseconds per call of ``f(x)`` over ``calls`` calls (the last one waited for)."""
    r = f(x)
    r.block_until_ready()
    started = time.perf_counter()
    for _ in range(calls):
        r = f(x)
    r.block_until_ready()
    return (time.perf_counter() - started) / calls * 1e6


def primitive(name: str, action: Callable[[], Any], calls: int) -> None:
    action()
    started = time.perf_counter()
    for _ in range(calls):
        action()
    print(f"  {name:48s} {(time.perf_counter() - started) / calls * 1e6:8.1f} us")


def top_functions(loop: Callable[[], Any], top: int) -> str:
    profile = cProfile.Profile()
    profile.enable()
    loop()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue().split("ncalls", 1)[-1].rstrip()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--top", type=int, default=20)
    args = parser.parse_args()
    calls = args.calls

    import jaxdbg
    from jaxdbg.profile.instrument import Recorder, compile_listener, tracking_jit

    x = jnp.ones((16,))
    plain = jax.jit(lambda x: x * 2.0 + 1.0)
    two = jax.jit(lambda x: (x * 2.0 + 1.0, jnp.max(jnp.abs(x))))
    ready = plain(x)
    ready.block_until_ready()
    print(f"primitives on {jax.devices()[0].device_kind} (jax {jax.__version__})")
    primitive("a tiny call", lambda: plain(x), calls)
    primitive("a tiny call with a reduction as 2nd output", lambda: two(x), calls)
    primitive("is_ready of a ready array", ready.is_ready, calls)
    primitive("np.asarray of a ready array read before", lambda: np.asarray(ready), calls)
    primitive("a tiny call + copy_to_host_async", lambda: plain(x).copy_to_host_async(), calls)
    primitive("a tiny call + block_until_ready", lambda: plain(x).block_until_ready(), calls)
    copied = [plain(x) for _ in range(64)]
    for array in copied:
        array.copy_to_host_async()
    jax.block_until_ready(copied)
    started = time.perf_counter()
    for array in copied:
        np.asarray(array)
    print(f"  {'np.asarray of a vector copied ahead':48s} {(time.perf_counter() - started) / 64 * 1e6:8.1f} us")

    def hooked(name: str, enter: Callable[[contextlib.ExitStack, str], Any]) -> None:
        with contextlib.ExitStack() as stack, tempfile.TemporaryDirectory() as out:
            enter(stack, out)
            f = jax.jit(lambda x: x * 2.0 + 1.0)
            per_call(f, x, 200)
            plain_us = min(per_call(plain, x, calls) for _ in range(3))
            hooked_us = min(per_call(f, x, calls) for _ in range(3))
            added = hooked_us - plain_us
            print(f"\n{name}: plain {plain_us:.1f} us, hooked {hooked_us:.1f} us (+{added:.1f} us a call)")
            print(top_functions(lambda: per_call(f, x, calls), args.top))

    hooked("jaxdbg.watch", lambda stack, out: stack.enter_context(jaxdbg.watch(out=out)))
    for sync_every in (8, 1):
        def profiled(stack: contextlib.ExitStack, out: str, sync_every: int = sync_every) -> None:
            recorder = Recorder(lambda message: None, out, sync_every=sync_every)
            stack.enter_context(compile_listener(recorder))
            stack.enter_context(tracking_jit(recorder))
        hooked(f"profile, --sync-every {sync_every}", profiled)


if __name__ == "__main__":
    main()
