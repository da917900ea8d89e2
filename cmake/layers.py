#!/usr/bin/env python3
"""The layers of csrc/ and the one rule between them.

Each top-level folder of csrc/ is a layer. A layer's files may include
their own layer's headers and those of the layers it is built on (LAYERS
below, in order: each layer may use every layer listed before it, except
the two tops, tf and python, which may not use each other). An include of
any other layer's header ("upward") is an error.

The build runs this script (CMakeLists.txt: target tfring_layers, which
every layer's target depends on, so nothing compiles while an upward
include exists) and asks it for each layer's dependencies
(--cmake-deps); tests/core/test_layers.py runs the same check. The rule lives
here only.

An include is classified by the file it resolves to: first next to the
including file (as the compiler looks for "..." includes), then from the
csrc/ root. "../x.h" cannot escape the check that way. An include that
resolves to nothing in csrc/ and whose first component is not a layer
(TensorFlow's, XLA's) is outside the rule.

Usage:
  layers.py [--root CSRC] [--stamp FILE]   check; on success touch FILE
  layers.py --cmake-deps                   "layer:dep,dep" lines for CMake
"""

import argparse
import os
import re
import sys

# Bottom to top, each with the layers below it that it builds on.
LAYERS = [
    ("common", []),
    ("rendezvous", ["common"]),
    ("kernels", ["common"]),
    ("transport", ["common", "rendezvous", "kernels"]),
    ("collectives", ["common", "rendezvous", "kernels", "transport"]),
    ("gpu", ["common", "rendezvous", "kernels", "transport", "collectives"]),
    ("runtime", ["common", "rendezvous", "kernels", "transport", "collectives", "gpu"]),
    ("tf", ["common", "rendezvous", "kernels", "transport", "collectives", "gpu", "runtime"]),
    ("python", ["common", "rendezvous", "kernels", "transport", "collectives", "gpu", "runtime"]),
]
ALLOWED = {name: set(deps) | {name} for name, deps in LAYERS}

SOURCE_EXT = (".h", ".hpp", ".cc", ".cpp", ".cu", ".cuh", ".inc")
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
DEFAULT_ROOT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")


def layer_of(root, path):
    """The layer (top-level folder under `root`) holding `path`, or None."""
    rel = os.path.relpath(os.path.realpath(path), os.path.realpath(root))
    if rel.startswith(".."):
        return None
    return rel.split(os.sep)[0]


def included_layer(root, src, inc):
    """The layer whose header `#include "inc"` in `src` names, or None."""
    for base in (os.path.dirname(src), root):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(cand):
            return layer_of(root, cand) or "<outside csrc>"
    first = inc.split("/")[0]
    if first in ALLOWED:
        return first
    if first == "..":
        return "<outside csrc>"
    return None


def violations(root=DEFAULT_ROOT):
    """Every broken rule in `root`, as "file:line: message" strings."""
    out = []
    for entry in sorted(os.listdir(root)):
        if os.path.isdir(os.path.join(root, entry)) and entry not in ALLOWED:
            out.append("%s: folder in no layer (add it to LAYERS in %s)"
                       % (os.path.join(root, entry), os.path.abspath(__file__)))
    for layer in sorted(ALLOWED):
        top = os.path.join(root, layer)
        for dirpath, _, files in os.walk(top):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                src = os.path.join(dirpath, name)
                with open(src, errors="replace") as f:
                    for lineno, line in enumerate(f, 1):
                        m = _INCLUDE.match(line)
                        if not m:
                            continue
                        target = included_layer(root, src, m.group(1))
                        if target is None or target in ALLOWED[layer]:
                            continue
                        out.append(
                            '%s:%d: #include "%s": layer %s may include only %s, not %s'
                            % (src, lineno, m.group(1), layer,
                               ", ".join(n for n, _ in LAYERS if n in ALLOWED[layer]),
                               target))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=DEFAULT_ROOT, help="the csrc/ folder")
    ap.add_argument("--stamp", help="touched when the check passes")
    ap.add_argument("--cmake-deps", action="store_true",
                    help="print each layer's dependencies for CMake")
    args = ap.parse_args(argv)
    if args.cmake_deps:
        for name, deps in LAYERS:
            print("%s:%s" % (name, ",".join(deps)))
        return 0
    bad = violations(args.root)
    if bad:
        for b in bad:
            print(b, file=sys.stderr)
        print("tfring: %d include(s) break the layer order (cmake/layers.py)" % len(bad),
              file=sys.stderr)
        if args.stamp and os.path.exists(args.stamp):
            os.remove(args.stamp)
        return 1
    if args.stamp:
        with open(args.stamp, "w") as f:
            f.write("ok\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
