#!/usr/bin/env python3
"""tests/layers.py: the layering rules of ../shared/DESIGN.md ("Layers"),
checked on the sources and the built objects (run by tests/layers.test).

    layers.py SRCDIR BUILDDIR

A folder depends on another when one of its files (its public headers in
include/trainrun/ count as its files) includes the other's public header
(trainrun/<name>.h, owned by the folder whose local.mk installs it) or one of
its internal headers ("<folder>/..."), or when one of its objects uses a
symbol that an object of the other folder defines (nm). The rules:

  a. folders depend only on folders above them in LAYERS (so there is no
     cycle between folders);
  b. inside model/, collectives/, daemon/ and dtensor/, no cycle of files
     (a file depends on another when its object uses a symbol the other's
     defines);
  c. no file outside launcher/ includes the job-config header
     trainrun/config.h (core/ and tests/ excepted);
  d. fsdp2/ includes nothing of trainer/.

Every violation is printed with the files and symbols that make it; the
exit status is 1 when there is one, 0 when none, 77 when the objects are
not built.
"""
import os
import re
import subprocess
import sys

LAYERS = ["core", "store", "kernels", "collectives", "flight_recorder",
          "model", "dtensor", "fsdp2", "pipelining", "checkpoint", "trainer",
          "daemon", "launcher"]
NO_FILE_CYCLES = ["model", "collectives", "daemon", "dtensor"]
CONFIG_HEADER = "trainrun/config.h"
CONFIG_ALLOWED = {"launcher", "core", "tests"}
SRC_EXT = (".c", ".cc", ".cu", ".h", ".cuh")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def logical_lines(text):
    """A makefile's lines with backslash continuations joined."""
    out, cur = [], ""
    for line in text.split("\n"):
        if line.endswith("\\"):
            cur += line[:-1] + " "
        else:
            out.append(cur + line)
            cur = ""
    return out


def header_owners(src):
    """trainrun/<name>.h -> the folder whose local.mk installs it."""
    owners = {}
    for folder in LAYERS:
        for root, _dirs, files in os.walk(os.path.join(src, folder)):
            if "local.mk" not in files:
                continue
            with open(os.path.join(root, "local.mk")) as f:
                for line in logical_lines(f.read()):
                    if not line.startswith("trainruninclude_HEADERS"):
                        continue
                    for word in line.split():
                        if word.startswith("include/trainrun/"):
                            owners[word[len("include/"):]] = folder
    return owners


def source_files(src):
    """(folder, path relative to src) of every source and header of the
    layers, the public headers under the folder that owns them."""
    owners = header_owners(src)
    for folder in LAYERS:
        top = os.path.join(src, folder)
        for root, _dirs, files in os.walk(top):
            for name in sorted(files):
                if name.endswith(SRC_EXT):
                    path = os.path.relpath(os.path.join(root, name), src)
                    yield folder, path
    for hdr, folder in sorted(owners.items()):
        yield folder, os.path.join("include", hdr)


def includes(src):
    """[(folder, file, included name)] of the layers' quoted includes."""
    out = []
    for folder, path in source_files(src):
        with open(os.path.join(src, path), errors="replace") as f:
            for name in INCLUDE_RE.findall(f.read()):
                out.append((folder, path, name))
    return out


def include_target(name, owners):
    """The folder an included name belongs to, or None (system, config.h
    of autoconf)."""
    if name in owners:
        return owners[name]
    top = name.split("/", 1)[0]
    if "/" in name and top in LAYERS:
        return top
    return None


def objects(build, src):
    """{source path: object path} of the layers' objects (one per source:
    libtool's .libs copies and per-target copies fold into it)."""
    objs = {}
    for folder in LAYERS:
        top = os.path.join(build, folder)
        for root, dirs, files in os.walk(top):
            dirs[:] = [d for d in dirs if d != ".libs"]
            for name in sorted(files):
                if not name.endswith(".o"):
                    continue
                stem = name[:-2]
                rel = os.path.relpath(root, build)
                source = None
                # automake's per-target objects: <target>-<stem>.o
                for cand in [stem] + [stem.split("-", i)[-1]
                                      for i in range(1, stem.count("-") + 1)]:
                    for ext in (".c", ".cc", ".cu"):
                        p = os.path.join(rel, cand + ext)
                        if os.path.exists(os.path.join(src, p)):
                            source = p
                            break
                    if source:
                        break
                if source and source not in objs:
                    objs[source] = os.path.join(root, name)
    return objs


