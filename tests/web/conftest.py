"""The web tests run against the same live servers as the service tests."""

from tests.service.conftest import live, tiny_loaded

__all__ = ["live", "tiny_loaded"]
