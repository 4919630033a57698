"""Host strings -> connectors, and argv quoting (no host needed)."""

import shlex

import pytest

from ktdeploy.controller.connectors import LocalConnector, connect, parse_ssh_target, quote_argv
from ktdeploy.core.errors import UsageError


@pytest.mark.parametrize("text,expected", [
    ("gpu01", (None, "gpu01", 22)),
    ("kt@gpu01", ("kt", "gpu01", 22)),
    ("ssh://kt@gpu01:2222", ("kt", "gpu01", 2222)),
    ("kt@10.0.0.5:2200", ("kt", "10.0.0.5", 2200)),
    ("ssh://[fe80::1]:22", (None, "fe80::1", 22)),
])
def test_parse_ssh_target(text, expected):
    assert parse_ssh_target(text) == expected


@pytest.mark.parametrize("bad", ["gpu01:notaport", "ssh://kt@gpu01/path", "-oProxyCommand=x", "a b",
                                 "https://gpu01", "http://kt@gpu01:22", "@gpu01", "docker://", "docker://a b",
                                 "ssh://gpu01:70000", "gpu01?x=1"])
def test_bad_targets_are_usage_errors_before_any_connection(bad):
    with pytest.raises(UsageError) as ei:
        connect(bad)
    assert ei.value.exit_code == 2 and ei.value.key == "--host" and "ssh://user@host:port" in ei.value.fix


def test_local_names():
    assert isinstance(connect("localhost"), LocalConnector)
    assert isinstance(connect("local"), LocalConnector)


def test_quote_argv_round_trips():
    argv = ["printf", "%s", "a b'c\"$(rm -rf /)`x`;|&"]
    assert shlex.split(quote_argv(argv)) == argv


def test_local_connector_result_and_missing_command(tmp_path):
    c = LocalConnector()
    r = c.run(["sh", "-c", "echo o; echo e >&2; exit 3"])
    assert (r.rc, r.stdout, r.stderr) == (3, "o\n", "e\n")
    assert c.run(["/nonexistent-binary-ktd"]).rc == 127
    assert c.run(["sleep", "3"], timeout=0.5).rc == 124
