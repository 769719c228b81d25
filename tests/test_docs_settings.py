"""The manual's settings reference names every setting the package reads, and no other."""

from __future__ import annotations

import re
from pathlib import Path

from scrapy_retryafter.settings import KNOWN_SETTINGS, SETTING_NAMES

REFERENCE = Path(__file__).resolve().parents[1] / "docs" / "settings.rst"


def documented() -> dict[str, str]:
    """Setting name -> its section's text, from the ``.. setting:: NAME`` entries."""
    text = REFERENCE.read_text(encoding="utf-8")
    parts = re.split(r"^\.\. setting:: (\S+)\s*$", text, flags=re.M)
    return {name: body for name, body in zip(parts[1::2], parts[2::2])}


def test_every_setting_is_documented_and_none_is_stale():
    names = documented()
    missing = sorted(KNOWN_SETTINGS - set(names))
    stale = sorted(set(names) - KNOWN_SETTINGS)
    assert not missing, f"settings read by scrapy_retryafter/settings.py but not in docs/settings.rst: {missing}"
    assert not stale, f"settings in docs/settings.rst that scrapy_retryafter/settings.py does not read: {stale}"


def test_each_setting_is_documented_once():
    text = REFERENCE.read_text(encoding="utf-8")
    counts = {name: len(re.findall(rf"^\.\. setting:: {name}\s*$", text, flags=re.M)) for name in KNOWN_SETTINGS}
    assert {name: n for name, n in counts.items() if n != 1} == {}


def test_per_slot_keys_are_named_in_their_settings_section():
    names = documented()
    wrong = sorted(
        name for key, name in SETTING_NAMES.items()
        if name in names and f"Per slot: ``{key}``" not in " ".join(names[name].split())
    )
    assert not wrong, f"docs/settings.rst does not give the per-slot key (Per slot: ``key``) of: {wrong}"
