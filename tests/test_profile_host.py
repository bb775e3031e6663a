"""Does the device wait for the host? Transfers and forced synchronisations found at the user's line, and the
input-pipeline verdict, on real jitted loops: two run in this process under profile's own instrumentation (one
whose host sleeps through most of each step, one that keeps the device busy), and the corpus's Flax MNIST loop
fed from NumPy run by ``jaxdbg profile``. What is asserted is structural: the verdict's class with a wide margin,
and each sync and transfer at its line with its count; never a time."""

from __future__ import annotations

import os
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxdbg.profile import ProfileOptions, profile, write_profile_csv
from jaxdbg.profile.host_bound import StepClock, SyncSite, input_pipeline
from jaxdbg.profile.instrument import Recorder, compile_listener, tracking_jit
from jaxdbg.profile.transfers import timed_transfers
from jaxdbg.target import parse_target

HERE = os.path.abspath(__file__)
CORPUS = os.path.join(os.path.dirname(HERE), "corpus")
STEPS = 15


def line_of(marker: str, path: str = HERE) -> int:
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text and "line_of(" not in text)


def host_bound_loop(steps: int) -> None:
    """The host sleeps through most of each step (as if building a batch), then copies it, runs a tiny step and
    reads the loss back: every kind of sync once or more."""

    @jax.jit
    def step(w, x):
        return w - 0.01 * x.T @ jnp.tanh(x @ w), jnp.mean(x @ w)

    w = jax.device_put(np.zeros((64, 64), np.float32))  # mark: device_put
    losses = []
    for i in range(steps):
        time.sleep(0.08)  # the host builds the next batch
        x = jnp.asarray(np.full((32, 64), i, np.float32))  # mark: jnp.asarray
        w, loss = step(w, x)
        losses.append(np.asarray(loss))  # mark: np.asarray every step
        if i % 5 == 4:
            print(f"step {i}: loss {float(loss):.3f}")  # mark: float every 5 steps
    print(w[0, 0])  # mark: print
    assert loss.item() == losses[-1]  # mark: item
    jax.block_until_ready(w)  # mark: jax.block_until_ready
    w.block_until_ready()  # mark: method block_until_ready
    jax.device_get(w)  # mark: device_get
    jnp.array(np.arange(8), dtype=jnp.float32)  # mark: jnp.array with a dtype (converted, not staged, by jax)


def device_bound_loop(steps: int) -> None:
    """Each step is a chain of 512x512 matmuls the host only dispatches; nothing read back until the end."""

    @jax.jit
    def step(w):
        for _ in range(4):
            w = jnp.tanh(w @ w)
        return w

    w = jnp.full((512, 512), 0.01)
    for _ in range(steps):
        w = step(w)
    float(w[0, 0])


def recorded(loop, folder) -> Recorder:
    recorder = Recorder(lambda message: None, str(folder), sync_every=8)
    with compile_listener(recorder), tracking_jit(recorder), timed_transfers(recorder):
        loop(STEPS)
    return recorder


def verdict(recorder: Recorder):
    syncs = [_sync_row(kind, source, site) for (kind, source), site in recorder.syncs.items()]
    names = {ident: f.name for ident, f in recorder.functions.items()}
    return input_pipeline(recorder.clock.steps, names, syncs, dict.fromkeys(names, STEPS))


def _sync_row(kind, source, site):
    from jaxdbg.profile.model import HostSync

    return HostSync(kind, source, site.count, site.wait_s, site.idle_s, site.bytes)


@pytest.fixture(scope="module")
def host_bound(tmp_path_factory) -> Recorder:
    return recorded(host_bound_loop, tmp_path_factory.mktemp("host_bound"))


@pytest.fixture(scope="module")
def device_bound(tmp_path_factory) -> Recorder:
    return recorded(device_bound_loop, tmp_path_factory.mktemp("device_bound"))


