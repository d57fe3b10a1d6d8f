"""The progress line tells the elapsed time and the time left, from the pace after the
first update (which carries the tracing), and is drawn only on a terminal."""

import io

from amptrain.engine import run_log
from amptrain.engine.run_log import Pace, Progress


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class Terminal(io.StringIO):
    def isatty(self):
        return True


def test_time_left_comes_from_the_pace_after_the_first_update(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(run_log.time, "monotonic", clock)
    pace = Pace(total=100)
    clock.now += 30.0  # the first 10 steps: 30 s, tracing included
    assert pace.left(10) == 30.0 / 10 * 90
    clock.now += 10.0  # the next 10: 1 s a step
    assert pace.left(20) == 80.0
    assert pace.describe(20) == "0:40 elapsed, 1:20 left"


def test_the_fit_line_names_step_loss_elapsed_and_left(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(run_log.time, "monotonic", clock)
    terminal = Terminal()
    progress = Progress(total_steps=200, start_step=100, stream=terminal)
    clock.now += 50.0
    progress.update(150, 0.41234, 12345.6, note="scale 32768  skipped 0")
    assert terminal.getvalue().strip() == (
        "step 150/200  loss 0.4123  12,346 tokens/s  scale 32768  skipped 0  0:50 elapsed, 0:50 left"
    )
    progress.clear()
    assert terminal.getvalue().endswith("\r" + " " * 100 + "\r")


def test_no_line_off_a_terminal_nor_before_after_seconds(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(run_log.time, "monotonic", clock)
    pipe = io.StringIO()
    Progress(10, 0, stream=pipe).show(5, "predicting")
    assert pipe.getvalue() == ""
    terminal = Terminal()
    progress = Progress(0, 0, stream=terminal, unit="batch", after=2.0)  # 0: the total is not known
    progress.show(1)
    assert terminal.getvalue() == ""
    clock.now += 3.0
    progress.show(2)
    assert terminal.getvalue().strip() == "batch 2  0:03 elapsed"
