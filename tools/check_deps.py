#!/usr/bin/env python3
"""check_deps.py - proves the layer rules of kvtop (`make check-deps`).

Layers, bottom up: base <- kernels <- engine <- profiles <- front ends (cli,
tui, server). A layer may use only itself and the layers below it; the front
ends do not use each other, except that the dispatcher (cli/main.c, outside
libkvcli.a) names the other front ends' entry points through their one
entry header (tui/tui.h, server/server.h), which includes no library header.

Two kinds of proof:
  includes  every `#include "..."` of every source file, resolved against the
            file's folder, lands in an allowed layer; system headers of the
            front-end libraries (curses, readline, yaml, libmicrohttpd, libcurl, libzmq) and
            the CUDA runtime appear only where allowed.
  links     (with --build) every layer's library, linked whole
            (--whole-archive) with only the system libraries that layer may
            use, leaves nothing undefined; and no object of a layer uses a
            symbol defined only in a layer it may not use (nm).

Usage: check_deps.py --src ROOT [--build DIR] [--cc CC] [--cuda-libs "..."]
Prints one line per violation and exits 1 when there is any; otherwise one
summary line per proof and exits 0.
"""
import argparse
import os
import re
import shlex
import subprocess
import sys
import tempfile

# Which layers each layer may include from / link against (itself implied).
LOWER = {
    "base": [],
    "kernels": ["base"],
    "engine": ["kernels", "base"],
    "profiles": ["engine", "kernels", "base"],
    "cli": ["profiles", "engine", "kernels", "base"],
    "tui": ["profiles", "engine", "kernels", "base"],
    "server": ["profiles", "engine", "kernels", "base"],
}
ORDER = ["base", "kernels", "engine", "profiles", "cli", "tui", "server"]
# Entry headers a front end may include from another front end (prototypes
# of its cmd_* functions only).
ENTRY_HEADERS = {"tui/tui.h", "server/server.h"}
# Headers of kernels/ that no layer above may include: the CPU backend's
# private state and ISA plumbing. The sim backend's header is the engine's
# to avoid too: the engine reaches the sim clock through the backend table.
KERNELS_PRIVATE = re.compile(r"^kernels/(cpu_internal\.h|cpu_isa\.h|[a-z_]+_isa\.h|quant_ext_simd\.h|cuda/.*)$")
NOT_IN = {"kernels/sim.h": {"engine", "profiles"}}
# System headers by library, and the layers allowed to include them.
SYSTEM = [
    (re.compile(r"^(n?curses|ncursesw/|panel\.h|term\.h)"), "curses", {"tui"}),
    (re.compile(r"^readline/"), "readline", {"cli", "tui"}),
    (re.compile(r"^yaml\.h"), "libyaml", {"profiles"}),
    (re.compile(r"^microhttpd\.h"), "libmicrohttpd", {"server"}),
    (re.compile(r"^curl/"), "libcurl", {"tui"}),
    (re.compile(r"^zmq\.h"), "libzmq", {"tui"}),
    (re.compile(r"^(cuda|cublas|curand|nvrtc)"), "the CUDA runtime", {"kernels/cuda"}),
]
# System libraries each layer's whole library may need at link time.
LINK_LIBS = {
    "kernels": ["-lm", "-lpthread"],
    "engine": ["-lm", "-lpthread"],
    "profiles": ["-lyaml", "-lm", "-lpthread"],
    "cli": ["-lreadline", "-lyaml", "-lm", "-lpthread"],
    "server": ["-lmicrohttpd", "-lyaml", "-lm", "-lpthread"],
}
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')
SOURCE_EXT = (".c", ".h", ".cu", ".cuh")


def layer_of(rel):
    top = rel.split("/", 1)[0]
    return top if top in LOWER else None