def test_each_sync_is_found_at_its_line_with_its_count(host_bound):
    found = {(kind, source.line): site.count for (kind, source), site in host_bound.syncs.items()
             if source is not None and source.file == HERE}
    assert found == {
        ("np.asarray", line_of("# mark: np.asarray every step")): STEPS,
        ("float()", line_of("# mark: float every 5 steps")): STEPS // 5,
        ("print/format", line_of("# mark: print")): 1,
        (".item()", line_of("# mark: item")): 1,
        ("block_until_ready", line_of("# mark: jax.block_until_ready")): 1,
        ("block_until_ready", line_of("# mark: method block_until_ready")): 1,
        ("device_get", line_of("# mark: device_get")): 1,
    }


def test_transfers_are_counted_and_sized_at_their_lines(host_bound):
    moved = {(kind, source.line): entry for (kind, source), entry in host_bound.transfers.items()
             if source is not None and source.file == HERE}
    count, seconds, nbytes = moved["jnp.asarray", line_of("# mark: jnp.asarray")]
    assert count == STEPS and nbytes == STEPS * 32 * 64 * 4 and seconds > 0
    assert moved["device_put", line_of("# mark: device_put")][::2] == [1, 64 * 64 * 4]
    assert moved["jnp.asarray", line_of("# mark: jnp.array with a dtype")][::2] == [1, 8 * 8]  # int64 numpy
    reads = moved["to_host", line_of("# mark: np.asarray every step")]
    assert reads[0] == STEPS and reads[2] == STEPS * 4  # one f32 loss a step


def test_a_host_that_sleeps_through_the_step_is_highly_input_bound(host_bound):
    figures = verdict(host_bound)
    # The host sleeps 80 ms a step; the device's step is a 32x64 @ 64x64 matmul (microseconds, a few ms on a
    # loaded machine): the device waits 20% of the step or more however the machine's load moves the figures.
    assert figures.function == "step" and figures.steps >= STEPS - 5
    assert figures.verdict == "highly input-bound"
    assert figures.fixes[0].startswith("prefetch")


def test_a_device_that_is_never_starved_is_not_input_bound(device_bound):
    figures = verdict(device_bound)
    # Each step is ~1 GFLOP of matmuls; the host only dispatches it. jaxdbg's own waits to time one call in 8
    # are taken out: a plain run of this loop queues every step behind the previous one.
    assert figures.function == "step" and figures.verdict == "not input-bound"
    assert figures.device_idle_fraction < 0.05 and figures.fixes == ()
    assert [kind for kind, _ in device_bound.syncs] == ["float()"]  # the one read, after the loop


def test_the_clock_takes_profiles_own_waits_out():
    # 10 ms of device work a step and 6 ms of host work, overlapped in a plain run (the host runs ahead). The
    # profile waited for calls 0-2 and 8 to time them: without taking that out, those steps would show the
    # host's 6 ms as device idle time.
    clock, t = StepClock(), 0.0
    for index in range(16):
        waited = index < 3 or index == 8
        end = t + (0.0101 if waited else 0.0001)
        clock.call(0, t, end, put_s=0.0, compile_s=0.0, execute_s=0.010, waited=waited, steady=index > 0)
        t = end + 0.006
    figures = input_pipeline(clock.steps, {0: "step"}, [])
    assert figures.verdict == "not input-bound" and figures.device_idle_s == 0.0


def test_one_slowed_timed_call_does_not_stand_for_the_unseen_calls_after_it():
    # A call every 2 ms, 1 ms on the device; the profile times one call in 10, and call 20 took 50 ms (another process
    # had its core). The unseen calls after it run what the latest timed calls' median says, not 50 ms each.
    clock = StepClock()
    for index in range(80):
        t = index * 0.002
        waited = index < 3 or index % 10 == 0
        execute = 0.050 if index == 20 else 0.001
        clock.call(0, t, t + (execute if waited else 0.0001), put_s=0.0, compile_s=0.0, execute_s=execute,
                   waited=waited, steady=index > 0)
    figures = input_pipeline(clock.steps, {0: "step"}, [])
    assert figures.device_s < 0.002 and figures.verdict != "not input-bound"  # 1 ms a call, and call 20's 50 ms


