"""One state directory per user, whatever the current directory: `StateStore.open()` from
anywhere finds the data the last open left (before, a relative default made a second, empty
store in each directory)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from stateworker import StateStore
from stateworker.app.cli import status_report
from stateworker.settings import Settings

pytestmark = pytest.mark.anyio


def test_the_default_is_the_per_user_data_directory(tmp_path: Path) -> None:
    assert Settings.from_env({"XDG_DATA_HOME": str(tmp_path)}).state_dir == \
        str(tmp_path / "stateworker")
    home = os.path.expanduser("~")
    assert Settings.from_env({}).state_dir == os.path.join(home, ".local", "share",
                                                           "stateworker")
    explicit = Settings.from_env({"STATEWORKER_STATE_DIR": "some/dir"})
    assert explicit.state_dir == os.path.abspath("some/dir")  # made absolute once


async def test_every_directory_opens_the_same_store(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.delenv("STATEWORKER_STATE_DIR", raising=False)
    monkeypatch.delenv("STATEWORKER_REDIS_URL", raising=False)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    monkeypatch.chdir(first)
    async with StateStore.open() as store:
        await store.set("s", "k", "written from a")
    monkeypatch.chdir(second)
    async with StateStore.open() as store:
        assert await store.get("s", "k") == "written from a"
        assert store.settings.state_dir == str(tmp_path / "data" / "stateworker")
        report = await status_report(Settings.from_env())  # what `stateworker status` prints
        assert report["reachable"] is True
        assert report["state_dir"] == str(tmp_path / "data" / "stateworker")
    assert not (first / "var").exists() and not (second / "var").exists()
