"""The README's picture of a report: its link resolves to a PNG in the repository (not git-ignored, small,
about 1000 px wide), and ``docs/gen_readme_image.py`` (``make readme-image``) draws the first page of a
PDF: checked, as rendered and reduced to 256 colours, on a two-page PDF drawn here with reportlab (page 1: the left half black; page 2: all
black), read back pixel by pixel with Pillow. Without a report it exits 2 with one line naming
``make demo`` and writes nothing.
"""

from __future__ import annotations

import re
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "docs" / "gen_readme_image.py"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG's signature and IHDR chunk."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def test_readme_picture_is_a_png_in_the_repository():
    readme = (ROOT / "README.md").read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)\s]+)\)", readme)
    assert links, "README.md has no picture"
    for link in links:
        path = ROOT / link
        assert path.is_file(), link
        width, height = _png_size(path)
        assert 900 <= width <= 1100 and 0.5 * width < height < 1.6 * width, (width, height)  # a page, ~1000 px wide
        assert path.stat().st_size < 300 * 1024, path.stat().st_size
        ignored = subprocess.run(["git", "check-ignore", "-q", str(path)], cwd=ROOT)
        assert ignored.returncode == 1, f"{link} is git-ignored: it would not be committed"
    assert readme.index(links[0]) < readme.index("## Daily commands"), "the picture is not near the top"
    first_block = readme.split("```bash\n", 1)[1].splitlines()
    assert first_block[0].startswith("make demo") and first_block[1].startswith("make test"), first_block[:2]
    assert readme.index("```bash") < readme.index(links[0]), "the set-up commands are no longer first"


def _two_page_pdf(path: Path) -> None:
    from reportlab.lib.pagesizes import A4
    from reportlab.pdfgen import canvas

    w, h = A4
    c = canvas.Canvas(str(path), pagesize=A4)
    c.rect(0, 0, w / 2, h, stroke=0, fill=1)  # page 1: left half black
    c.showPage()
    c.rect(0, 0, w, h, stroke=0, fill=1)  # page 2: all black
    c.showPage()
    c.save()


@pytest.mark.parametrize("max_kb", [300, 0], ids=["as rendered", "reduced to 256 colours"])
def test_script_draws_the_first_page(tmp_path, max_kb):
    if shutil.which("pdftoppm") is None:
        pytest.skip("pdftoppm not installed (apt-get install poppler-utils)")
    from PIL import Image

    pdf, out = tmp_path / "report.pdf", tmp_path / "images" / "page.png"
    _two_page_pdf(pdf)
    cmd = [sys.executable, str(SCRIPT), "--pdf", str(pdf), "--out", str(out), "--width", "200", "--max-kb", str(max_kb)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    width, height = _png_size(out)
    assert width == 200 and abs(height - 200 * 842 / 595) <= 1, (width, height)  # A4's proportions
    with Image.open(out) as image:
        gray = image.convert("L")
        left = [gray.getpixel((x, y)) for x in (5, 50, 95) for y in (10, height // 2, height - 10)]
        right = [gray.getpixel((x, y)) for x in (105, 150, 195) for y in (10, height // 2, height - 10)]
    assert max(left) < 30 and min(right) > 225, (left, right)  # page 1, not page 2 (all black)


def test_script_without_a_report_says_make_demo(tmp_path):
    out = tmp_path / "page.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(out)],
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "TRUSTBENCH_HOME": str(tmp_path / "home")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "run `make demo` first" in done.stderr, done.stderr
    assert str(tmp_path / "home" / "reports" / "demo" / "report.pdf") in done.stderr
    assert not out.exists()
