"""The SDK range the adapter declares is the range its CI tests."""

from __future__ import annotations

import importlib.metadata
import re
import warnings

import daytona
import pytest

from poolkeeper_daytona import (
    SUPPORTED_SDK_RANGE,
    TESTED_SDK_VERSIONS,
    DaytonaInternalsWarning,
    DaytonaVersionWarning,
    _sdk,
    close_daytona,
)
from poolkeeper_daytona._guard import _reset_for_tests
from poolkeeper_daytona._sdk import in_supported_range


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


class TestSupportedRange:
    """The extra's range is the runtime check's; outside it, one warning."""

    def test_extra_is_the_supported_range(self):
        """The sdk extra declares exactly SUPPORTED_SDK_RANGE."""
        lower, upper = _declared_range()

        assert (f">={lower}", f"<{upper}") == SUPPORTED_SDK_RANGE

    def test_the_sdk_is_not_a_dependency(self):
        """daytona is only in the sdk extra: no resolver conflict."""
        requires = importlib.metadata.requires("poolkeeper-daytona") or []
        sdk = [r for r in requires if r.startswith("daytona")]

        assert sdk, requires
        assert all(re.search(r"extra\s*==\s*['\"]sdk['\"]", r) for r in sdk), (
            sdk
        )

    @pytest.mark.parametrize(
        ("version", "inside"),
        [
            ("0.203.0", True),
            ("0.226.1", True),
            ("0.226.9", True),
            ("0.202.0", False),
            ("0.227.0", False),
            ("0.227.0rc1", False),
            ("1.0", False),
        ],
    )
    def test_in_supported_range(self, version, inside):
        """Release numbers compare as numbers, pre-releases by release."""
        assert inside == in_supported_range(version)

    def test_untested_release_warns_once(self, monkeypatch):
        """A release outside the range warns at the first build only."""
        monkeypatch.setattr(_sdk, "sdk_version", lambda: "0.300.0")
        _sdk._reset_for_tests()
        try:
            with pytest.warns(DaytonaVersionWarning, match=r"0\.300\.0"):
                _sdk.require_sdk("daytona_client")
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                _sdk.require_sdk("daytona_client")
        finally:
            _sdk._reset_for_tests()

    def test_tested_release_does_not_warn(self):
        """The installed (tested) release builds without a warning."""
        _sdk._reset_for_tests()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                _sdk.require_sdk("daytona_client")
        finally:
            _sdk._reset_for_tests()
