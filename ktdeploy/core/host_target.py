"""A --host value, parsed once (pure): which kind of place it names, where, and how it may be shown.

    localhost | local | ""          -> kind "local"
    docker://CONTAINER              -> kind "docker"
    host | user@host | user@host:port | ssh://user@host:port  -> kind "ssh"

Anything else is a usage error (exit 2) naming the forms, decided before anything is recorded or reached: a URL
of another scheme (``https://gpu01``), a path, an option (``-oProxyCommand=…``), spaces, a port that is not a
number. Whether the host then answers is the connector's business (exit 3).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from ktdeploy.core.errors import UsageError
from ktdeploy.core.safeio import NAME, printable, redact_host

FORMS = "localhost, host, user@host, user@host:port, ssh://user@host:port or docker://CONTAINER"
LOCAL_NAMES = ("localhost", "local", "")


@dataclass(frozen=True)
class HostTarget:
    kind: Literal["local", "ssh", "docker"]
    address: str                 # the hostname, the container name, or "localhost"
    user: str | None = None
    port: int | None = None
    redacted: str = "localhost"  # the value as given, its password (if any) replaced by *** (what records keep)

    @property
    def is_local(self) -> bool:
        return self.kind == "local"

    def lock_key(self, default_user: str) -> str:
        """The place this target names, one spelling for all of its spellings: what one run's lock is keyed on.
        ``localhost``, ``local`` and an empty host are ``local``; ``gpu01``, ``root@GPU01.:22`` and
        ``ssh://root@gpu01`` are ``ssh://root@gpu01:22`` for ``default_user`` root (the user ssh logs in as
        when none is given: this machine's)."""
        if self.kind == "local":
            return "local"
        if self.kind == "docker":
            return f"docker://{self.address}"
        host = self.address.rstrip(".").lower()
        try:
            host = f"[{ipaddress.IPv6Address(host)}]"
        except ValueError:
            pass
        return f"ssh://{self.user or default_user}@{host}:{self.port or 22}"


def _invalid(text: str, why: str) -> UsageError:
    return UsageError(f"{printable(redact_host(text))} is not a host: {why}", key="--host",
                      fix=f"Give {FORMS}.")


def parse_host(text: str | None) -> HostTarget:
    """The one parse of a --host value; UsageError (exit 2) when it is none of FORMS."""
    raw = (text or "").strip()
    shown = redact_host(text or "")
    if raw in LOCAL_NAMES:
        return HostTarget("local", "localhost", redacted="localhost" if text is None else redact_host(text))
    if raw.startswith("docker://"):
        name = raw[len("docker://"):]
        if not NAME.match(name):
            raise _invalid(raw, "docker://CONTAINER needs a container name or id")
        return HostTarget("docker", name, redacted=shown)
    if raw.startswith("-") or any(c.isspace() or ord(c) < 32 for c in raw):
        raise _invalid(raw, "it starts with '-' or holds spaces or control characters")
    scheme, sep, _ = raw.partition("://")
    if sep and scheme != "ssh":
        raise _invalid(raw, f"{scheme}:// is not a way to reach a host (ktdeploy uses SSH)")
    rest = raw[len("ssh://"):] if sep else raw
    userinfo, at, hostport = rest.rpartition("@")  # the userinfo ends at the LAST '@'; its password is dropped
    user = userinfo.split(":", 1)[0] if at else None
    if at and not user:
        raise _invalid(raw, "the user name before '@' is empty")
    try:
        parts = urlsplit(f"ssh://{hostport}")
        port = parts.port or 22
    except ValueError as e:
        raise _invalid(raw, f"the port is not a number from 1 to 65535 ({e})") from None
    if not parts.hostname:
        raise _invalid(raw, "no host name")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise _invalid(raw, "a host has no path, query or fragment")
    return HostTarget("ssh", parts.hostname, user=user, port=port, redacted=shown)
