"""docs/errors.md holds every error code the service gives (ERROR_CLASSES, the engines'
included, and every `state::update` op code), each under a heading of its own, and nothing
else; an op error's `doc_url` is that heading's anchor under an absolute base."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import stateworker  # noqa: F401  (registers the engines' error classes)
from stateworker.error_codes import ERRORS_DOC_URL, anchor, doc_url
from stateworker.errors import ERROR_CLASSES, ConfigError
from stateworker.settings import Settings
from stateworker.state.kv.ops import OP_CODES

DOC = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def headings() -> list[str]:
    return re.findall(r"^### `([^`]+)`$", DOC.read_text(), re.MULTILINE)


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation but `-` and `_` dropped,
    spaces as `-`."""
    return re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")


def test_every_code_has_its_section_and_every_section_a_code() -> None:
    found = headings()
    assert len(found) == len(set(found)), "a code with two sections"
    codes = set(ERROR_CLASSES) | set(OP_CODES)
    assert set(found) - codes == set(), "sections of no code"
    assert codes - set(found) == set(), "codes without a section"


def test_a_doc_url_is_its_codes_heading_anchor_under_an_absolute_base() -> None:
    assert re.fullmatch(r"https://\S+/docs/errors\.md", ERRORS_DOC_URL)
    slugs = [github_slug(f"`{code}`") for code in headings()]
    assert len(slugs) == len(set(slugs)), "two codes with one anchor"
    for code, slug in zip(headings(), slugs, strict=True):
        assert anchor(code) == slug
        assert doc_url(code) == f"{ERRORS_DOC_URL}#{slug}"
    assert doc_url("increment.not_number") == f"{ERRORS_DOC_URL}#incrementnot_number"
    assert doc_url("merge.value.too_deep", "https://docs.example/errors.md") == \
        "https://docs.example/errors.md#mergevaluetoo_deep"


def test_the_docs_url_setting_must_be_absolute() -> None:
    assert Settings().docs_url == ERRORS_DOC_URL
    assert Settings.from_env({"STATEWORKER_DOCS_URL": "https://docs.example/errors.md"}
                             ).docs_url == "https://docs.example/errors.md"
    for bad in ("docs/errors.md", "https://docs.example/errors.md#x", "ftp://x/errors.md"):
        with pytest.raises(ConfigError) as refused:
            Settings(docs_url=bad)
        assert "STATEWORKER_DOCS_URL" in str(refused.value) and f'"{bad}"' in str(refused.value)
