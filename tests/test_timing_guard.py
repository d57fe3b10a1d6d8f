"""The slow-test guard (tests/timing_guard.py): sums a test's phases, warns past 120 s and
fails the run past 180 s, except under CI, where it says so and the run passes."""

import types

import pytest
import timing_guard
from timing_guard import FAIL_SECONDS, WARN_SECONDS, TimingGuard


def report(nodeid, duration):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration)


class Terminal:
    def __init__(self):
        self.lines = []

    def section(self, title):
        self.lines.append(f"== {title}")

    def write_line(self, line, **markup):
        self.lines.append(line)


def guard_after(durations):
    guard = TimingGuard()
    for nodeid, duration in durations:
        guard.pytest_runtest_logreport(report(nodeid, duration))
    return guard


def test_a_tests_setup_call_and_teardown_are_summed_and_the_slowest_come_first():
    guard = guard_after([("a", 1.0), ("a", 2.5), ("a", 0.5), ("b", 3.0)] + [(f"c{i}", 0.1) for i in range(12)])
    terminal = Terminal()
    guard.pytest_terminal_summary(terminal)
    assert guard.seconds["a"] == 4.0
    assert terminal.lines[1:3] == ["     4.0 s  a", "     3.0 s  b"]
    assert len(terminal.lines) == 1 + 10


def test_past_the_warning_a_line_says_so_and_the_run_still_passes():
    guard = guard_after([("slow", WARN_SECONDS + 1)])
    terminal, session = Terminal(), types.SimpleNamespace(exitstatus=0)
    guard.pytest_terminal_summary(terminal)
    guard.pytest_sessionfinish(session)
    assert terminal.lines[-1].startswith("WARNING: slow took 121 s, over 120 s")
    assert session.exitstatus == 0


@pytest.mark.parametrize(
    ("under_ci", "line", "status"),
    [
        (False, "FAILED (slow-test guard): slower took 185 s, over 180 s", 1),
        (True, "OVER THE LIMIT (not failed under CI): slower took 185 s, over 180 s", 0),
    ],
)
def test_past_the_limit_the_run_fails_except_under_ci(monkeypatch, under_ci, line, status):
    monkeypatch.setattr(timing_guard, "UNDER_CI", under_ci)
    guard = guard_after([("slower", FAIL_SECONDS + 5), ("fine", 1.0)])
    terminal, session = Terminal(), types.SimpleNamespace(exitstatus=0)
    guard.pytest_terminal_summary(terminal)
    guard.pytest_sessionfinish(session)
    assert terminal.lines[-1] == line
    assert session.exitstatus == status


def test_the_heavy_files_run_first_and_the_rest_keep_their_order():
    from timing_guard import HEAVY_FIRST, heavy_first

    names = ["tests/a.py::x", f"{HEAVY_FIRST[1]}::y", "tests/b.py::z", f"{HEAVY_FIRST[0]}::w", "tests/a.py::v"]
    items = [types.SimpleNamespace(nodeid=name) for name in names]
    heavy_first(items)
    assert [item.nodeid for item in items] == [names[3], names[1], names[0], names[2], names[4]]