def test_unseen_calls_a_sync_waited_longer_for_than_estimated_count_in_the_execute_total():
    # A while_loop solver: 1 ms a call while the profile times the first three; five more run ahead unseen, the
    # last of them iterating far longer, and the program's read of the answer waits 0.3 s for them. At 1 ms each the
    # queue was estimated done by then: those 0.3 s are execution no timed call shows, counted in the function's total.
    from jaxdbg.profile.assemble import execute_stats
    from jaxdbg.profile.messages import CallTiming

    clock, site = StepClock(), SyncSite()
    for index in range(3):
        t = index * 0.002
        clock.call(0, t, t + 0.001, put_s=0.0, compile_s=0.0, execute_s=0.001, waited=True, steady=index > 0)
    for index in range(3, 8):
        clock.unseen_functions.append(0)
        clock.unseen_starts.append(index * 0.002)
    clock.sync(site, 0.016, 0.316, 0.316)
    clock.sync(site, 0.316, 0.316, 0.316)  # a second read finds nothing left to wait for: nothing more
    assert clock.late == {0: pytest.approx(0.3)}
    timed = [CallTiming(i, 0.001, 0.001, 0.0, timed=True) for i in range(3)]
    assert execute_stats(timed, "script", 0, 8, clock.late[0]).total_s == pytest.approx(0.308)  # 8 x 1 ms + 0.3 s


def test_the_idle_time_after_a_sync_is_charged_to_it():
    # Each step: 2 ms on the device while the host waits to read the loss, then 8 ms of host work. The first call
    # is timed by the profile (it waits for it), so its sync finds nothing left to wait for in this run.
    clock, site = StepClock(), SyncSite()
    clock.call(0, 0.0, 0.002, put_s=0.0, compile_s=0.0, execute_s=0.002, waited=True, steady=True)
    clock.sync(site, 0.002, 0.002, 0.002)
    for index in range(1, 6):
        t = index * 0.010
        clock.call(0, t, t, put_s=0.0, compile_s=0.0, execute_s=0.0, waited=False, steady=True)
        clock.sync(site, t, t + 0.002, t + 0.002)
    figures = input_pipeline(clock.steps, {0: "step"}, [])
    assert site.count == 6 and site.wait_s == pytest.approx(0.012) and site.idle_s == pytest.approx(0.040)
    assert figures.device_idle_fraction == pytest.approx(0.8) and figures.sync_idle_s == pytest.approx(0.008)


def test_a_loss_read_every_step_is_told_to_read_less_often_before_prefetch():
    # Each step: a dispatch, 0.2 ms of Python while the device runs its 2 ms, float(loss) waiting for the rest, 0.1 ms
    # copying it, 0.1 ms of Python and the next dispatch: the device idles 0.2 ms a step only because the host
    # cannot queue the next step, though the host's own work (0.3 ms) is far below the device's.
    from jaxdbg._source import SourceLocation
    from jaxdbg.profile.model import HostSync

    clock, site = StepClock(), SyncSite()
    for index in range(8):
        t = index * 0.0022
        clock.call(0, t, t + 0.0001, put_s=0.0, compile_s=0.0, execute_s=0.002, waited=index == 0, steady=index > 0)
        clock.sync(site, t + 0.0003, t + 0.002, t + 0.0021)
    read = HostSync("float()", SourceLocation("train.py", 41, "<module>"), site.count, site.wait_s, site.idle_s, 32)
    figures = input_pipeline(clock.steps, {0: "step"}, [read], {0: 8})
    assert figures.verdict == "moderately input-bound" and figures.device_idle_s == pytest.approx(0.0002)
    assert figures.fixes[0].startswith("log every N steps: float() at train.py:41 waits for every step")


