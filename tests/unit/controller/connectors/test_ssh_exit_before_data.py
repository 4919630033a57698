"""The SSH connector's answer is whole when the server sends a command's exit status before the output the command
wrote last. RFC 4254 allows it and OpenSSH's sshd does it when it reaps the child before it drains the pipe (the
Slurm follow's job reads came back cut short about once in a thousand on a busy login node: a JOB_SH answer
without its last marker). sshd's timing cannot be forced, so this server — paramiko's own server side, speaking
the real protocol over a socket pair — sends the status first on purpose, then the output, then EOF."""

from __future__ import annotations

import socket
import threading
import time

import paramiko
import pytest

from ktdeploy.controller.connectors import ssh as ssh_mod
from ktdeploy.controller.connectors.ssh import SSHConnector


class _Server(paramiko.ServerInterface):
    def __init__(self, script) -> None:
        self.script = script

    def check_auth_none(self, username):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "none"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        threading.Thread(target=self.script, args=(channel,), daemon=True).start()
        return True


def _status_first(channel) -> None:
    time.sleep(0.05)
    channel.send_exit_status(0)
    time.sleep(0.3)                          # the client sees the status with nothing buffered
    channel.sendall(b"@@scontrol\nJobId=7 JobState=COMPLETED\n@@end\n")
    time.sleep(0.3)
    channel.sendall(b"@@done\n")
    channel.shutdown_write()                 # EOF
    channel.close()


def _status_then_no_eof(channel) -> None:
    """A command whose background child keeps the output open: the status comes, EOF never does."""
    channel.sendall(b"started\n")
    channel.send_exit_status(0)
    time.sleep(30)


@pytest.fixture
def connector_to():
    made = []

    def start(script) -> SSHConnector:
        client_sock, server_sock = socket.socketpair()
        server = paramiko.Transport(server_sock)
        server.add_server_key(_rsa())
        server.start_server(event=threading.Event(), server=_Server(script))   # negotiates in its thread
        client = paramiko.Transport(client_sock)
        client.start_client()
        client.auth_none("t")
        made.extend([server, client])
        conn = object.__new__(SSHConnector)
        conn.name = "ssh://t@test:22"
        conn._client = _Client(client)
        return conn

    yield start
    for t in made:
        t.close()


class _Client:
    """What SSHConnector._exec uses of pyinfra's paramiko SSHClient."""

    def __init__(self, transport: paramiko.Transport) -> None:
        self._t = transport

    def get_transport(self) -> paramiko.Transport:
        return self._t


_KEY: list[paramiko.RSAKey] = []


def _rsa() -> paramiko.RSAKey:
    if not _KEY:
        _KEY.append(paramiko.RSAKey.generate(1024))
    return _KEY[0]


def test_output_sent_after_the_exit_status_is_part_of_the_answer(connector_to):
    conn = connector_to(_status_first)
    r = conn._exec("sh -c JOB_SH", timeout=10)
    assert r.rc == 0
    assert r.stdout.splitlines()[-1] == "@@done", r.stdout


def test_no_eof_after_the_exit_status_ends_after_the_grace(connector_to, monkeypatch):
    monkeypatch.setattr(ssh_mod, "EOF_GRACE_S", 0.5)
    conn = connector_to(_status_then_no_eof)
    t0 = time.monotonic()
    r = conn._exec("start-a-daemon", timeout=20)
    assert (r.rc, r.stdout) == (0, "started\n")
    assert time.monotonic() - t0 < 5          # neither the command's timeout nor the server's 30 s
