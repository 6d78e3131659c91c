"""Run the evaluator's child and kill everything it started, however it started it.

    python -I losslab/kernelbench/supervisor.py STDOUT STDERR FD -- ARGV...

The evaluator starts this small process with :func:`start` and ends it with
:meth:`Supervised.stop`; :func:`main` says what it does and what is beyond its reach.
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
KILL_ROUNDS = 50  # each kills what is there, reaps and looks again 20 ms later
CONTAINED = "every process it started was killed (a subreaper walking /proc)"
NOT_CONTAINED = ("not contained: prctl(PR_SET_CHILD_SUBREAPER) or /proc is unavailable here (Linux only), so only "
                 "the child and its process group were killed; a process it started in a session of its own "
                 "may still be running")


class _Stop(Exception):
    """SIGTERM from the evaluator."""


def _stop(signum, frame):
    raise _Stop


def _prctl(option: int, value: int) -> bool:
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def descendants(pid: int) -> list[int]:
    """Every process under ``pid`` (children, theirs, ...), read from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                stat = Path(entry.path, "stat").read_text()
            except OSError:  # it has just ended
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])  # after the command name: state, ppid
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _describe(pid: int) -> str:
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = "?"
    return f"pid {pid}: {command[:120]}"


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def kill_tree() -> list[str]:
    """Kill every descendant of this process, in rounds (orphans come to this subreaper between
    rounds), reaping as it goes; returns the survivors' descriptions."""
    for _ in range(KILL_ROUNDS):
        pids = descendants(os.getpid())
        if not pids:
            return []
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
        _reap()
    return [_describe(pid) for pid in descendants(os.getpid())]


def main(argv: list[str]) -> int:
    """The supervisor, run as a script that imports nothing but the standard library (so it is up
    in milliseconds), in a session of its own (:func:`start`).

    On Linux it makes itself the child subreaper (``prctl(PR_SET_CHILD_SUBREAPER)``): a process
    that the child starts and leaves behind, even in a session of its own
    (``start_new_session=True``, ``setsid``, a double fork), is re-parented to it instead of to
    init, so it stays in reach. It runs ARGV (standard input inherited, output to the files
    STDOUT and STDERR, descriptor FD passed on) and waits for it. When the child exits, or when
    the evaluator sends SIGTERM (or dies: ``PR_SET_PDEATHSIG``), it kills every descendant it
    finds under /proc (:func:`kill_tree`), in rounds until none is left, and writes one JSON
    line to its standard output::

        {"returncode": 0, "contained": true, "how": "...", "survivors": ["pid 123: sleep 60"]}

    ``returncode`` is the child's (None when the supervisor killed it), ``survivors`` the
    processes still alive after the last round. Beyond its reach: a process started through
    another service (systemd-run, at, ssh) or that changed its user. Where prctl or /proc is
    missing (not Linux), ``contained`` is False, only the child itself is killed, and ``how``
    says so.
    """
    stdout_path, stderr_path, fd, command = argv[0], argv[1], int(argv[2]), argv[argv.index("--") + 1:]
    signal.signal(signal.SIGTERM, _stop)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)  # the evaluator died: clean up all the same
    contained = sys.platform.startswith("linux") and os.path.isdir("/proc") and _prctl(PR_SET_CHILD_SUBREAPER, 1)
    child, returncode = None, None
    try:
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            child = subprocess.Popen(command, stdout=out, stderr=err, pass_fds=(fd,))
        # The pipes are the child's alone now: the evaluator sees their end when the child's end closes.
        os.close(fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        returncode = child.wait()
    except _Stop:
        pass
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if contained:
        survivors = kill_tree()
    else:
        if child is not None and child.poll() is None:
            child.kill()
            child.wait()
        survivors = []
    with contextlib.suppress(OSError):
        print(json.dumps({"returncode": returncode, "contained": contained, "survivors": survivors,
                          "how": CONTAINED if contained else NOT_CONTAINED}), flush=True)
    return 0


@dataclass
class Supervised:
    """A running supervisor: ``commands`` is the write end of the child's standard input,
    ``replies`` the read end of the pipe the child answers on (descriptor ``child_fd`` there)."""

    process: subprocess.Popen
    commands: int
    replies: int
    child_fd: int

    def stop(self, patience_s: float = 0.0) -> dict:
        """End the child and everything it started; returns the supervisor's report.

        Waits ``patience_s`` for the child to end by itself (it was told to, or has died), then
        sends SIGTERM; a supervisor that has not reported 10 s later is killed with its group."""
        for fd in (self.commands, self.replies):
            with contextlib.suppress(OSError):
                os.close(fd)
        try:
            out, err = self.process.communicate(timeout=patience_s)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGTERM)
            try:
                out, err = self.process.communicate(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                out, err = self.process.communicate()
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        try:
            return json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {"returncode": None, "contained": False, "survivors": [],
                    "how": "not contained: the supervisor did not report "
                           f"({err.decode(errors='replace').strip()[-300:] or 'no output'})"}


def start(argv: list[str], *, cwd: Path, env: dict[str, str], stdout: Path, stderr: Path) -> Supervised:
    """Start ``argv`` under a supervisor (in a new session) with a command pipe on its standard
    input and a reply pipe; see :class:`Supervised`."""
    command_read, commands = os.pipe()
    replies, reply_write = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-I", str(Path(__file__).resolve()), str(stdout), str(stderr),
                                    str(reply_write), "--", *argv], cwd=cwd, env=env, stdin=command_read,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, pass_fds=(reply_write,),
                                   start_new_session=True)
    except BaseException:
        for fd in (commands, replies):
            os.close(fd)
        raise
    finally:
        os.close(command_read)
        os.close(reply_write)
    return Supervised(process, commands, replies, reply_write)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
