"""dear.cli.run: SIGINT and SIGTERM stop a job through its `finally` blocks, also when it was started in the
background with SIGINT ignored (what a non-interactive shell does to `job &`)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from tests import ROOT

JOB = """
import sys, time
from pathlib import Path
from dear.cli import run

def main():
    out = Path(sys.argv[1])
    try:
        (out / "started").write_text("")
        time.sleep(60)
    finally:
        (out / "cleaned").write_text("")

run(main, "job")
"""


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stopped_job_runs_its_cleanup_and_exits_130(tmp_path, sig):
    script = tmp_path / "job.py"
    script.write_text(JOB)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path)], stderr=subprocess.PIPE, text=True,
                            env=env, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else "slow"
        time.sleep(0.05)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert (tmp_path / "cleaned").exists() and "job: stopped" in err
