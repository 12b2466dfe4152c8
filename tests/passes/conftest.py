"""The pass tests verify the IR after every pass (TKC_VERIFY_EACH=1), so that a pass's bad IR is named at once."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def verify_after_every_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TKC_VERIFY_EACH", "1")
