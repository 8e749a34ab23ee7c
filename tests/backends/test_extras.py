"""A backend whose client library (an extra of the package) is not installed says so with the same
error class everywhere: a SpecError (the setup's to fix, exit 2) whose hint names the extra to
install. The runtime records an attempt that meets one as refused, never retried as the machine's
fault (runtime._start)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import pytest

from autoresearch.errors import SpecError


def _databricks() -> Any:
    from autoresearch.backends.databricks import _sdk

    return _sdk()


def _kubernetes() -> Any:
    from autoresearch.backends._k8s_api import _lightkube

    return _lightkube()


@pytest.mark.parametrize(("load", "module", "package", "extra"), [
    (_databricks, "databricks.sdk.service", "databricks-sdk", "autoresearch[databricks]"),
    (_kubernetes, "lightkube", "lightkube", "autoresearch[kubernetes]"),
])
def test_a_missing_extra_is_a_spec_error_naming_what_to_install(
        load: Callable[[], Any], module: str, package: str, extra: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # import MODULE -> ImportError, as if not installed
    with pytest.raises(SpecError) as err:
        load()
    assert type(err.value) is SpecError and err.value.exit_code == 2
    assert package in err.value.message and "not installed" in err.value.message
    assert extra in err.value.hint and "pip install" in err.value.hint
