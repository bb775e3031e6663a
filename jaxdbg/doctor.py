"""``jaxdbg doctor``: what JAX sees on this machine, and the known pitfalls in the environment.

Example:
    >>> result = diagnose(profile_dir=None)      # None: no test profiler capture (no child process, no files)
    >>> result.ok, result.profiler
    (True, {'ok': None, 'detail': 'skipped'})
    >>> checks = pitfalls({}, "cpu", host={}, profiler={"ok": False, "detail": "no capture"},
    ...                   cache={"enabled": False, "dir": None}, hints=[], versions={"jax": "0.10.2"})
    >>> [(check.name, check.status) for check in checks]      # a failed capture is the one 'fail' (exit 1)
    [('jax', 'ok'), ('backend', 'info'), ('profiler', 'fail'), ('compilation_cache', 'info')]
"""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from jaxdbg._compat import device_memory_stats
from jaxdbg._errors import UsageError
from jaxdbg.protocol import Message, Request, handles
from jaxdbg.runner import run_contained


@dataclass(frozen=True)
class CaptureFiles(Message):
    """The files a profiler capture wrote (sent by :func:`profiler_job`)."""

    files: tuple[str, ...]

LOW_HOST_MEMORY_BYTES = 2 * 1024**3

# What the settings people most often leave on actually do.
KNOWN_SETTINGS = {
    "JAX_PLATFORMS": "restricts which backends jax may use (e.g. 'cpu', 'cuda', 'tpu')",
    "JAX_PLATFORM_NAME": "old spelling of JAX_PLATFORMS",
    "JAX_ENABLE_X64": "64-bit floats and ints by default: twice the memory, slow on GPU/TPU",
    "JAX_DEBUG_NANS": "checks every output for NaN on the host and re-runs op by op: very slow",
    "JAX_DEBUG_INFS": "checks every output for Inf on the host and re-runs op by op: very slow",
    "JAX_DISABLE_JIT": "runs everything op by op: very slow, and numerics differ from compiled code",
    "JAX_LOG_COMPILES": "logs every compilation (useful to spot recompiles)",
    "JAX_EXPLAIN_CACHE_MISSES": "logs why a function was traced again",
    "JAX_TRACEBACK_FILTERING": "how much of jax's own stack tracebacks show",
    "JAX_COMPILATION_CACHE_DIR": "persistent compilation cache folder: later runs skip backend compiles",
    "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "only compiles slower than this are cached",
    "JAX_DEFAULT_MATMUL_PRECISION": "precision of matmuls and convolutions (bf16 passes vs full f32)",
    "XLA_PYTHON_CLIENT_PREALLOCATE": "whether the GPU client grabs most device memory at start",
    "XLA_PYTHON_CLIENT_MEM_FRACTION": "share of GPU memory preallocated",
    "XLA_PYTHON_CLIENT_ALLOCATOR": "GPU allocator ('platform' frees eagerly but is slow)",
}
KNOWN_XLA_FLAGS = {
    "--xla_force_host_platform_device_count": "number of CPU devices jax creates (for multi-device tests)",
    "--xla_dump_to": "dumps HLO of every compilation to a folder: slows compilation",
    "--xla_dump_hlo_as_text": "HLO dumps as text",
    "--xla_gpu_autotune_level": "GPU autotuning effort (0 turns it off: faster compiles, slower kernels)",
    "--xla_gpu_enable_latency_hiding_scheduler": "overlaps communication with compute on GPU",
    "--xla_cpu_multi_thread_eigen": "multi-threaded Eigen kernels on CPU",
    "--xla_backend_optimization_level": "backend optimisation effort",
}


