"""``SkipItem``: raised by a table or figure builder when the runs lack what it needs.

The report shows the reason in place of the item (e.g. "no run logs trm/accept_rate"), so a
missing metric is visible to the reader instead of silently dropping a section.
"""

from __future__ import annotations


class SkipItem(Exception):
    """The item cannot be built from these runs; ``str(exc)`` says why."""
