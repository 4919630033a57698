"""Integration fixtures: test hosts (sshd containers) from tests/integration/hosts.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.integration.hosts import host_pool  # noqa: E402,F401  (session fixture)