CheckStatus = Literal["ok", "info", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    """One finding: status is 'ok', 'info', 'warn' or 'fail' (only 'fail' makes doctor exit 1)."""

    name: str
    status: CheckStatus
    detail: str


@dataclass(frozen=True)
class Setting:
    name: str
    value: str
    meaning: str


@dataclass(frozen=True)
class DoctorResult:
    versions: dict[str, str]
    backend: str
    devices: list[dict[str, Any]]
    settings: list[Setting]
    host: dict[str, Any]
    profiler: dict[str, Any]
    compilation_cache: dict[str, Any]
    checks: list[Check] = field(default_factory=list)
    distributed: dict[str, Any] | None = None  # the jax.distributed job this process joined (None: not in one)

    @property
    def ok(self) -> bool:
        return not any(c.status == "fail" for c in self.checks)

    def essential_line(self) -> str | None:
        failed = [c for c in self.checks if c.status == "fail"]
        return "failed: " + "; ".join(f"{c.name}: {c.detail}" for c in failed) if failed else None


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in ("jax", "jaxlib", "numpy", "xprof", "typer", "rich", "libtpu"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_report() -> tuple[str, list[dict[str, Any]]]:
    import jax

    devices = []
    for device in jax.devices():
        stats = device_memory_stats(device)
        memory = None
        if stats:
            memory = {k: int(stats[k]) for k in ("bytes_in_use", "peak_bytes_in_use", "bytes_limit") if k in stats}
        devices.append({
            "id": device.id, "platform": device.platform, "kind": getattr(device, "device_kind", ""),
            "process_index": device.process_index, "memory": memory,
        })
    return jax.default_backend(), devices


def settings_in_effect() -> list[Setting]:
    """JAX_* and XLA_* environment variables, with XLA_FLAGS split into its flags, each explained."""
    found = []
    for name in sorted(os.environ):
        if name == "XLA_FLAGS":
            for flag in os.environ[name].split():
                key, _, value = flag.partition("=")
                found.append(Setting(key, value or "true", KNOWN_XLA_FLAGS.get(key, "XLA flag (see XLA's docs)")))
        elif name.startswith(("JAX_", "XLA_")):
            found.append(Setting(name, os.environ[name], KNOWN_SETTINGS.get(name, "jax/XLA setting")))
    return found


def host_report() -> dict[str, Any]:
    meminfo = {}
    if os.path.exists("/proc/meminfo"):
        for line in Path("/proc/meminfo").read_text().splitlines():
            key, _, rest = line.partition(":")
            parts = rest.split()
            if parts and parts[0].isdigit():
                meminfo[key] = int(parts[0]) * 1024
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cores": cores,
        "memory_total_bytes": meminfo.get("MemTotal"),
        "memory_available_bytes": meminfo.get("MemAvailable"),
    }


def accelerator_hints() -> list[str]:
    """Signs that this machine has an accelerator jax could use."""
    hints = []
    if shutil.which("nvidia-smi") or glob.glob("/dev/nvidia[0-9]*"):
        hints.append("an NVIDIA GPU driver")
    if glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"):
        hints.append("TPU devices")
    for plugin in ("jax-cuda12-plugin", "jax-cuda13-plugin", "libtpu"):
        try:
            importlib.metadata.version(plugin)
            hints.append(f"the {plugin} package")
        except importlib.metadata.PackageNotFoundError:
            pass
    return hints


@dataclass(frozen=True)
class ProfilerCapture(Request):
    """Ask :func:`profiler_job` for a real jax.profiler trace in ``trace_dir``."""

    trace_dir: str


@handles(ProfilerCapture)
def profiler_job(request: ProfilerCapture, channel: Any) -> None:
    """Contained job: capture a real jax.profiler trace of a small jitted matmul into ``request.trace_dir``."""
    trace_dir = request.trace_dir
    import jax
    import jax.numpy as jnp

    x = jnp.ones((256, 256))
    step = jax.jit(lambda a: jnp.tanh(a @ a).sum())
    step(x).block_until_ready()
    with jax.profiler.trace(trace_dir):
        for _ in range(3):
            step(x).block_until_ready()
    channel.send(CaptureFiles(tuple(sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "*"))))))