def symbols(obj):
    """(defined, undefined) global symbol sets of an object."""
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True,
                         text=True).stdout
    defined, undefined = set(), set()
    for line in out.split("\n"):
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind == "U":
            undefined.add(name)
        elif kind in "TDBRCVWGSI" and kind.isupper():
            defined.add(name)
    return defined, undefined


def sccs(nodes, edges):
    """Strongly connected components with more than one node (Tarjan)."""
    index, low, on, stack, out = {}, {}, set(), [], []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(nodes):
        if v not in index:
            visit(v)
    return out


def main():
    if len(sys.argv) != 3:
        print("usage: layers.py SRCDIR BUILDDIR", file=sys.stderr)
        return 2
    src, build = sys.argv[1], sys.argv[2]
    owners = header_owners(src)
    violations = []

    # ---- includes ----
    inc_edges = {}  # (from folder, to folder) -> ["file includes name"]
    for folder, path, name in includes(src):
        target = include_target(name, owners)
        if name == CONFIG_HEADER and folder not in CONFIG_ALLOWED:
            violations.append(
                "c. %s includes the job-config header %s (only launcher/ "
                "may; lower layers take options structs)" % (path, name))
        if target == "trainer" and folder == "fsdp2":
            violations.append("d. %s includes %s (fsdp2/ is below "
                              "trainer/)" % (path, name))
        if target and target != folder:
            inc_edges.setdefault((folder, target), []).append(
                "%s includes %s" % (path, name))

    # ---- symbols ----
    objs = objects(build, src)
    if not objs:
        print("layers: no objects under '%s': build first" % build)
        return 77
    defined_in = {}  # symbol -> source file
    uses = {}  # source file -> undefined symbols
    for source, obj in sorted(objs.items()):
        d, u = symbols(obj)
        for s in d:
            defined_in.setdefault(s, source)
        uses[source] = u
    sym_edges = {}  # (from folder, to folder) -> ["file uses sym (file)"]
    file_edges = {}  # folder -> {file: {file: [sym]}}
    for source, used in sorted(uses.items()):
        folder = source.split("/", 1)[0]
        for s in sorted(used):
            where = defined_in.get(s)
            if not where:
                continue
            tfolder = where.split("/", 1)[0]
            if tfolder != folder:
                sym_edges.setdefault((folder, tfolder), []).append(
                    "%s uses %s (%s)" % (source, s, where))
            elif where != source:
                file_edges.setdefault(folder, {}).setdefault(
                    source, {}).setdefault(where, []).append(s)

    # a. the folder order
    rank = {f: i for i, f in enumerate(LAYERS)}
    pairs = sorted(set(inc_edges) | set(sym_edges),
                   key=lambda p: (rank[p[0]], rank[p[1]]))
    for a, b in pairs:
        if rank[b] < rank[a]:
            continue
        why = inc_edges.get((a, b), []) + sym_edges.get((a, b), [])
        shown = why[:6]
        more = " (and %d more)" % (len(why) - 6) if len(why) > 6 else ""
        violations.append("a. %s/ depends on %s/, which is not above it in "
                          "DESIGN.md's layers: %s%s" %
                          (a, b, "; ".join(shown), more))
    folder_graph = {}
    for a, b in pairs:
        folder_graph.setdefault(a, set()).add(b)
    for comp in sccs(set(LAYERS), folder_graph):
        violations.append("a. cycle between folders: %s" %
                          " <-> ".join(c + "/" for c in comp))

    # b. file cycles inside the listed folders
    for folder in NO_FILE_CYCLES:
        g = file_edges.get(folder, {})
        edges = {f: set(t) for f, t in g.items()}
        nodes = set(edges) | {t for ts in edges.values() for t in ts}
        for comp in sccs(nodes, edges):
            inside = set(comp)
            links = []
            for f in comp:
                for t in sorted(edges.get(f, ())):
                    if t in inside:
                        syms = g[f][t]
                        links.append("%s -> %s (%s%s)" % (
                            f, t, ", ".join(syms[:3]),
                            ", ..." if len(syms) > 3 else ""))
            violations.append("b. file cycle in %s/: %s" %
                              (folder, "; ".join(links)))

    for v in violations:
        print("layers: " + v)
    if violations:
        print("layers: %d violation%s" % (len(violations),
                                          "" if len(violations) == 1 else "s"))
        return 1
    print("layers: %d folders, %d objects: no violation" %
          (len(LAYERS), len(objs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
