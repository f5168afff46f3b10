"""A pytest plugin that says where the suite's CPU time goes: each test's own CPU time (its process,
setup and teardown included) and that of the subprocesses it waited for (``twins`` runs, torchrun,
fresh interpreters), summed by module at the end of the run, heaviest first, with the heaviest
tests. Wall time on a 2-core machine is about half the sum of both, so this is the figure to cut.

    python3 dev.py test -p parity_tests.cpu_time            # the whole suite, with the table
    python3 dev.py test -p parity_tests.cpu_time --cpu-top 40

Not loaded unless asked for (``-p``). Under pytest-xdist each worker measures its own tests and the
figures travel to the controller with the test's report (``user_properties``). A subprocess's time
counts once it has been waited for (``resource.RUSAGE_CHILDREN``); one left running is not
counted. Figures: docs/performance.md, "Where the suite's time goes".
"""
from __future__ import annotations

import resource
from collections import defaultdict

import pytest

_KEY = "cpu_time"  # (own seconds, children's seconds) in a report's user_properties


def pytest_addoption(parser):
    parser.addoption("--cpu-top", type=int, default=15, metavar="N",
                     help="cpu_time: how many of the heaviest tests to list (default 15)")


def _cpu() -> tuple[float, float]:
    own, children = (resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Around setup, call and teardown; the module's fixtures are charged to its first test."""
    item.stash[_start] = _cpu()
    yield


_start = pytest.StashKey[tuple[float, float]]()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if call.when == "teardown" and _start in item.stash:
        (own0, children0), (own1, children1) = item.stash[_start], _cpu()
        report.user_properties.append((_KEY, (own1 - own0, children1 - children0)))


class _Totals:
    def __init__(self):
        self.tests: list[tuple[float, float, str]] = []

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report):
        for key, value in report.user_properties:
            if key == _KEY and report.when == "teardown":
                self.tests.append((*value, report.nodeid))

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter, config):
        if not self.tests:
            return
        write = terminalreporter.write_line
        modules: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
        for own, children, nodeid in self.tests:
            entry = modules[nodeid.split("::")[0]]
            entry[0] += 1
            entry[1] += own
            entry[2] += children
        own_all = sum(t[0] for t in self.tests)
        children_all = sum(t[1] for t in self.tests)
        terminalreporter.section("CPU time (parity_tests.cpu_time)")
        write(f"{len(self.tests)} tests: {own_all + children_all:.1f} CPU-s, {own_all:.1f} in the test "
              f"processes and {children_all:.1f} in their subprocesses")
        write(f"{'module':<48} {'tests':>5} {'own s':>8} {'subproc s':>9} {'share':>6}")
        for name, (count, own, children) in sorted(modules.items(), key=lambda kv: -(kv[1][1] + kv[1][2])):
            share = (own + children) / max(own_all + children_all, 1e-9)
            write(f"{name:<48} {count:>5} {own:>8.1f} {children:>9.1f} {share:>6.1%}")
        write(f"the {config.getoption('cpu_top')} heaviest tests (own + subprocesses, s):")
        for own, children, nodeid in sorted(self.tests, key=lambda t: -(t[0] + t[1]))[:config.getoption("cpu_top")]:
            write(f"{own + children:8.1f}  {nodeid}")


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the controller (or a run without xdist) sums and prints
        config.pluginmanager.register(_Totals(), "cpu_time_totals")
