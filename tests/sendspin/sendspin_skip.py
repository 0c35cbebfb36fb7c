"""Skips a Sendspin test module, with the reason, where Sendspin cannot run (call before importing
aiosendspin): it needs Python 3.12+ with aiosendspin and, for the in-process server, PyAV."""

from __future__ import annotations

import sys

import pytest


def require_sendspin() -> None:
    if sys.version_info < (3, 12):
        pytest.skip(f"Sendspin needs Python 3.12 or later (this is {sys.version_info.major}."
                    f"{sys.version_info.minor}); scripts/test runs these tests in its Python 3.13 venv",
                    allow_module_level=True)
    pytest.importorskip("aiosendspin", reason="aiosendspin is not installed (pip install '.[sendspin]')")
    pytest.importorskip("av", reason="the in-process Sendspin server needs PyAV (pip install "
                                     "'.[sendspin]' on Python 3.12+ brings aiosendspin[server])")
