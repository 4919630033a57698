"""Every unit test runs apart from the user's own state (tests/user_state.py says how, and fails the session when
one writes there anyway)."""

from tests.user_state import pytest_sessionfinish, pytest_sessionstart  # noqa: F401  (pytest hooks)
