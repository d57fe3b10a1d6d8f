"""kill -9 at random moments of saving, 20 times: every restart resumes from a complete
checkpoint (all its tensors the step it was saved at), at least the last one a save
returned for, and never from nothing once one was saved."""

import os
import random
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
TRIALS = 20


def start(directory):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "..", "..", "src"), HERE])}
    command = [sys.executable, os.path.join(HERE, "save_loop.py"), str(directory), "16"]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def test_a_kill_during_a_save_never_loses_the_run(tmp_path):
    rng = random.Random(0)
    last_saved = 0
    resumed_from = []
    for trial in range(TRIALS):
        process = start(tmp_path)
        first = process.stdout.readline().split()  # "resumed N": the restore is done
        assert first and first[0] == "resumed", process.stderr.read()
        resumed = int(first[1])
        assert resumed >= last_saved, f"trial {trial}: resumed from {resumed}, but step {last_saved} was saved"
        resumed_from.append(resumed)
        time.sleep(rng.uniform(0.2, 1.5))  # the child does nothing but save: the kill lands in one
        process.kill()
        out, _ = process.communicate()
        saved = [int(line.split()[1]) for line in out.splitlines() if line.startswith("saved")]
        last_saved = max([resumed, *saved])
        print(f"trial {trial + 1}: resumed from {resumed}, {len(saved)} saves returned, killed after step {last_saved}")
    process = start(tmp_path)
    first = process.stdout.readline().split()
    process.kill()
    process.communicate()
    assert first[0] == "resumed" and int(first[1]) >= last_saved
    assert resumed_from[1:] and all(n > 0 for n in resumed_from[1:]), resumed_from