def profiler_check(trace_dir: str | None, timeout: float = 120) -> dict[str, Any]:
    if trace_dir is None:
        return {"ok": None, "detail": "skipped"}
    outcome = run_contained(ProfilerCapture(trace_dir), timeout=timeout)
    sent = outcome.last(CaptureFiles)
    files = list(sent.files) if sent else []
    ok = outcome.ok and any(f.endswith(".xplane.pb") for f in files)
    return {"ok": ok, "trace_dir": trace_dir, "files": files, "detail": "captured" if ok else outcome.describe()}


def compilation_cache_report() -> dict[str, Any]:
    import jax

    directory = getattr(jax.config, "jax_compilation_cache_dir", None)  # a dynamic option: not in jax's types
    enabled = bool(directory) and bool(getattr(jax.config, "jax_enable_compilation_cache", True))
    return {"enabled": enabled, "dir": directory}


def diagnose(profile_dir: str | None, distributed: bool | None = None, timeout: float = 60) -> DoctorResult:
    """Gather the environment report; ``profile_dir`` is where the test capture goes (None skips it).

    ``distributed``: join the ``jax.distributed`` job first (None: when a cluster launcher's environment or
    ``JAX_COORDINATOR_ADDRESS`` says this process is one of a job's), before anything starts the backend."""
    import jax

    versions = package_versions()
    job, job_checks = distributed_report(versions, distributed, timeout)
    backend, devices = device_report()
    settings = settings_in_effect()
    host = host_report()
    profiler = profiler_check(profile_dir)
    cache = compilation_cache_report()
    checks = pitfalls(jax.config, backend, host, profiler, cache, accelerator_hints(), versions) + job_checks
    return DoctorResult(versions, backend, devices, settings, host, profiler, cache, checks, job)


SHARED_VERSIONS = ("python", "jax", "jaxlib", "libtpu")  # what every process of a job must agree on


def distributed_report(versions: dict[str, str], join: bool | None, timeout: float) -> tuple[dict | None, list[Check]]:
    """Join the job (when asked, or when the environment says this is one of a job's processes), then its
    setup: coordinator, processes, devices per process, CPU collectives, and, on process 0, whether every
    process runs the same python/jax/jaxlib/libtpu (gathered through the job's coordination service).

    The joining runs in a contained child: when a process of the job never comes, JAX's runtime aborts the
    process that waited for it (SIGABRT after ``initialization_timeout``), which must not take the report with
    it. A job jax cannot even describe (``--distributed`` with no launcher and no ``JAX_COORDINATOR_ADDRESS``)
    is bad usage (exit 2); one that is described but cannot be joined is a failed check (exit 1)."""
    from jaxdbg import _compat

    cluster = _compat.detected_cluster()
    if join is False or (join is None and cluster is None and not os.environ.get("JAX_COORDINATOR_ADDRESS")):
        return None, []
    outcome = run_contained(JoinJob(versions, timeout), timeout=2 * timeout + JOIN_MARGIN_S)
    sent = outcome.last(JobSetup)
    if sent is not None and sent.info.get("joined"):
        return sent.info, list(sent.checks)
    if outcome.error is not None:  # jaxdbg's own (the processes run different jaxdbg commands): as itself
        raise outcome.error
    where = cluster or os.environ.get("JAX_COORDINATOR_ADDRESS") or "no launcher found"
    if sent is not None and sent.info.get("undescribed") and join:
        raise UsageError(f"--distributed: JAX cannot tell which job to join ({sent.info['error']}); run doctor "
                         "under the job's launcher (srun, mpirun, ...) or set JAX_COORDINATOR_ADDRESS, "
                         "JAX_NUM_PROCESSES and JAX_PROCESS_ID")
    error = sent.info["error"] if sent is not None else join_failure(outcome, timeout)
    detail = f"could not join the jax.distributed job ({where}): {error}"
    return {"cluster": cluster, "joined": False, "error": error}, [Check("distributed", "fail", detail)]


