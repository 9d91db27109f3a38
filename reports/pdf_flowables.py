"""A reportlab flowable for the report's PDF (``reports.pdf``): a long table that keeps its caption and
notes with its last rows.

reportlab splits a long ``Table`` over pages under its repeated header, but the paragraphs that follow it
are separate flowables and may land alone at the top of the next page. ``Captioned`` lays the table and the
paragraphs out as one flowable and, where it splits, shortens the first part so that the rows that end the
table come along with the caption.
"""

from __future__ import annotations

from reportlab.platypus import Flowable, Table


class Captioned(Flowable):
    """A long table with its caption and notes: where it splits over pages, the rows that end it come
    along with the caption rather than leave it alone at the top of a page."""

    def __init__(self, table: Table, under: list) -> None:
        super().__init__()
        self.table, self.under = table, under

    def _parts(self, aW: float, aH: float) -> list[tuple[Flowable, float, float]]:
        """(flowable, space above, height) of the table and of each paragraph under it."""
        out = [(self.table, 0.0, self.table.wrap(aW, aH)[1])]
        return out + [(f, f.getSpaceBefore(), f.wrap(aW, aH)[1]) for f in self.under]

    def wrap(self, aW: float, aH: float) -> tuple[float, float]:
        self.width, self.height = aW, sum(space + h for _, space, h in self._parts(aW, aH))
        return self.width, self.height

    def draw(self) -> None:
        y = self.height
        for f, space, h in self._parts(self.width, self.height):
            y -= space + h
            f.drawOn(self.canv, 0, y)

    def split(self, aW: float, aH: float) -> list:
        below = sum(space + h for _, space, h in self._parts(aW, aH)[1:])
        parts = self.table.split(aW, aH - below)
        return [parts[0], Captioned(parts[1], self.under)] if len(parts) == 2 else []
