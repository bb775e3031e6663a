"""Test setup: several CPU devices for jax (set before jax is imported anywhere in the test process)."""

import os
import re

_flags = re.sub(r"--xla_force_host_platform_device_count=\d+", "", os.environ.get("XLA_FLAGS", ""))
os.environ["XLA_FLAGS"] = f"{_flags} --xla_force_host_platform_device_count=4".strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import pytest  # noqa: E402

RECIPES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "recipes")


@pytest.fixture
def recipes_dir() -> str:
    """Absolute path of the bundled recipes folder."""
    return RECIPES


def line_of(path: str, marker: str) -> int:
    """The number of the first line of `path` that contains `marker`."""
    with open(path) as handle:
        return next(i for i, text in enumerate(handle, start=1) if marker in text)
