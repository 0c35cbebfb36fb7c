"""`edge-export` run in this process, for the tests of its refusals."""

from __future__ import annotations

import pytest

from exporters.cli import main


def fails_with(capsys: pytest.CaptureFixture[str], argv: list[str], *needles: str) -> str:
    """`edge-export argv` exits 2 with one `edge-export` line naming every needle; that line."""
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.startswith("edge-export")]
    assert len(lines) == 1, err
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]
