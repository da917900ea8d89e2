"""Summarizes the per-rank junit files of run_horovod_tests.sh: rank 0's
counts and failures, and the tests whose outcome differs between ranks."""

import sys
import xml.etree.ElementTree as ET


def outcomes(path):
    result = {}
    for case in ET.parse(path).iter("testcase"):
        name = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        kind, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                kind = {"error": "failed", "failure": "failed"}.get(child.tag, child.tag)
                message = (child.get("message") or "").splitlines()[0:1]
                message = message[0][:160] if message else ""
        result[name] = (kind, message)
    return result


def main(paths):
    ranks = [outcomes(p) for p in sorted(paths)]
    if not ranks:
        print("no junit results")
        return 1
    first = ranks[0]
    counts = {}
    for kind, _ in first.values():
        counts[kind] = counts.get(kind, 0) + 1
    print("rank 0:", ", ".join(f"{k} {v}" for k, v in sorted(counts.items())),
          f"(of {len(first)})")
    for name, (kind, message) in sorted(first.items()):
        if kind == "failed":
            print(f"FAILED {name}: {message}")
    for r, other in enumerate(ranks[1:], 1):
        for name in sorted(set(first) | set(other)):
            a, b = first.get(name, ("missing", ""))[0], other.get(name, ("missing", ""))[0]
            if a != b:
                print(f"rank {r} differs: {name}: rank 0 {a}, rank {r} {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
