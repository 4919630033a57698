"""Connectors: local, SSH (pyinfra) and docker exec, behind one small protocol.

``connect(host)`` maps a host string to a connector:
  'localhost' / 'local'            -> LocalConnector
  'docker://NAME'                  -> DockerExecConnector(NAME)
  'ssh://user@host:port', 'user@host', 'host', 'user@host:port' -> SSHConnector
"""

from __future__ import annotations

from urllib.parse import urlsplit

from ktdeploy.controller.connectors.base import Connector, Result, quote_argv
from ktdeploy.controller.connectors.docker import DockerExecConnector
from ktdeploy.controller.connectors.local import LocalConnector
from ktdeploy.core.errors import ConnectError
from ktdeploy.core.safeio import printable, redact_host

__all__ = ["Connector", "DockerExecConnector", "LocalConnector", "Result", "SSHConnector", "connect",
           "parse_ssh_target", "quote_argv"]


def _invalid_host(host: str, why: str = "") -> ConnectError:
    return ConnectError(f"invalid host {printable(redact_host(host))}{': ' + why if why else ''}",
                        fix="Use host, user@host or ssh://user@host:port.", key="host")


def parse_ssh_target(host: str) -> tuple[str | None, str, int]:
    """'ssh://u@h:2222' / 'u@h:2222' / 'u@h' / 'h' -> (user, hostname, port)."""
    rest = host[len("ssh://"):] if host.startswith("ssh://") else host
    userinfo, at, hostport = rest.rpartition("@")  # the userinfo ends at the LAST '@'; its password is dropped
    user = userinfo.split(":", 1)[0] if at else None
    try:
        parts = urlsplit(f"ssh://{hostport}")
        port = parts.port or 22
    except ValueError as e:
        raise _invalid_host(host, str(e)) from None
    if not parts.hostname or parts.path not in ("", "/") or (at and not user):
        raise _invalid_host(host)
    return user, parts.hostname, port


def connect(host: str, **ssh_options) -> Connector:
    """A connector for ``host``. SSH options: key, known_hosts, accept_new_host_key, connect_timeout."""
    host = (host or "").strip()
    if host in ("localhost", "local", ""):
        return LocalConnector()
    if host.startswith("docker://"):
        return DockerExecConnector(host[len("docker://"):])
    if host.startswith("-") or any(c.isspace() for c in host):
        raise _invalid_host(host)
    from ktdeploy.controller.connectors.ssh import SSHConnector

    user, hostname, port = parse_ssh_target(host)
    return SSHConnector(hostname, user=user, port=port, **ssh_options)


def __getattr__(name):  # lazy: pyinfra/paramiko load only when SSH is used
    if name == "SSHConnector":
        from ktdeploy.controller.connectors.ssh import SSHConnector

        return SSHConnector
    raise AttributeError(name)
