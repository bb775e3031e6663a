"""The TPU runtime's figures (profile --monitor) read through tpu-info from a local gRPC server that speaks
libtpu's runtime-metrics service with tpu-info's own generated protocol modules. This is the only TPU
runtime jaxdbg has been run against: no test here ran on a TPU (docs/metrics.md says so)."""

from __future__ import annotations

import json
import socket
import time
from concurrent import futures

import pytest

grpc = pytest.importorskip("grpc")
pytest.importorskip("tpu_info.metrics")
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402
from tpu_info.proto import tpu_metric_service_pb2 as pb  # noqa: E402
from tpu_info.proto import tpu_metric_service_pb2_grpc as pb_grpc  # noqa: E402

from jaxdbg.cli import main  # noqa: E402
from jaxdbg.profile import tpu_runtime  # noqa: E402
from jaxdbg.profile.monitor import Sampler, series  # noqa: E402

GIB = 2**30
DEVICES = 4


class StandIn(pb_grpc.RuntimeMetricServiceServicer):
    """libtpu's metrics service as tpu-info asks it: one gauge per device, keyed by the device id attribute.
    HBM in use grows by 1 MiB per ask, so a series of samples has something to show."""

    def __init__(self, bandwidth: bool = True):
        self.bandwidth = bandwidth
        self.asks = 0

    def GetRuntimeMetric(self, request, context):
        name = request.metric_name
        if name == "tpu.runtime.hbm.memory.usage.bytes":
            self.asks += 1
            values = [pb.Gauge(as_int=(i + 1) * GIB + self.asks * 2**20) for i in range(DEVICES)]
        elif name == "tpu.runtime.hbm.memory.total.bytes":
            values = [pb.Gauge(as_int=16 * GIB) for _ in range(DEVICES)]
        elif name == "tpu.runtime.tensorcore.dutycycle.percent":
            values = [pb.Gauge(as_double=50.0 + 10 * i) for i in range(DEVICES)]
        elif name == "tpu.runtime.hbm.utilization.percent" and self.bandwidth:
            values = [pb.Gauge(as_double=20.0 + i) for i in range(DEVICES)]
        else:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no metric {name}")
        # Answered out of order: the client sorts by device id.
        metrics = [pb.Metric(attribute=pb.Attribute(key="device-id", value=pb.AttrValue(int_attr=i)), gauge=values[i])
                   for i in reversed(range(DEVICES))]
        return pb.MetricResponse(metric=pb.TPUMetric(name=name, metrics=metrics))


@pytest.fixture
def stand_in():
    def start(bandwidth: bool = True):
        servicer = StandIn(bandwidth)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        pb_grpc.add_RuntimeMetricServiceServicer_to_server(servicer, server)
        port = server.add_secure_port("localhost:0", grpc.local_server_credentials(grpc.LocalConnectionType.LOCAL_TCP))
        server.start()
        servers.append(server)
        return f"localhost:{port}", servicer

    servers: list = []
    yield start
    for server in servers:
        server.stop(grace=None)


def test_read_parses_each_device(stand_in) -> None:
    address, _ = stand_in()
    reading = tpu_runtime.read(address)
    assert reading.duty_cycle_percent == (50.0, 60.0, 70.0, 80.0)
    assert reading.hbm_bytes_in_use == tuple((i + 1) * GIB + 2**20 for i in range(DEVICES))
    assert reading.hbm_total_bytes == (16 * GIB,) * DEVICES
    assert reading.hbm_bandwidth_percent == (20.0, 21.0, 22.0, 23.0)
    assert reading.tensorcore_util_percent is None  # no libtpu SDK here

    older, _ = stand_in(bandwidth=False)  # a libtpu without the bandwidth metric
    assert tpu_runtime.read(older).hbm_bandwidth_percent is None


def test_sampler_series_and_a_service_that_is_not_there(stand_in, monkeypatch) -> None:
    address, servicer = stand_in()
    monkeypatch.setenv(tpu_runtime.ADDRESS_VARIABLE, address)
    batches: list = []
    with Sampler(send=lambda message: batches.append(message.rows), interval_s=0.02, tpu_interval_s=0.0):
        deadline = time.monotonic() + 30  # a few samples, however loaded the machine is
        while servicer.asks < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
    monitor = series([row for batch in batches for row in batch], interval_s=0.02)
    assert monitor is not None
    tpu = monitor.summary["tpu"]
    assert tpu["samples"] == len(monitor.t_s) == servicer.asks >= 2
    assert tpu["peak_hbm_bytes"] == [(i + 1) * GIB + servicer.asks * 2**20 for i in range(DEVICES)]
    assert tpu["mean_duty_cycle_percent"] == [50.0, 60.0, 70.0, 80.0]
    assert [row[0] for row in monitor.tpu_hbm_bytes_in_use] == [GIB + k * 2**20 for k in range(1, servicer.asks + 1)]

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    monkeypatch.setenv(tpu_runtime.ADDRESS_VARIABLE, f"localhost:{closed}")
    batches.clear()
    with Sampler(send=lambda message: batches.append(message.rows), interval_s=0.02):
        time.sleep(0.06)
    quiet = series([row for batch in batches for row in batch], interval_s=0.02)
    assert quiet is not None and "tpu" not in quiet.summary and quiet.tpu_hbm_bytes_in_use == ()


def test_profile_monitor_reports_and_exports_the_tpu_figures(stand_in, monkeypatch, tmp_path, capsys) -> None:
    address, servicer = stand_in()
    monkeypatch.setenv(tpu_runtime.ADDRESS_VARIABLE, address)  # the profiled child inherits it
    (tmp_path / "t.py").write_text("import jax, jax.numpy as jnp\nf = jax.jit(lambda x: x * 2)\n"
                                   "for _ in range(3):\n    f(jnp.ones(8)).block_until_ready()\n")
    code = main(["profile", str(tmp_path / "t.py"), "--monitor", "--trace-calls", "0", "--out", str(tmp_path / "o"),
                 "--json", str(tmp_path / "r.json"), "--metrics", str(tmp_path / "m.prom")])
    assert code == 0, capsys.readouterr().err
    assert "TPU runtime: duty cycle 50% 60% 70% 80%" in capsys.readouterr().out
    monitor = json.loads((tmp_path / "r.json").read_text())["result"]["monitor"]
    asked = [row for row in monitor["tpu_duty_cycle_percent"] if row is not None]  # at most one ask a second
    assert monitor["summary"]["tpu"]["samples"] == servicer.asks == len(asked) >= 1
    assert len(monitor["tpu_duty_cycle_percent"]) == len(monitor["t_s"])
    samples = {(s.name, s.labels["device"]): s.value
               for family in text_string_to_metric_families((tmp_path / "m.prom").read_text())
               for s in family.samples if s.name.startswith("jaxdbg_tpu_")}
    assert samples["jaxdbg_tpu_hbm_total_bytes", "3"] == 16 * GIB
    assert samples["jaxdbg_tpu_hbm_peak_bytes", "0"] == monitor["summary"]["tpu"]["peak_hbm_bytes"][0] > GIB
    assert samples["jaxdbg_tpu_hbm_bandwidth_peak_percent", "1"] == 21.0
