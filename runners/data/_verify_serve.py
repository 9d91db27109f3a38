"""math-verify comparison server, run as ``python -c <this file's text>`` by ``verify_worker.py``.

Protocol: one JSON request per stdin line, one JSON reply per stdout line. A request is
``{"gold": str, "answer": str}`` (reply ``{"equal": bool}``) or ``{"sleep": seconds}`` (used by the
tests to exercise the parent's timeout). Timeouts are the parent's job: math-verify's own
signal-based timeout is disabled here. Self-contained on purpose (needs only math-verify), so it
runs whatever the parent's ``__main__`` is.
"""

import json
import logging
import sys
import time

from math_verify import LatexExtractionConfig, parse, verify

logging.getLogger("math_verify").setLevel(logging.ERROR)
CONFIG = [LatexExtractionConfig(boxed_match_priority=0)]


def compare(gold, answer):
    g = parse("\\boxed{" + gold + "}", extraction_config=CONFIG, parsing_timeout=None)
    a = parse("\\boxed{" + answer + "}", extraction_config=CONFIG, parsing_timeout=None)
    return bool(g) and bool(a) and bool(verify(g, a, timeout_seconds=None))


for line in sys.stdin:
    request = json.loads(line)
    if "sleep" in request:
        time.sleep(request["sleep"])
        reply = {"slept": True}
    else:
        try:
            reply = {"equal": compare(request["gold"], request["answer"])}
        except Exception as exc:  # a parse/verify failure is a non-match, not a dead worker
            reply = {"equal": False, "error": type(exc).__name__}
    sys.stdout.write(json.dumps(reply) + "\n")
    sys.stdout.flush()
