"""How the suite is split over xdist's workers: every test is its own work unit, except the tests
of a real engine, which share one (a Slurm cluster, a Ray head: session fixtures that start once, on
one worker). tests/conftest.py installs the hook; tests/test_scopes.py runs it on a worker crash.
"""

from __future__ import annotations

from typing import Any

import pytest

# The tests that start a real engine, by path prefix -> the one xdist worker scope they share. The
# first test of a scope pays the engine's start, hence the longer timeout.
ENGINE_TESTS = {"tests/ray/": "ray", "tests/backends/test_slurm_": "slurm"}
ENGINE_TIMEOUT_S = 400


def _engine_of(nodeid: str) -> str | None:
    return next((scope for prefix, scope in ENGINE_TESTS.items() if nodeid.startswith(prefix)), None)


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """Under ``-n N`` (pyproject's addopts), every test is its own work unit except an engine's,
    which share one. xdist's own ``--dist loadgroup`` cannot do it under pytest 9.2: it renames
    node ids through ``item._nodeid``, which pytest no longer reads, and the groups are lost."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class EngineScopes(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _engine_of(nodeid) or nodeid

        def remove_node(self, node: Any) -> str | None:
            """A worker that died (a crash, pytest-timeout's exit, the OOM killer) gives back only
            the tests it had not run yet, less the one it died in, which is reported failed once.

            xdist's own puts back the dead worker's whole workload, finished units too. A unit with
            nothing left to run is sent to the replacement as an empty batch, which never reports
            back, so that worker is never given more work and the run waits forever (a CI that
            timed out after one worker's crash). It would also run the crashing test again on each
            replacement until the restarts ran out."""
            workload = self.assigned_work.pop(node)
            left = {scope: {nodeid: False for nodeid, done in unit.items() if not done}
                    for scope, unit in workload.items()}
            left = {scope: unit for scope, unit in left.items() if unit}
            if not left:
                return None
            crashed_scope, crashed_unit = next(iter(left.items()))
            crashed = next(iter(crashed_unit))  # a worker runs its batches in the order they were sent
            del crashed_unit[crashed]
            if not crashed_unit:
                del left[crashed_scope]
            self.workqueue.update(left)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashed

    return EngineScopes(config, log)
