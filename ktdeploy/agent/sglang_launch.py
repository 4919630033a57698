"""Start sglang-kt's HTTP server in-process, with the API key taken from the environment, never from argv.

``python -m sglang.launch_server … --api-key KEY`` puts the key in the server's command line, which every
user of the host reads in ``ps`` / ``/proc/*/cmdline``. This module does what sglang's own ``launch_server``
module does - ``prepare_server_args(argv)`` then ``launch_server(server_args)`` (both are sglang-kt's public
entry points: ``sglang.srt.server_args`` and ``sglang.srt.entrypoints.http_server``) - but sets
``server_args.api_key`` in Python from the environment variable named by ``KTDEPLOY_API_KEY_ENV``. The
variable comes from the 0600 ``--env-file`` `ktdeploy up` hands to ``docker create``; it is removed from this
process's environment before sglang starts its scheduler/detokenizer processes, which receive the
``ServerArgs`` object (pickled), not a command line.

    python -m ktdeploy.agent.sglang_launch --model-path … [every other sglang-kt flag]
"""

from __future__ import annotations

import os
import sys
from collections.abc import MutableMapping

KEY_ENV_VAR = "KTDEPLOY_API_KEY_ENV"
CACHE_VARS = ("SGLANG_KT_LORA_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")


def cache_root(home: str, uid: int) -> str:
    """This uid's cache folder under HOME (agent/serve.py cache_env points sglang-kt's and torch's caches in it)."""
    return f"{home.rstrip('/')}/.cache/ktdeploy-{uid}"


def _prepare_caches(environ: MutableMapping[str, str]) -> None:
    """Create the cache folders ktdeploy chose (0700, this uid's own) before sglang-kt writes into them."""
    from ktdeploy.core.safeio import private_dir

    root = cache_root(environ.get("HOME") or "/tmp", os.getuid())
    for key in CACHE_VARS:
        value = environ.get(key)
        if value and (value == root or value.startswith(root + "/")):
            private_dir(value, root)


def _take_key(environ: MutableMapping[str, str]) -> str | None:
    name = environ.pop(KEY_ENV_VAR, None)
    if not name:
        return None
    key = environ.pop(name, None)
    if not key:
        print(f"ktdeploy: {KEY_ENV_VAR} names {name}, which is not set; refusing to serve without the API key",
              file=sys.stderr)
        raise SystemExit(2)
    return key


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    from ktdeploy.core.safeio import secret_option

    if any(secret_option(a) for a in argv):
        print("ktdeploy: a secret on the command line (--api-key, or any spelling of it) is refused (visible in "
              "ps); set deploy.serve.api_key_env instead", file=sys.stderr)
        return 2
    key = _take_key(os.environ)
    from ktdeploy.core.errors import UsageError

    try:
        _prepare_caches(os.environ)
    except UsageError as err:
        print(f"ktdeploy: {err} ({err.fix})", file=sys.stderr)
        return 2
    from sglang.srt.entrypoints.http_server import launch_server
    from sglang.srt.server_args import prepare_server_args

    server_args = prepare_server_args(argv)
    if key is not None:
        server_args.api_key = key
    try:
        launch_server(server_args)
    finally:
        try:
            from sglang.srt.utils import kill_process_tree
        except ImportError:  # pragma: no cover - older/newer layouts
            pass
        else:
            kill_process_tree(os.getpid(), include_parent=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