def test_a_loop_blocked_on_its_prefetch_thread_is_told_to_speed_up_the_producer_not_to_prefetch():
    # Each step: 1 ms on the device (the profile waits for it: not the plain run's), then 9 ms in which the main
    # thread is on its CPU 1 ms and blocked 8 ms (a queue.get on a prefetch thread slower than the step). Alone (no
    # thread of the program's), a blocked host is a read or a sleep, which a prefetch thread does hide.
    def figures(thread: str | None):
        clock, done = StepClock(), threading.Event()
        producer = threading.Thread(target=done.wait, name=thread, daemon=True)
        if thread:
            producer.start()
        for index in range(8):
            t = index * 0.010
            clock.call(0, t, t + 0.001, put_s=0.0, compile_s=0.0, execute_s=0.001, waited=True, steady=index > 0,
                       cpu=index * 0.001)
        done.set()
        return input_pipeline(clock.steps, {0: "step"}, [])

    fed = figures("prefetch")
    assert fed.verdict == "highly input-bound" and fed.host_blocked_s == pytest.approx(0.008)
    assert fed.fixes[0].startswith("speed up what feeds the loop") and "prefetch thread's queue" in fed.fixes[0]
    assert figures(None).fixes[0].startswith("prefetch")
    assert figures("jaxdbg-flush").fixes[0].startswith("prefetch")  # jaxdbg's own thread is not the program's


def test_a_step_in_which_another_function_compiled_is_not_steady():
    # `step` dispatched every 1 ms (the profile waits for its first call only), 2 ms on the device; between its
    # calls 2 and 3 `evaluate` compiles for 500 ms: that is no dispatch of `step`'s, and that step is left out.
    clock = StepClock()
    for index in range(6):
        t = index * 0.001 + (0.5 if index >= 3 else 0.0)
        waited = index == 0
        clock.call(0, t, t + (0.002 if waited else 0.0001), put_s=0.0, compile_s=0.0, execute_s=0.002,
                   waited=waited, steady=index > 0)
        if index == 2:
            clock.call(1, t + 0.0001, t + 0.5, put_s=0.0, compile_s=0.5, execute_s=0.0, waited=True, steady=False)
    figures = input_pipeline(clock.steps, {0: "step", 1: "evaluate"}, [])
    assert figures.function == "step" and figures.steps == 4 and figures.dispatch_s < 0.01
    # the host runs ahead: the loop goes at the device's pace, 2 ms a step
    assert figures.step_s == pytest.approx(0.002) and figures.verdict == "not input-bound"


def test_unseen_calls_caught_up_at_once_are_clocked_as_one_by_one():
    # catch_up's run of one function's steady calls (its fast path) against _step per call: the same sums, on a
    # random mix of one and two functions, timed and unseen calls, syncs, compiles and threads.
    import random

    from jaxdbg.profile.host_bound import STEP_FIELDS

    def clocked(one_by_one: bool) -> tuple:
        rng, clock, site, t = random.Random(7), StepClock(), SyncSite(), 0.0
        for index in range(400):
            function = 0 if index < 200 or rng.random() < 0.8 else 1
            t += rng.uniform(0.0001, 0.003)
            if index < 3 or rng.random() < 0.15:  # seen: timed (or a compile), its outputs waited for
                clock.call(function, t, t + 0.001, put_s=0.0, compile_s=0.0, execute_s=rng.uniform(0.0005, 0.002),
                           waited=True, steady=rng.random() > 0.05)
                t += 0.001
                clock.has_threads = index % 97 > 60  # as call() sets it: read after catching up
            elif one_by_one:
                clock._step(function, t - clock.shift, clock.dispatch.get(function, 0.0),
                            clock.execute.get(function, 0.0), 0.0, True, False)
            else:
                clock.unseen_functions.append(function)
                clock.unseen_starts.append(t)
            if rng.random() < 0.05:
                clock.sync(site, t, t + 0.0005, t + 0.0006)
        clock.catch_up()
        return clock.steps, clock.idle, clock.device, clock.device_free

    steps, idle, device, free = clocked(one_by_one=False)
    expected = clocked(one_by_one=True)
    assert set(steps) == {0, 1} and steps[0][0] > 100  # both functions had runs of steady steps
    assert steps == {f: pytest.approx(sums, nan_ok=True) for f, sums in expected[0].items()}  # (no CPU reading)
    assert (idle, device, free) == pytest.approx(expected[1:])
    assert len(steps[0]) == len(STEP_FIELDS)


