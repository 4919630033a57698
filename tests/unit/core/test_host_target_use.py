"""A --host is parsed once, into core/host_target.HostTarget: nothing else in ktdeploy/ redacts a host string,
tests a connector by its class name, or spells the local host names."""

import re
from pathlib import Path

from ktdeploy.core.host_target import parse_host

PKG = Path(__file__).resolve().parents[3] / "ktdeploy"
HOMES = {"core/host_target.py", "core/safeio.py"}
PATTERNS = {"redact_host(": re.compile(r"\bredact_host\("),
            "a class-name test": re.compile(r"__name__\s*==\s*[\"']\w*Connector"),
            "a local-host spelling": re.compile(r"in \([\"']localhost[\"'], [\"']local[\"']")}


def test_no_host_is_interpreted_outside_host_target():
    found = [f"{p.relative_to(PKG)}:{i}: {what}"
             for p in sorted(PKG.rglob("*.py")) if p.relative_to(PKG).as_posix() not in HOMES
             for i, line in enumerate(p.read_text().splitlines(), 1)
             for what, rx in PATTERNS.items() if rx.search(line)]
    assert not found, "use core/host_target.parse_host (HostTarget.kind/.is_local/.redacted):\n" + "\n".join(found)


def test_the_redacted_form_is_the_value_as_given_without_its_password():
    assert parse_host("ssh://u:secret@gpu01:2222").redacted == "ssh://u:***@gpu01:2222"
    assert parse_host("localhost").redacted == "localhost" and parse_host("").redacted == ""
    assert parse_host(None).redacted == "localhost" and parse_host("local").is_local
    assert parse_host("docker://c1").kind == "docker" and parse_host("u@h").kind == "ssh"
