"""The test run's two lanes (pytest-xdist, ``-n 2 --dist loadgroup``: the README's test command).

Every test that starts a process or makes a multiprocessing semaphore, marked ``slow`` or
``processes`` (also a test that times its own CPU share: a neighbour would skew it), runs in one xdist group, ``processes``: on one worker, one at a time, as the whole
suite ran before. The in-process tests run on the other worker beside them, on the CPU the
process tests leave idle (their drivers, ranks and servers keep 2 cores busy about 60% of the
time). Two jobs side by side would each see the other's processes and /dev/shm files in their
checks of what a job leaves behind; an in-process test leaves nothing of the kind.

:func:`install` enforces the rule: a test outside the lane that starts a process (subprocess,
``fork``, multiprocessing's spawn and forkserver) or makes a semaphore fails, naming the marker.
What a shared fixture (session or module scope) starts serves many tests and is not counted, nor
the reaper of the test process's own job (flows/run/lifeline.py), which the first test to drive a
flow or hold a lease starts once for the whole process.
"""

from __future__ import annotations

import _posixsubprocess
import multiprocessing.synchronize
import os
import subprocess

import pytest

GROUP = "processes"
MARKERS = ("slow", "processes")

_seen: list[str] = []  # what the running test started, while one runs
_watching = [False]


def _note(what: str) -> None:
    if _watching[0]:
        _seen.append(what)


def in_lane(item: pytest.Item) -> bool:
    return any(item.get_closest_marker(m) for m in MARKERS)


def group(items: list[pytest.Item]) -> None:
    """Put every test of the lane in its xdist group (a no-op without xdist)."""
    for item in items:
        if in_lane(item):
            item.add_marker(pytest.mark.xdist_group(GROUP))


def check_grouped(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On an xdist worker of ``--dist loadgroup``, after xdist has read the groups: every test of
    the lane carries the group in its node id, or the run stops. pytest-xdist marks the group by
    renaming the node id, which pytest 9.2 no longer reads: the lane's tests would run two at once."""
    if not config.getoption("loadgroup", default=False):
        return
    lost = [i.nodeid for i in items if in_lane(i) and not i.nodeid.endswith(f"@{GROUP}")]
    if lost:
        raise pytest.UsageError(f"pytest-xdist left {lost[0]} out of its group: pytest and pytest-xdist do not fit")


def share_cores(lane: bool) -> None:
    """Under xdist, an in-process test's torch computes on one thread, the lane's tests on torch's
    default: the lane's processes run beside the in-process tests, and OpenMP threads spinning for
    more cores than are free slowed them ~11-fold (the flores task's test: 24.1 s on 2 threads,
    2.2 s on 1, beside a CI run). Only this process's threads: no child's environment changes."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    import torch

    default = _threads.setdefault("default", torch.get_num_threads())
    torch.set_num_threads(default if lane else 1)


_threads: dict[str, int] = {}


def install() -> None:
    """Note every process and semaphore started from here on (once per test process)."""
    execute_child = subprocess.Popen._execute_child

    def _execute_child(self, *args, **kwargs):
        _note("a subprocess")
        return execute_child(self, *args, **kwargs)

    fork_exec = _posixsubprocess.fork_exec

    def _fork_exec(*args, **kwargs):  # multiprocessing's spawn and forkserver start here
        _note("a process")
        return fork_exec(*args, **kwargs)

    semlock_init = multiprocessing.synchronize.SemLock.__init__

    def _semlock_init(self, *args, **kwargs):
        _note("a multiprocessing semaphore (/dev/shm)")
        return semlock_init(self, *args, **kwargs)

    from flows.run import lifeline

    become_driver = lifeline.become_driver

    def _become_driver():  # the reaper of this test process's own job: one per process, as a session's
        was, _watching[0] = _watching[0], False
        try:
            return become_driver()
        finally:
            _watching[0] = was

    lifeline.become_driver = _become_driver
    subprocess.Popen._execute_child = _execute_child
    _posixsubprocess.fork_exec = _fork_exec
    multiprocessing.synchronize.SemLock.__init__ = _semlock_init
    os.register_at_fork(before=lambda: _note("a forked process"))


class Guard:
    """The pytest plugin that fails an in-process test that started what only the lane may, and
    stops a run whose lane xdist did not group."""

    @pytest.hookimpl(trylast=True)  # after pytest-xdist has read the groups
    def pytest_collection_modifyitems(self, config, items):
        check_grouped(config, items)

    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(self, fixturedef, request):
        shared = fixturedef.scope != "function"
        was = _watching[0]
        if shared:
            _watching[0] = False
        try:
            return (yield)
        finally:
            _watching[0] = was

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        _seen.clear()
        _watching[0] = not in_lane(item)
        share_cores(in_lane(item))
        try:
            return (yield)
        finally:
            _watching[0] = False

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item):
        out = yield
        if _seen:
            pytest.fail(
                f"{item.nodeid} started {_seen[0]}: mark it @pytest.mark.processes, so that it runs in the "
                "lane of tests that start processes (tests/support/lanes.py)",
                pytrace=False,
            )
        return out
