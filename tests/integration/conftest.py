"""Integration fixtures: test hosts (sshd containers) from tests/integration/hosts.py. Every test runs apart from
the user's own state (tests/user_state.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.hosts import host_pool  # noqa: E402,F401  (session fixture)
from tests.user_state import pytest_sessionfinish, pytest_sessionstart  # noqa: E402,F401  (pytest hooks)
