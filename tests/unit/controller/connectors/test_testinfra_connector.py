"""TestinfraConnector over testinfra's local:// backend: argv quoting, stdin emulation, chunked uploads."""

import os

import testinfra

from ktdeploy.controller.connectors.testinfra import TestinfraConnector


def test_run_put_get(tmp_path):
    c = TestinfraConnector(testinfra.get_host("local://"))
    weird = "a b'c\"$(echo pwned)`id`"
    assert c.run(["printf", "%s", weird]).stdout == weird
    assert c.run(["cat"], input="fed via argv").stdout == "fed via argv"
    assert c.run(["sh", "-c", "echo $X"], env={"X": "1 2"}).stdout == "1 2\n"
    data = os.urandom(200_000)  # several upload chunks
    src = tmp_path / "src.bin"
    src.write_bytes(data)
    c.put_file(str(src), str(tmp_path / "d" / "dst.bin"), mode=0o700)
    assert (tmp_path / "d" / "dst.bin").read_bytes() == data
    assert oct((tmp_path / "d" / "dst.bin").stat().st_mode & 0o777) == "0o700"
    c.get_file(str(tmp_path / "d" / "dst.bin"), str(tmp_path / "back.bin"))
    assert (tmp_path / "back.bin").read_bytes() == data


def test_timeout_is_kept():
    """testinfra's backends take no timeout: the connector bounds the command on the host (rc 124, like local)."""
    import time

    c = TestinfraConnector(testinfra.get_host("local://"))
    t0 = time.monotonic()
    r = c.run(["sleep", "30"], timeout=1)
    assert r.rc == 124 and "timed out after 1 s" in r.stderr and time.monotonic() - t0 < 10
    c.default_timeout = 1
    assert c.run(["sleep", "30"]).rc == 124
    assert c.run(["sh", "-c", "echo $X"], env={"X": "ok"}, timeout=20).stdout == "ok\n"
