"""The README and docs/*.md link only to files (and headings) that exist, and the README links every page."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
PAGES = sorted((REPO / "docs").glob("*.md"))

_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^#{1,6}\s+(.+?)\s*#*\s*$", re.M)


def links(text: str) -> list[str]:
    """Link targets of a Markdown text, outside code blocks and code spans."""
    return _LINK.findall(_CODE.sub("", _FENCE.sub("", text)))


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown text (`## The broker` -> `the-broker`)."""
    found: set[str] = set()
    for title in _HEADING.findall(_FENCE.sub("", text)):
        slug = re.sub(r"[^\w\- ]", "", title.replace("`", "").lower()).replace(" ", "-")
        candidate, n = slug, 0
        while candidate in found:
            n += 1
            candidate = f"{slug}-{n}"
        found.add(candidate)
    return found


def broken_links(page: Path, root: Path = REPO) -> list[str]:
    """`page: target (why)` for each relative link of `page` that leads nowhere."""
    out = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:: not ours to check offline
            continue
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            out.append(f"{page.relative_to(root)}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text(encoding="utf-8")):
            out.append(f"{page.relative_to(root)}: {target} (no heading with that anchor)")
    return out


def test_relative_links_point_to_existing_files_and_headings():
    broken = [b for page in (README, *PAGES) for b in broken_links(page)]
    assert not broken, "dead links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page():
    linked = {(REPO / t.partition("#")[0]).resolve() for t in links(README.read_text(encoding="utf-8"))}
    unlinked = [p.relative_to(REPO).as_posix() for p in PAGES if p.resolve() not in linked]
    assert not unlinked, f"docs pages the README does not link: {', '.join(unlinked)}"


def test_the_link_check_finds_a_dead_file_and_a_dead_anchor(tmp_path):
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other\n\n## The `broker` here\n", encoding="utf-8")
    page.write_text(
        "[ok](other.md) [ok](other.md#the-broker-here) [ok](#title) [web](https://example.com/x)\n"
        "[gone](missing.md) [bad](other.md#nowhere) `[code](skipped.md)`\n"
        "# Title\n```\n[fenced](skipped.md)\n```\n",
        encoding="utf-8",
    )
    assert broken_links(page, root=tmp_path) == [
        "page.md: missing.md (no such file)",
        "page.md: other.md#nowhere (no heading with that anchor)",
    ]
