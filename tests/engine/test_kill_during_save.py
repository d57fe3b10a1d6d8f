"""kill -9 at random moments of saving, 20 times: every restart resumes from a complete
checkpoint (all its tensors the step it was saved at), at least the last one a save
returned for, and never from nothing once one was saved.

Each trial's process is forked from one that imported TensorFlow once (save_loop.py
--zygote): the kill and the restore are a whole process's, the twenty imports are not paid."""

import os
import random
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.slow

HERE = os.path.dirname(os.path.abspath(__file__))
TRIALS = 20


class Zygote:
    def __init__(self, directory):
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.path.join(HERE, "..", "..", "src"), HERE])}
        command = [sys.executable, os.path.join(HERE, "save_loop.py"), "--zygote", str(directory), "16"]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.outputs = directory / "outputs"
        self.outputs.mkdir()
        self.started = 0

    def start(self):
        """A fresh loop process; returns its pid and the first line it printed."""
        self.started += 1
        output = self.outputs / f"{self.started}.out"
        self.process.stdin.write(f"fork {output}\n")
        self.process.stdin.flush()
        pid = int(self.process.stdout.readline().split()[1])
        deadline = time.monotonic() + 120
        while not (output.exists() and output.read_text().endswith("\n")):
            assert time.monotonic() < deadline and self.process.poll() is None, f"no first line in {output}"
            time.sleep(0.02)
        return pid, output

    def kill(self, pid, output):
        """SIGKILL, then the lines the process printed once it is gone."""
        os.kill(pid, 9)
        while True:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return output.read_text().splitlines()
            time.sleep(0.01)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=60)


def test_a_kill_during_a_save_never_loses_the_run(tmp_path):
    rng = random.Random(0)
    last_saved = 0
    resumed_from = []
    zygote = Zygote(tmp_path)
    for trial in range(TRIALS):
        pid, output = zygote.start()
        first = output.read_text().split()  # "resumed N": the restore is done
        assert first and first[0] == "resumed", output.read_text()
        resumed = int(first[1])
        assert resumed >= last_saved, f"trial {trial}: resumed from {resumed}, but step {last_saved} was saved"
        resumed_from.append(resumed)
        time.sleep(rng.uniform(0.2, 1.5))  # the child does nothing but save: the kill lands in one
        lines = zygote.kill(pid, output)
        saved = [int(line.split()[1]) for line in lines if line.startswith("saved")]
        last_saved = max([resumed, *saved])
        print(f"trial {trial + 1}: resumed from {resumed}, {len(saved)} saves returned, killed after step {last_saved}")
    pid, output = zygote.start()
    first = zygote.kill(pid, output)[0].split()
    zygote.close()
    assert first[0] == "resumed" and int(first[1]) >= last_saved
    assert resumed_from[1:] and all(n > 0 for n in resumed_from[1:]), resumed_from
