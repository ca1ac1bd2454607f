"""The local stack's settings: how many instances the function host runs."""

from __future__ import annotations

import pytest

from stack import local
from stack.settings import Settings


def test_the_function_host_runs_more_than_one_worker_by_default() -> None:
    argv = local.host_spec(Settings(), "null").argv
    assert argv[argv.index("--workers") + 1] == "2"


def test_the_worker_count_comes_from_the_environment() -> None:
    settings = Settings.from_env({"STASIS_FUNCTION_WORKERS": "3"})
    argv = local.host_spec(settings, "local").argv
    assert settings.function_workers == 3 and argv[argv.index("--workers") + 1] == "3"


@pytest.mark.parametrize(("raw", "message"), [
    ("two", "STASIS_FUNCTION_WORKERS must be a whole number, got 'two'"),
    ("0", "the function host needs at least 1 worker (STASIS_FUNCTION_WORKERS), got 0"),
])
def test_a_bad_worker_count_is_a_clear_error(raw: str, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        Settings.from_env({"STASIS_FUNCTION_WORKERS": raw})
