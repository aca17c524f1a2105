"""Atomic writes: the umask's mode (or the replaced file's), temp files a later run sweeps,
and child processes that end with the run that started them."""
from __future__ import annotations

import os
import signal
import stat
import sys
import time

import pytest

from hslm_ptx.pipeline.core import proc
from hslm_ptx.pipeline.core.files import sweep_temp_files, temp_path, write_atomic


def mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask():
    def set_to(value: int) -> None:
        os.umask(value)

    old = os.umask(0o022)
    yield set_to
    os.umask(old)


def test_new_files_get_the_umask_mode(tmp_path, umask):
    umask(0o022)
    write_atomic(tmp_path / "a.json", "{}")
    assert mode(tmp_path / "a.json") == 0o644  # mkstemp would give 0600
    umask(0o077)
    write_atomic(tmp_path / "b.json", "{}")
    assert mode(tmp_path / "b.json") == 0o600


def test_a_rewrite_keeps_the_mode(tmp_path, umask):
    path = tmp_path / "ledger.json"
    path.write_text("old")
    path.chmod(0o664)
    write_atomic(path, "new")
    assert path.read_text() == "new" and mode(path) == 0o664
    assert [p.name for p in tmp_path.iterdir()] == ["ledger.json"]


def test_a_killed_runs_temp_files_are_swept(tmp_path):
    dead = tmp_path / "verify" / ".tiny.json.tmp-999999999"  # no such process
    live = tmp_path / ".ptx.tmp-{}".format(os.getpid())
    other = tmp_path / ".notes.tmp"  # not ours: never touched
    for path in (dead, live, other):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("half")
    assert temp_path(tmp_path / "k.ptx").name == f".k.ptx.tmp-{os.getpid()}"
    assert sweep_temp_files([tmp_path]) == [dead] and live.exists() and other.exists()
    assert sweep_temp_files([tmp_path], everything=True) == [live] and other.exists()


def test_an_interrupted_child_group_is_ended(tmp_path):
    """Ctrl-C while waiting on a child ends its whole process group (grandchildren too)."""
    pidfile = tmp_path / "grandchild.pid"
    script = f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); " \
             f"open({str(pidfile)!r}, 'w').write(str(p.pid)); time.sleep(60)"

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 2.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            proc.run([sys.executable, "-c", script])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    grandchild = int(pidfile.read_text())
    for _ in range(50):
        try:
            os.kill(grandchild, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        pytest.fail(f"grandchild {grandchild} outlived the interrupted run")
