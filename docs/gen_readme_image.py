"""Draw the README's picture of a report: the first page of the demo's PDF report as a PNG.

    make demo && make readme-image                                  # docs/images/report.png
    python docs/gen_readme_image.py --pdf path/to/report.pdf --out /tmp/page.png --width 600

The page is rendered by poppler's ``pdftoppm`` (``apt-get install poppler-utils``; CI installs it) at
``--width`` pixels, then reduced to 256 colours when the PNG would exceed ``--max-kb``. Without a
report (no ``make demo`` yet) or without ``pdftoppm`` it exits with status 2 and one line saying
what to do, writing nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "images" / "report.png"


def demo_pdf() -> Path:
    """The demo's report under the trustbench home (``runners.paths.report_dir('demo')``)."""
    home = Path(os.environ.get("TRUSTBENCH_HOME", Path.cwd() / ".trustbench"))
    return home / "reports" / "demo" / "report.pdf"


def render(pdf: Path, out: Path, width: int, max_kb: int) -> Path:
    """The first page of ``pdf`` as a PNG ``width`` pixels wide at ``out``."""
    with tempfile.TemporaryDirectory() as tmp:
        prefix = Path(tmp) / "page"
        cmd = ["pdftoppm", "-png", "-f", "1", "-l", "1", "-singlefile", "-scale-to-x", str(width), "-scale-to-y", "-1"]
        subprocess.run([*cmd, str(pdf), str(prefix)], check=True, capture_output=True, timeout=120)
        png = prefix.with_suffix(".png")
        if png.stat().st_size > max_kb * 1024:
            from PIL import Image

            with Image.open(png) as image:
                image.convert("RGB").quantize(colors=256).save(png, optimize=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pdf", type=Path, default=None, help="the report (default: the demo's, after `make demo`)")
    parser.add_argument("--out", type=Path, default=OUT, help="the PNG (default: docs/images/report.png)")
    parser.add_argument("--width", type=int, default=1000, help="width in pixels")
    parser.add_argument("--max-kb", type=int, default=300, help="reduce to 256 colours above this size")
    args = parser.parse_args(argv)
    pdf = args.pdf or demo_pdf()
    if not pdf.is_file():
        hint = "run `make demo` first" if args.pdf is None else "no such file"
        print(f"{pdf}: no report ({hint})", file=sys.stderr)
        return 2
    if shutil.which("pdftoppm") is None:
        print("pdftoppm not installed (apt-get install poppler-utils)", file=sys.stderr)
        return 2
    out = render(pdf, args.out, args.width, args.max_kb)
    print(f"{out}: first page of {pdf}, {out.stat().st_size // 1024} KB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
