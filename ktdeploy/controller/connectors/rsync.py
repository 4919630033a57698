"""rsync as a child of this process: an argv built here (no shell), and a child that dies with its controller.

- **No shell.** pyinfra's rsync joined the ssh options into a command line for ``sh -c`` with the key path
  unquoted: a key path holding ``$(…)`` or ``;`` ran a command here, one with a blank broke every upload. Here the
  argv goes to exec as it is; the one string rsync itself splits — ``--rsh``, the ssh command — quotes each field
  the way rsync's splitter (main.c ``do_cmd``) reads it: single quotes, a quote inside doubled.
- **Dies with the controller.** rsync runs in a process group of its own with ``PR_SET_PDEATHSIG`` (set by a
  tiny exec wrapper, so no Python code runs between fork and exec in this multi-threaded process): SIGTERM or
  Ctrl-C of `up` stop the group before the exception goes on, a SIGKILL of `up` reaches rsync from the kernel.
  rsync then keeps what it had copied in its partial folder, and the next upload resumes from it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

# exec'd by the interpreter in the child: ask the kernel for SIGTERM when the parent dies, then become rsync. A
# parent that died before the prctl (the signal would never come) ends the child at once.
_PDEATHSIG = ("import ctypes, os, signal, sys\n"
              "try:\n"
              "    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
              "except (OSError, AttributeError):\n"
              "    pass\n"
              "if os.getppid() != int(sys.argv[1]):\n"
              "    os._exit(143)\n"
              "os.execvp(sys.argv[2], sys.argv[2:])\n")
STOP_GRACE_S = 10.0   # after SIGTERM, how long rsync may take to keep its partial file before SIGKILL


def rsh_quote(field: str) -> str:
    """One field of rsync's --rsh command as rsync splits it: inside single quotes everything is literal, and
    two single quotes stand for one."""
    return "'" + field.replace("'", "''") + "'"


def ssh_command(*, port: int, key: str | None, known_hosts: str | None, strict: str) -> str:
    """The --rsh value: ssh with this connection's settings (as pyinfra's rsync passed them), every value quoted."""
    words = ["ssh", "-o", "BatchMode=yes", "-o", f"StrictHostKeyChecking={strict}", "-p", str(int(port))]
    if known_hosts:
        words += ["-o", f"UserKnownHostsFile={known_hosts}"]
    if key:
        words += ["-i", key]
    return " ".join(rsh_quote(w) for w in words)


def remote_spec(user: str | None, host: str, path: str) -> str:
    """``[user@]host:path`` (an IPv6 address in brackets); with ``-s`` the path reaches no shell on the host."""
    where = f"[{host}]" if ":" in host else host
    return f"{user + '@' if user else ''}{where}:{path}"


def run_rsync(argv: list[str]) -> subprocess.CompletedProcess:
    """Run ``argv`` (rsync …) to its end; stdout is dropped, stderr kept. Whatever stops this process first —
    Ctrl-C, SIGTERM (``core.errors.Terminated``), any exception — stops rsync's process group before it goes on."""
    wrapper = [sys.executable, "-I", "-S", "-c", _PDEATHSIG, str(os.getpid())]
    proc = subprocess.Popen([*wrapper, *argv], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, process_group=0)
    try:
        _out, err = proc.communicate()
    except BaseException:
        stop(proc)
        raise
    return subprocess.CompletedProcess(argv, proc.returncode, "", err.decode(errors="replace"))


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM to the child's group (rsync moves its partial file aside), SIGKILL after STOP_GRACE_S."""
    for sig, wait in ((signal.SIGTERM, STOP_GRACE_S), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                try:   # rsync's own children (ssh, the local receiver) are in the group too
                    os.killpg(proc.pid, 0)
                except ProcessLookupError:
                    return
            time.sleep(0.05)
    proc.wait()
