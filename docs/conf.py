"""Sphinx configuration for the scrapy-retryafter manual."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from scrapy_retryafter import __version__  # noqa: E402

project = "scrapy-retryafter"
author = "the scrapy-retryafter authors"
copyright = "2026, the scrapy-retryafter authors"
version = release = __version__

# No intersphinx: CI builds the manual without a network, so links to
# Scrapy's manual are plain URLs.
extensions = ["myst_parser"]
source_suffix = {".rst": "restructuredtext", ".md": "markdown"}
exclude_patterns = ["_build", "benchmark.md"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header"]

html_theme = "sphinx_rtd_theme"
html_static_path: list[str] = []
html_title = f"scrapy-retryafter {release}"


def setup(app: Any) -> None:
    # The same cross-reference types as Scrapy's own manual: ``.. setting::``
    # and :setting:, ``.. reqmeta::`` and :reqmeta:, ``.. signal::`` and :signal:.
    app.add_crossref_type(directivename="setting", rolename="setting", indextemplate="pair: %s; setting")
    app.add_crossref_type(directivename="reqmeta", rolename="reqmeta", indextemplate="pair: %s; reqmeta")
    app.add_crossref_type(directivename="signal", rolename="signal", indextemplate="pair: %s; signal")
    app.add_crossref_type(directivename="stat", rolename="stat", indextemplate="pair: %s; stat")
