"""Connectors: local, SSH (pyinfra) and docker exec, behind one small protocol.

``connect(host)`` maps a host string to a connector:
  'localhost' / 'local'            -> LocalConnector
  'docker://NAME'                  -> DockerExecConnector(NAME)
  'ssh://user@host:port', 'user@host', 'host', 'user@host:port' -> SSHConnector
Anything else is a UsageError (exit 2): ktdeploy.core.host_target parses every --host.
"""

from __future__ import annotations

from typing import Any

from ktdeploy.controller.connectors.base import Connector, Result, quote_argv
from ktdeploy.controller.connectors.docker_exec import DockerExecConnector
from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.core.errors import UsageError
from ktdeploy.core.host_target import FORMS, HostTarget, parse_host
from ktdeploy.core.safeio import printable

__all__ = ["Connector", "DockerExecConnector", "LocalConnector", "Result", "SSHConnector", "connect",
           "parse_ssh_target", "quote_argv"]


def parse_ssh_target(host: str) -> tuple[str | None, str, int]:
    """'ssh://u@h:2222' / 'u@h:2222' / 'u@h' / 'h' -> (user, hostname, port); a UsageError (exit 2) otherwise."""
    t = parse_host(host)
    if t.kind != "ssh":
        raise UsageError(f"{printable(t.redacted)} is not an SSH host", key="--host", fix=f"Give {FORMS}.")
    return t.user, t.address, t.port or 22


def connect(host: str | HostTarget, **ssh_options: Any) -> Connector:
    """A connector for ``host`` (core/host_target.py's forms; anything else is a UsageError before any
    connection). SSH options: key, known_hosts, accept_new_host_key, connect_timeout."""
    t = host if isinstance(host, HostTarget) else parse_host(host)
    if t.kind == "local":
        return LocalConnector()
    if t.kind == "docker":
        return DockerExecConnector(t.address)
    from ktdeploy.controller.connectors.ssh import SSHConnector

    return SSHConnector(t.address, user=t.user, port=t.port or 22, **ssh_options)


def __getattr__(name: str) -> Any:  # lazy: pyinfra/paramiko load only when SSH is used
    if name == "SSHConnector":
        from ktdeploy.controller.connectors.ssh import SSHConnector

        return SSHConnector
    raise AttributeError(name)
