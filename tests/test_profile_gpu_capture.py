"""profile's GPU path on a capture recorded on an NVIDIA H200 (jax 0.11.2, xprof 2.24.2), read here on CPU.

``recipes/run_heavy/train.py::power_iterations --args "bf16[4096,4096]" --runs 10`` was profiled there by
``scripts/device_check.sh profile_function`` twice: with XLA:GPU command buffers off (jaxdbg's default) and
kept (``--command-buffers``). The xplanes and the optimised HLO are in tests/data/h200_power_iterations.
"""

import gzip
import os
import shutil

import pytest

from jaxdbg.profile.hlo import parse_hlo
from jaxdbg.profile.ops import op_table, xprof_hlo_stats

DATA = os.path.join(os.path.dirname(__file__), "data", "h200_power_iterations")


def _xplane(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.xplane.pb"
    with gzip.open(os.path.join(DATA, f"{name}.xplane.pb.gz")) as packed, open(path, "wb") as out:
        shutil.copyfileobj(packed, out)
    return str(path)


@pytest.fixture(scope="module")
def module():
    with open(os.path.join(DATA, "optimized.hlo.txt")) as handle:
        return parse_hlo(handle.read())


def test_with_command_buffers_off_the_cublas_matmul_tops_the_table_at_its_line(tmp_path, module):
    ops = xprof_hlo_stats(_xplane(tmp_path, "command_buffers_off"))["jit(power_iterations)"]
    rows = op_table(ops, module, top=3)
    top = rows[0]
    # 10 captured calls x 40 iterations = 400 runs of the loop body; cuBLAS launches two kernels per matmul.
    assert (top.name, top.category, top.count) == ("custom-call.1", "matmul", 800)
    assert top.source.line == 12 and top.source.file.endswith("run_heavy/train.py")
    assert top.fraction > 0.8 and ops["input_reduce_fusion"].count == 400
    # An op XLA left without a framework name is still the function's, by its program id.
    assert "loop_convert_fusion" in ops and "" not in xprof_hlo_stats(_xplane(tmp_path, "command_buffers_off"))


def test_with_command_buffers_kept_the_loop_body_is_missing(tmp_path):
    """The reason jaxdbg turns them off: kernels run inside a command buffer reach xprof with no HLO op."""
    ops = xprof_hlo_stats(_xplane(tmp_path, "command_buffers_kept"))["jit(power_iterations)"]
    assert "custom-call.1" not in ops and all(total.count == 10 for total in ops.values())
