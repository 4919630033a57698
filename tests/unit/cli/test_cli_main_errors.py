"""cli.main maps every exception to one screen and an exit code."""

import pytest

from ktdeploy.cli import app, main
from ktdeploy.core.errors import UsageError


def test_a_plain_unicode_error_is_a_usage_error_not_a_crash_in_the_handler(capsys):
    # UnicodeError itself (raised e.g. by the idna codec for "a..b") has no .reason; reading it crashed main()
    @app.command("zz-test-raise-unicode", hidden=True)
    def _boom() -> None:
        "a.b".encode("idna") and "a..b".encode("idna")

    try:
        with pytest.raises(SystemExit) as e:
            main(["zz-test-raise-unicode"])
    finally:
        app.registered_commands.pop()
    err = capsys.readouterr().err
    assert e.value.code == UsageError.exit_code, err
    assert "not valid text" in err and "label" in err