JOIN_MARGIN_S = 30.0  # a child's start and jax's import, beyond the join's and the gather's own waits


def join_failure(outcome: Any, timeout: float) -> str:
    """Why a contained join ended without a report, in words (JAX's runtime aborts the process it fails in).

    Example:
        >>> from jaxdbg.runner import outcome_of
        >>> ran = outcome_of(-6, False, [], "", "F client.h:80] ... DEADLINE_EXCEEDED ... RegisterTask", 9.0)
        >>> join_failure(ran, 8)[:52]
        'not every process of the job reached the coordinator'
    """
    if "RegisterTask" in outcome.stderr and "DEADLINE_EXCEEDED" in outcome.stderr:
        return (f"not every process of the job reached the coordinator within {timeout:g} s (--timeout): one did "
                "not start, started late, or cannot reach the coordinator's address; start every process, "
                "check the address and firewall, or raise --timeout")
    lines = [line for line in outcome.stderr.splitlines() if line.strip() and not line.startswith("    @")]
    said = next((line for line in reversed(lines) if "Status:" in line or "Error" in line), None)
    return f"the joining process {outcome.describe()}" + (f" ({said.strip()[:300]})" if said else "")


@dataclass(frozen=True)
class JoinJob(Request):
    """Ask :func:`join_job` to join the job this process's environment describes and report its setup."""

    versions: dict[str, str]
    timeout: float


@dataclass(frozen=True)
class JobSetup(Message):
    """The job :func:`join_job` joined (``info`` as in the report's ``distributed``) and its checks."""

    info: dict[str, Any]
    checks: tuple[Check, ...]


@handles(JoinJob)
def join_job(request: JoinJob, channel: Any) -> None:
    """Contained job: join the ``jax.distributed`` job, then gather its setup (see :func:`distributed_report`)."""
    import jax

    from jaxdbg import _compat, multihost

    cluster, timeout = _compat.detected_cluster(), request.timeout
    try:
        jax.distributed.initialize(initialization_timeout=max(int(timeout), 1))
    except ValueError as err:  # jax's own words: no coordinator address, no process count, ...
        channel.send(JobSetup({"cluster": cluster, "joined": False, "error": str(err), "undescribed": True}, ()))
        return
    except Exception as err:  # noqa: BLE001 - a job this process cannot join is the finding
        channel.send(JobSetup({"cluster": cluster, "joined": False, "error": str(err)}, ()))
        return
    info: dict[str, Any] = {
        "cluster": cluster, "joined": True, "coordinator": _compat.coordinator_address(),
        "process_index": jax.process_index(), "process_count": jax.process_count(),
        "local_devices": jax.local_device_count(), "devices": jax.device_count(),
        "cpu_collectives": str(getattr(jax.config, "jax_cpu_collectives_implementation", None)),  # a dynamic option
    }
    checks = [Check("distributed", "ok", f"process {info['process_index']} of {info['process_count']}, "
                    f"{info['local_devices']} of {info['devices']} devices here, coordinator {info['coordinator']}")]
    if jax.default_backend() == "cpu" and info["process_count"] > 1 and info["cpu_collectives"] in ("none", ""):
        checks.append(Check("cpu_collectives", "fail", "CPU collectives are off: a computation across processes "
                            "cannot run; set JAX_CPU_COLLECTIVES_IMPLEMENTATION=gloo"))
    multihost.agree_on_command(min(timeout, multihost.AGREE_WAIT_S))
    mine = {name: request.versions.get(name, "not installed") for name in SHARED_VERSIONS}
    shared = multihost.Topic("doctor", "versions", dict)
    multihost.publish(shared, mine)
    if info["process_index"] == 0:
        got = multihost.gather(shared, timeout)
        info["versions_by_process"] = {str(i): got.get(i) for i in range(info["process_count"])}
        checks += _version_checks(got, info["process_count"])
    channel.send(JobSetup(info, tuple(checks)))