def check_includes(src):
    bad, n_files, n_inc = [], 0, 0
    for layer in ORDER:
        root = os.path.join(src, layer)
        if not os.path.isdir(root):
            continue
        for dirpath, _, files in os.walk(root):
            for name in sorted(files):
                if not name.endswith(SOURCE_EXT):
                    continue
                path = os.path.join(dirpath, name)
                rel = os.path.relpath(path, src)
                n_files += 1
                with open(path, encoding="utf-8", errors="replace") as f:
                    lines = f.readlines()
                for ln, line in enumerate(lines, 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    n_inc += 1
                    kind, target = m.group(1), m.group(2)
                    where = f"{rel}:{ln}"
                    if kind == "<":
                        for pat, lib, allowed in SYSTEM:
                            if pat.match(target) and not any(
                                    rel == a or rel.startswith(a + "/") for a in allowed):
                                bad.append(f"{where}: {layer}/ includes <{target}> ({lib} belongs to "
                                           f"{', '.join(sorted(allowed))}/ only)")
                        continue
                    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
                    if resolved.startswith(".."):
                        bad.append(f'{where}: includes "{target}" from outside the tree')
                        continue
                    to = layer_of(resolved)
                    if to is None or to == layer:
                        continue
                    if to == "kernels" and layer != "kernels" and KERNELS_PRIVATE.match(resolved):
                        bad.append(f'{where}: {layer}/ includes "{target}", private to kernels/')
                        continue
                    if layer in NOT_IN.get(resolved, ()):
                        bad.append(f'{where}: {layer}/ includes "{target}" (it reaches that backend '
                                   f"through the backend table)")
                        continue
                    if to in LOWER[layer]:
                        continue
                    if layer in ("cli", "tui", "server") and resolved in ENTRY_HEADERS:
                        continue
                    bad.append(f'{where}: {layer}/ includes "{target}" from {to}/ '
                               f"({layer}/ may use {', '.join(LOWER[layer]) or 'nothing of the project'})")
    return bad, f"includes: {n_files} files, {n_inc} includes, every one within its layer's rules"


def nm_symbols(archive):
    """(defined, undefined-by-object) of an archive's global symbols."""
    out = subprocess.run(["nm", "-A", "-g", archive], capture_output=True, text=True, check=True).stdout
    defined, undef = set(), {}
    for line in out.splitlines():
        # archive:object: [value] type name
        parts = line.rsplit(":", 1)
        if len(parts) != 2:
            continue
        obj = parts[0].split(":")[-1]
        fields = parts[1].split()
        if len(fields) == 2:
            t, sym = fields
        elif len(fields) == 3:
            t, sym = fields[1], fields[2]
        else:
            continue
        if t == "U":
            undef.setdefault(obj, set()).add(sym)
        elif t not in "wv":
            defined.add(sym)
    return defined, undef


def check_links(build, cc, cuda_libs):
    libs = {l: os.path.join(build, f"libkv{'profile' if l == 'profiles' else l}.a") for l in ORDER}
    libs = {l: p for l, p in libs.items() if os.path.exists(p)}
    bad = []
    syms = {l: nm_symbols(p) for l, p in libs.items()}
    for layer, (_, undef) in syms.items():
        for obj, names in sorted(undef.items()):
            for sym in sorted(names):
                if sym in syms[layer][0]:
                    continue
                for other, (defs, _) in syms.items():
                    if other != layer and other not in LOWER[layer] and sym in defs:
                        bad.append(f"{layer}/ ({os.path.basename(libs[layer])}: {obj}) uses {sym}, "
                                   f"defined in {other}/")
    linked = []
    with tempfile.TemporaryDirectory() as tmp:
        stub = os.path.join(tmp, "stub.c")
        with open(stub, "w") as f:
            f.write("int main(void) { return 0; }\n")
        for layer, sys_libs in LINK_LIBS.items():
            if layer not in libs:
                continue
            chain = [libs[l] for l in [layer] + LOWER[layer] if l in libs]
            cmd = [*shlex.split(cc), "-o", os.path.join(tmp, "a.out"), stub, "-Wl,--whole-archive", *chain,
                   "-Wl,--no-whole-archive", *cuda_libs.split(), *sys_libs]
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                missing = sorted(set(re.findall(r"undefined reference to [`']([^']+)'", r.stderr)))
                what = ", ".join(missing[:6]) + (" …" if len(missing) > 6 else "") if missing else \
                    r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "link failed"
                bad.append(f"{layer}/ does not link with only {' '.join(sys_libs)} "
                           f"(and the layers below): {what}")
            else:
                linked.append(f"{layer} ({' '.join(sys_libs)})")
    return bad, "links: " + "; ".join(linked) + "; no layer uses a symbol of a layer above or beside it"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--src", required=True)
    ap.add_argument("--build")
    ap.add_argument("--cc", default=os.environ.get("CC", "cc"))
    ap.add_argument("--cuda-libs", default="")
    a = ap.parse_args()
    bad, summary = check_includes(a.src)
    summaries = [summary]
    if a.build:
        b2, s2 = check_links(a.build, a.cc, a.cuda_libs)
        bad += b2
        summaries.append(s2)
    for line in bad:
        print(f"check-deps: {line}")
    if bad:
        print(f"check-deps: {len(bad)} violation(s) of the layer rules")
        return 1
    for s in summaries:
        print(f"check-deps: {s}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
