"""The SDK range the adapter declares is the range its CI tests."""

from __future__ import annotations

import importlib.metadata
import re

import daytona
import pytest

from poolkeeper_daytona import (
    TESTED_SDK_VERSIONS,
    DaytonaInternalsWarning,
    close_daytona,
)
from poolkeeper_daytona._guard import _reset_for_tests


def _declared_range() -> tuple[str, str]:
    """Return (lower, upper) of the installed adapter's daytona range."""
    requires = importlib.metadata.requires("poolkeeper-daytona") or []
    for line in requires:
        match = re.fullmatch(r"daytona\s*(.*)", line.split(";")[0].strip())
        if match:
            bounds = dict(
                re.findall(r"(>=|<)\s*([\d.]+)", match.group(1).strip())
            )
            return bounds[">="], bounds["<"]
    pytest.fail(f"no daytona requirement in {requires}")


def _release(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


class TestDeclaredRange:
    """pyproject, TESTED_SDK_VERSIONS and the installed SDK agree."""

    def test_lower_bound_is_the_oldest_tested_release(self):
        """The range starts at the oldest release in the tested list."""
        lower, _ = _declared_range()

        assert _release(lower) == _release(min(TESTED_SDK_VERSIONS))[:2]

    def test_every_tested_release_is_inside_the_range(self):
        """No tested release is excluded by the declared range."""
        lower, upper = _declared_range()

        outside = [
            v
            for v in TESTED_SDK_VERSIONS
            if not _release(lower) <= _release(v) < _release(upper)
        ]
        assert [] == outside

    def test_the_installed_sdk_is_a_tested_release(self):
        """CI runs the suite only on releases in TESTED_SDK_VERSIONS."""
        installed = importlib.metadata.version("daytona")

        assert installed in TESTED_SDK_VERSIONS


class TestWarningText:
    """The guard's warning names the installed and the tested releases."""

    def test_warning_names_versions(self, recwarn):
        """The message has the installed version and each tested one."""
        _reset_for_tests()
        try:
            close_daytona(object.__new__(daytona.Daytona))
        finally:
            _reset_for_tests()

        message = str(recwarn.list[0].message)
        assert issubclass(recwarn.list[0].category, DaytonaInternalsWarning)
        assert importlib.metadata.version("daytona") in message
        assert all(v in message for v in TESTED_SDK_VERSIONS), message
