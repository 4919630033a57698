"""An `up` that holds its job's lock for as long as a test wants: up_host.up in a thread, its connector (a
FakeConnector) answering nothing until the block ends, so the up waits in its doctor phase."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

from tests.fakes.connector import FakeConnector, fail


@contextlib.contextmanager
def up_holding_its_lock(host: str, recipe: str) -> Iterator[None]:
    from ktdeploy.controller.up_host import up
    from ktdeploy.core.command_requests import UpRequest

    inside, release = threading.Event(), threading.Event()

    def slow(argv):
        inside.set()
        release.wait(30)
        return fail(255, "host gone")

    def first() -> None:
        with contextlib.suppress(BaseException):
            up(UpRequest(host=host, recipe=recipe), connector=FakeConnector(name=host or "localhost").on(lambda argv: True, slow))

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(30), "the first up never reached its doctor phase"
        yield
    finally:
        release.set()
        t.join(30)