def _version_checks(got: dict[int, dict], count: int) -> list[Check]:
    missing = [i for i in range(count) if i not in got]
    checks = [Check("job_versions", "fail", f"process {i} did not report its versions (it died, hangs, or runs no "
                    "jaxdbg doctor)") for i in missing]
    reference = got.get(0, {})
    for index, theirs in sorted(got.items()):
        differ = [f"{name} {theirs.get(name)} (process 0: {reference.get(name)})" for name in SHARED_VERSIONS
                  if theirs.get(name) != reference.get(name)]
        if differ:
            checks.append(Check("job_versions", "fail", f"process {index} runs " + ", ".join(differ)))
    if not missing and len(checks) == 0:
        checks.append(Check("job_versions", "ok", f"all {count} processes run the same python, jax, jaxlib and libtpu"))
    return checks


def pitfalls(config: Any, backend: str, host: dict, profiler: dict, cache: dict, hints: list[str],
             versions: dict[str, str]) -> list[Check]:
    """The checks doctor reports, from what was gathered (kept apart so each rule is testable)."""
    checks = [Check("jax", "ok", f"jax {versions['jax']} on {backend}")]
    for flag, what in (("jax_debug_nans", "NaN"), ("jax_debug_infs", "Inf")):
        if getattr(config, flag, False):
            checks.append(Check(flag, "warn", f"{flag} is on: every output is copied to the host and checked for "
                                f"{what}, which slows everything; turn it off outside debugging "
                                "(or use jaxdbg nan-hunt)"))
    if getattr(config, "jax_disable_jit", False):
        checks.append(Check("jax_disable_jit", "warn", "jit is disabled: everything runs op by op, slowly, and "
                            "numerics differ from compiled code; unset JAX_DISABLE_JIT"))
    if getattr(config, "jax_enable_x64", False):
        checks.append(Check("jax_enable_x64", "warn", "x64 is on: default dtypes are 64-bit, doubling memory and "
                            "slowing GPU/TPU work; turn it off unless you need float64"))
    if backend == "cpu" and hints:
        checks.append(Check("backend", "warn", f"jax runs on the CPU although this machine has {', '.join(hints)}; "
                            "install the matching jax plugin (e.g. pip install 'jax[cuda12]') or check JAX_PLATFORMS"))
    elif backend == "cpu":
        checks.append(Check("backend", "info", "CPU only: no GPU or TPU was found on this machine"))
    available = host.get("memory_available_bytes")
    if available is not None and available < LOW_HOST_MEMORY_BYTES:
        checks.append(Check("host_memory", "warn", f"only {available / 1024**3:.1f} GiB of host memory is free; "
                            "large compilations or transfers may fail"))
    if "--xla_dump_to" in os.environ.get("XLA_FLAGS", ""):
        checks.append(Check("xla_dump_to", "warn", "XLA_FLAGS dumps every compilation (--xla_dump_to): slower "
                            "compiles and much disk; remove it when done"))
    if profiler.get("ok") is False:
        checks.append(Check("profiler", "fail", f"a jax.profiler capture failed: {profiler.get('detail')}; "
                            "check that xprof/tensorboard-plugin-profile is installed and the folder is writable"))
    elif profiler.get("ok"):
        checks.append(Check("profiler", "ok", f"jax.profiler capture works ({profiler['trace_dir']})"))
    checks.append(Check("compilation_cache", "ok" if cache["enabled"] else "info",
                        f"persistent compilation cache at {cache['dir']}" if cache["enabled"] else
                        "persistent compilation cache is off; set JAX_COMPILATION_CACHE_DIR to reuse compiles "
                        "across runs"))
    if versions.get("xprof") == "not installed":
        checks.append(Check("xprof", "warn", "xprof is not installed: no offline trace conversion or --serve"))
    return checks
