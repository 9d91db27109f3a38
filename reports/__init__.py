"""trustbench reports: an experiment's registered tables and figures -> report.html (self-contained)
and report.pdf (headless Chromium, else a reportlab rendering), also logged to MLflow.

    trustbench report troll_table1
    from reports.build import build_report

``registry`` maps experiments (sweep names) to items; ``build`` renders ``templates/``;
``chromium`` prints the PDF (``pdf``: the reportlab fallback); ``cli`` adds the ``report`` and ``bounds`` subcommands.
"""