# ---- the corpus's Flax MNIST loop fed from NumPy, under `jaxdbg profile` --------------------------------------


@pytest.fixture(scope="module")
def mnist_numpy_feed(tmp_path_factory):
    pytest.importorskip("flax")
    out = tmp_path_factory.mktemp("mnist-numpy-feed")
    program = os.path.join(CORPUS, "linen_mnist_numpy_feed", "train.py")
    run = profile(parse_target(program), ProfileOptions(trace_calls=0, calibrate=False), str(out))
    return program, run, out


def test_mnist_fed_from_numpy_is_input_bound_with_its_sync_and_transfer_lines(mnist_numpy_feed):
    program, run, _ = mnist_numpy_feed
    result = run.result
    assert run.exit_code == 0 and result.input_pipeline.function == "train_step"
    assert result.input_pipeline.verdict == "highly input-bound"
    syncs = {(s.kind, s.source.line): s for s in result.syncs if s.source}
    every_step = syncs["np.asarray", line_of("# the host waits for every step here", program)]
    assert every_step.count == 12 and every_step.bytes == 12 * 4
    copies = next(t for t in result.transfers if t.kind == "jnp.asarray")
    site = next(s for s in copies.sources if s.source.line == line_of("# copied to the device", program))
    assert site.count == 24 and site.bytes == 12 * (128 * 28 * 28 * 4 + 128 * 8)  # f32 images, int64 labels
    assert result.hints[0].startswith("train_step is highly input-bound") and "prefetch" in result.hints[0]
    # the augmentation runs on the main thread: on its CPU, not blocked
    assert result.input_pipeline.host_blocked_s < 0.5 * result.input_pipeline.host_s


def test_mnist_fed_from_numpy_text_and_csv(mnist_numpy_feed):
    import csv

    from rich.console import Console

    from jaxdbg.cli.profile import render
    from jaxdbg.report import Report

    program, run, out = mnist_numpy_feed
    console = Console(record=True, width=120)
    render(Report("profile", program, run.result, run.exit_code, run.artifacts), console)
    text = console.export_text()
    line = line_of("# the host waits for every step here", program)
    assert f"syncs (the host waited for the device): np.asarray at train.py:{line} 12x" in text
    assert "steps of train_step:" in text and text.count("highly input-bound") >= 2  # the steps line and the hint
    paths = write_profile_csv(run.result, str(out / "csv"))
    with open(paths["syncs"]) as handle:
        rows = list(csv.DictReader(handle))
    assert any(r["kind"] == "np.asarray" and r["line"] == str(line) and r["count"] == "12" for r in rows)
    with open(paths["transfers"]) as handle:
        assert any(r["kind"] == "jnp.asarray" for r in csv.DictReader(handle))


def test_filter_jits_own_wait_gets_its_own_fix_not_read_less_often():
    from jaxdbg._source import SourceLocation
    from jaxdbg.profile.host_bound import EQX_WAIT, _fixes
    from jaxdbg.profile.model import HostSync

    wait = HostSync(EQX_WAIT, SourceLocation("train.py", 21, "main"), 15, 0.03, 0.01, 0)
    fixes = _fixes(1.0, 0.5, 0.0, 0.0, 0.0, 0.5, [wait])
    assert fixes[0].startswith("let steps queue: eqx.filter_jit waits for every call it makes (15x at train.py:21)")
    assert "every N steps" not in fixes[0]  # the program has no read of its own to thin out
