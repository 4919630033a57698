"""SSHConnector: commands and file transfers over SSH, built on pyinfra's SSH connector.

pyinfra does the connecting (ssh_config, keys, agent, host-key policy, retries) and the SFTP
transfers; commands run on the client pyinfra connected, so we keep each command's exact exit
status and separate stdout/stderr. Host keys are checked against known_hosts by default
(StrictHostKeyChecking=yes); ``accept_new_host_key=True`` (or KTDEPLOY_SSH_ACCEPT_NEW=1) accepts
and records a key never seen before, never a changed one.
"""

from __future__ import annotations

import logging
import os
import shlex
import stat
import time

from ktdeploy.controller.connectors.base import Result, checked, env_prefix, quote_argv, to_text
from ktdeploy.core.errors import ConnectError, StepError, UsageError

EOF_GRACE_S = 2.0   # after a command's exit status, how long its output may still arrive before the channel's EOF


def _regular_or_absent(path: str) -> None:
    """paramiko reads known_hosts with a plain open(): a FIFO there would wait forever, /dev/zero never end."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise ConnectError(f"--known-hosts {path}: cannot be read ({e.strerror})", key="known_hosts",
                           fix="give a known_hosts file (one `ssh-keyscan HOST` line per host)") from None
    if not stat.S_ISREG(st.st_mode) or st.st_size > 16 << 20:
        raise ConnectError(f"--known-hosts {path}: not a regular file of at most 16 MiB", key="known_hosts",
                           fix="give a known_hosts file (one `ssh-keyscan HOST` line per host)")


def _fix_for(reason: str, target: str, port: int, known_hosts: str | None = None) -> str:
    r = reason.lower()
    host = target.rsplit("@", 1)[-1]  # ssh-keyscan and ssh-keygen -R take the host alone, never user@host
    entry = host if port == 22 else f"[{host}]:{port}"  # how known_hosts names it
    file = shlex.quote(known_hosts) if known_hosts else "~/.ssh/known_hosts"
    if "no host key" in r or "not found in known_hosts" in r:
        return (f"Record the host key first: ssh-keyscan -p {port} {shlex.quote(host)} >> {file} "
                "(verify its fingerprint), or pass --accept-new-host-key.")
    if "does not match" in r or "host key error" in r:
        return (f"The host key changed. If expected, remove the old one: ssh-keygen -R {shlex.quote(entry)}"
                + (f" -f {file}" if known_hosts else "") + ".")
    if "authentication" in r:
        return "Check the user and key: ssh-copy-id the public key to the host, or pass --ssh-key PATH."
    if "resolve" in r:
        return f"Check the hostname {target.rsplit('@', 1)[-1]!r} (DNS / /etc/hosts / ~/.ssh/config)."
    if "refused" in r or "unable to connect to port" in r:
        return f"Nothing listens on {target}:{port}: start sshd there or give the right port (ssh://user@host:PORT)."
    if "timed out" in r or "timeout" in r or "unreachable" in r:
        return f"{target}:{port} did not answer: check the address, network and firewall."
    return f"Check that `ssh -p {port} {target}` works from this machine."


def _forget_cached_host_keys() -> None:
    """pyinfra memoizes parsed known_hosts files for the life of the process; re-read them on every connect
    so a key recorded or removed meanwhile (ssh-keygen -R, accept-new) is honoured."""
    try:
        from pyinfra.connectors.sshuserclient.client import get_host_keys

        getattr(get_host_keys, "cache", {}).clear()
    except ImportError:
        pass


class SSHConnector:
    def __init__(self, hostname: str, *, user: str | None = None, port: int = 22, key: str | None = None,
                 known_hosts: str | None = None, accept_new_host_key: bool | None = None,
                 connect_timeout: int = 10, password: str | None = None):
        from pyinfra.api import Config, Inventory, State
        from pyinfra.api.exceptions import ConnectError as PyinfraConnectError

        if accept_new_host_key is None:
            accept_new_host_key = os.environ.get("KTDEPLOY_SSH_ACCEPT_NEW", "") in ("1", "true", "yes")
        key = key or os.environ.get("KTDEPLOY_SSH_KEY") or None
        known_hosts = known_hosts or os.environ.get("KTDEPLOY_SSH_KNOWN_HOSTS") or None
        self.hostname, self.user, self.port = hostname, user, int(port)
        self.name = f"ssh://{user + '@' if user else ''}{hostname}:{self.port}"
        self._strict = "accept-new" if accept_new_host_key else "yes"
        self._key = os.path.expanduser(key) if key else None
        self._known_hosts = os.path.expanduser(known_hosts) if known_hosts else None
        data = {
            "ssh_hostname": hostname,
            "ssh_port": self.port,
            "ssh_strict_host_key_checking": self._strict,
            "ssh_connect_retries": 0,
        }
        if user:
            data["ssh_user"] = user
        if key:
            data["ssh_key"] = os.path.expanduser(key)
        if known_hosts:
            known_hosts = os.path.expanduser(known_hosts)
            _regular_or_absent(known_hosts)
            data["ssh_known_hosts_file"] = known_hosts
        if password:
            data["ssh_password"] = password
        # pyinfra logs connection errors itself; we raise them as one ConnectError instead.
        logging.getLogger("pyinfra").setLevel(logging.CRITICAL)
        logging.getLogger("paramiko").setLevel(logging.CRITICAL)
        inventory = Inventory(([(self.name, data)], {}))
        self._state = State(inventory, Config(CONNECT_TIMEOUT=connect_timeout))
        self._host = inventory.get_host(self.name)
        target = f"{user + '@' if user else ''}{hostname}"
        _forget_cached_host_keys()
        try:
            self._host.connect(show_errors=False, raise_exceptions=True)
        except PyinfraConnectError as e:
            reason = str(e.args[0] if e.args else e)
            raise ConnectError(f"cannot connect to {self.name}: {reason}", fix=_fix_for(reason, target, self.port, known_hosts),
                               key="host") from None
        except Exception as e:  # key file unreadable, bad ssh_config, ...
            reason = f"{type(e).__name__}: {e}"
            raise ConnectError(f"cannot connect to {self.name}: {reason}", fix=_fix_for(reason, target, self.port, known_hosts),
                               key="host") from None
        self._client = self._host.connector.client  # type: ignore[attr-defined]  # pyinfra types it BaseConnector; here SSHConnector

    # -- commands -------------------------------------------------------------------------------
    def _exec(self, command: str, *, timeout: float | None = None, input: str | bytes | None = None) -> Result:
        try:
            transport = self._client.get_transport()
            chan = transport.open_session()
            chan.exec_command(command)
            if input is not None:
                chan.sendall(input.encode() if isinstance(input, str) else input)
            chan.shutdown_write()
            out, err = bytearray(), bytearray()
            deadline = time.monotonic() + timeout if timeout else None
            chan.settimeout(0.2)
            exited_at: float | None = None
            while True:
                got = False
                while chan.recv_ready():
                    out += chan.recv(65536)
                    got = True
                while chan.recv_stderr_ready():
                    err += chan.recv_stderr(65536)
                    got = True
                if chan.exit_status_ready() and not chan.recv_ready() and not chan.recv_stderr_ready():
                    # sshd may send the exit status before the output the command wrote last (it reaps the child
                    # before it drains the pipe), so the answer is whole only at the channel's EOF. A command that
                    # leaves a background child holding its stdout never gives one: EOF_GRACE_S after the exit
                    # status, what has come is the answer.
                    exited_at = exited_at or time.monotonic()
                    if chan.eof_received or chan.closed or time.monotonic() - exited_at > EOF_GRACE_S:
                        break
                if deadline and time.monotonic() > deadline:
                    chan.close()
                    return Result(124, to_text(bytes(out)), to_text(bytes(err)) + f"\ntimed out after {timeout}s")
                if not got:
                    try:
                        data = chan.recv(65536)
                        if data:
                            out += data
                        elif not chan.exit_status_ready():
                            time.sleep(0.01)    # EOF came first: the exit status is on its way
                    except TimeoutError:
                        pass
            rc = chan.recv_exit_status()
            chan.close()
            if rc == -1 and not transport.is_active():
                # paramiko closes every channel of a dead transport and leaves exit_status at -1: the command's
                # output is cut short and its status unknown; never hand that back as an answer.
                raise ConnectError(f"connection to {self.name} lost while a command ran",
                                   fix="Check the host and re-run.")
            return Result(rc, to_text(bytes(out)), to_text(bytes(err)))
        except (OSError, EOFError) as e:
            raise ConnectError(f"connection to {self.name} lost: {e}", fix="Check the host and re-run.") from None
        except Exception as e:
            if type(e).__module__.startswith("paramiko"):
                raise ConnectError(f"connection to {self.name} lost: {e}", fix="Check the host and re-run.") from None
            raise

    def run(self, argv: list[str], *, timeout: float | None = None, check: bool = False,
            env: dict[str, str] | None = None, input: str | bytes | None = None) -> Result:
        command = quote_argv([*env_prefix(env), *[str(a) for a in argv]])
        res = self._exec(command, timeout=timeout, input=input)
        return checked(res, argv, self.name, check)

    def run_shell(self, script: str, *, timeout: float | None = None, check: bool = False) -> Result:
        return self.run(["sh", "-c", script], timeout=timeout, check=check)

    # -- files ----------------------------------------------------------------------------------
    def rsync(self, local_dir: str, remote_dir: str, flags: list[str]) -> None:
        """rsync a local folder's content into ``remote_dir`` over ssh with this connection's settings (user, port,
        key, known_hosts, host-key policy, BatchMode). The argv goes to exec, no shell; the key and known_hosts
        paths are quoted for rsync's own --rsh splitter, and ``-s`` keeps the host's shell away from the remote
        path (connectors/rsync.py). rsync dies with this process."""
        import shutil

        from ktdeploy.controller.connectors.rsync import remote_spec, run_rsync, ssh_command

        if shutil.which("rsync") is None:
            raise UsageError("rsync is not installed on this machine (the controller)", key="rsync",
                             fix="Install it (apt-get install rsync) on the controller and the host.")
        rsh = ssh_command(port=self.port, key=self._key, known_hosts=self._known_hosts, strict=self._strict)
        p = run_rsync(["rsync", *flags, "--rsh", rsh, "--", local_dir.rstrip("/") + "/",
                       remote_spec(self.user, self.hostname, remote_dir.rstrip("/") + "/")])
        if p.returncode != 0:
            raise StepError(f"rsync to {self.name}:{remote_dir} failed (exit {p.returncode}): "
                            f"{p.stderr.strip()[-600:]}", step="sync", rc=p.returncode,
                            fix="Check that rsync is installed on the host, then run the same command again: "
                                "the copy resumes where it stopped.")

    def put_file(self, local: str, remote: str, mode: int | None = None) -> None:
        parent = remote.rsplit("/", 1)[0] or "/"
        self.run(["mkdir", "-p", "--", parent], check=True, timeout=120)
        try:
            ok = self._host.connector.put_file(local, remote)
        except OSError as e:
            raise ConnectError(f"upload of {local} to {self.name}:{remote} failed: {e}") from None
        if ok is False:
            raise ConnectError(f"upload of {local} to {self.name}:{remote} failed")
        if mode is not None:
            self.run(["chmod", format(mode, "o"), "--", remote], check=True, timeout=60)

    def get_file(self, remote: str, local: str) -> None:
        try:
            ok = self._host.connector.get_file(remote, local)
        except OSError as e:
            raise ConnectError(f"download of {self.name}:{remote} failed: {e}") from None
        if ok is False:
            raise ConnectError(f"download of {self.name}:{remote} failed")

    def close(self) -> None:
        try:
            self._host.disconnect()
            if self._client is not None:
                self._client.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return f"SSHConnector({self.name!r})"
