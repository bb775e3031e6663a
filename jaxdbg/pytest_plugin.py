"""The pytest plugin (entry point ``jaxdbg``): ``@pytest.mark.jaxdbg(nans=True, max_compiles=None)`` runs a test
under :func:`jaxdbg.watch`.

A marked test fails with one line, the NaN/Inf origin or the recompile cause; the full report lands in the
test's tmp dir (``<tmp_path>/jaxdbg/report.json``). The plugin is loaded in every pytest run once jaxdbg is
installed, so it imports nothing (no jax) and does nothing for tests without the marker.

Example (a test file)::

    import jax, jax.numpy as jnp, pytest

    @pytest.mark.jaxdbg(max_compiles=1)
    def test_step_stays_finite():
        step = jax.jit(lambda x: jnp.log(x))
        assert step(jnp.array(2.0)) > 0
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

MARKER = "jaxdbg"
_OUT = pytest.StashKey[str]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", f"{MARKER}(nans=True, max_compiles=None): run the test under jaxdbg.watch; a NaN/Inf output "
        "or a function compiled more than max_compiles times fails it (report in its tmp dir)")


@pytest.fixture(autouse=True)
def _jaxdbg_out(request: pytest.FixtureRequest) -> None:
    """The marked test's report folder, in its own tmp dir (unmarked tests: nothing happens)."""
    if request.node.get_closest_marker(MARKER) is not None:
        request.node.stash[_OUT] = str(request.getfixturevalue("tmp_path") / "jaxdbg")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    marker = item.get_closest_marker(MARKER)
    if marker is None:
        return (yield)
    from jaxdbg._errors import UsageError
    from jaxdbg.live import WatchError, watch

    options = _options(marker)
    try:
        guard = watch(out=item.stash.get(_OUT, "jaxdbg-out/watch"), **options)
    except UsageError as err:
        pytest.fail(f"@pytest.mark.{MARKER}: {err}", pytrace=False)
    try:
        with guard:
            return (yield)
    except WatchError as err:
        line = err.message
    pytest.fail(line, pytrace=False)  # outside the except: no "during handling of the above exception"


def _options(marker: pytest.Mark) -> dict[str, Any]:
    """The marker's keyword options (``nans``, ``max_compiles``); positional ones are refused."""
    if marker.args:
        pytest.fail(f"@pytest.mark.{MARKER} takes keywords only: nans=..., max_compiles=...", pytrace=False)
    unknown = set(marker.kwargs) - {"nans", "max_compiles"}
    if unknown:
        pytest.fail(f"@pytest.mark.{MARKER}: unknown option(s) {', '.join(sorted(unknown))}; use nans, max_compiles",
                    pytrace=False)
    return {"nans": marker.kwargs.get("nans", True), "max_compiles": marker.kwargs.get("max_compiles")}
