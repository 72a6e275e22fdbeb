"""checks.py - the check lines the server's Python tests print: one line per
check ("  ok WHAT" or "FAIL WHAT: GOT"), then "N passed, N failed" and the
exit status (1 on any failure). Imported by load.py and openai_client.py,
which run from this folder's scripts (their folder is on sys.path).
"""
import sys

_counts = {"passed": 0, "failed": 0}


def check(ok, what, got=None):
    """Counts and prints one check; got (when given) is shown on failure."""
    if ok:
        _counts["passed"] += 1
        print(f"  ok {what}")
    else:
        _counts["failed"] += 1
        print(f"FAIL {what}" + (f": {got!r}"[:400] if got is not None else ""))


def finish():
    """Prints "N passed, N failed" and exits, 1 when anything failed."""
    print(f"{_counts['passed']} passed, {_counts['failed']} failed")
    sys.exit(1 if _counts["failed"] else 0)
