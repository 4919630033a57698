"""An SSH server on 127.0.0.1 for the unit tier: paramiko's own server side on a real TCP port, any public key
accepted, every command answered with exit 1 and no output. Enough for ktdeploy's SSHConnector (pyinfra,
paramiko) to connect with a key and a known_hosts file, as it does to a real host.

    with ssh_server(tmp_path) as srv:     # srv.port, srv.known_hosts (a file naming the server's key)
        SSHConnector("127.0.0.1", user="t", port=srv.port, key=KEY, known_hosts=str(srv.known_hosts))
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import paramiko


class _Server(paramiko.ServerInterface):
    def check_auth_publickey(self, username, key):
        return paramiko.AUTH_SUCCESSFUL

    def get_allowed_auths(self, username):
        return "publickey"

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED

    def check_channel_exec_request(self, channel, command):
        def answer() -> None:
            channel.send_exit_status(1)
            channel.shutdown_write()
            channel.close()

        threading.Thread(target=answer, daemon=True).start()
        return True


@dataclass
class Server:
    port: int
    known_hosts: Path


@contextlib.contextmanager
def ssh_server(folder: Path) -> Iterator[Server]:
    key = paramiko.RSAKey.generate(2048)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    port = sock.getsockname()[1]
    known = folder / "known_hosts"
    known.write_text(f"[127.0.0.1]:{port} {key.get_name()} {key.get_base64()}\n")
    stop = threading.Event()
    transports: list[paramiko.Transport] = []

    def serve() -> None:
        sock.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _addr = sock.accept()
            except OSError:
                continue
            t = paramiko.Transport(conn)
            t.add_server_key(key)
            t.start_server(server=_Server())
            transports.append(t)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield Server(port, known)
    finally:
        stop.set()
        thread.join(5)
        for t in transports:
            t.close()
        sock.close()
