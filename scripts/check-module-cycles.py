#!/usr/bin/env python3
"""Fails when two sibling modules of a crate import each other (directly).

A module's imports are the `crate::x` / `super::x` paths it names (in `use` items or in
code); `x` is resolved to the sibling module it belongs to. Parent and child modules are
not siblings: a parent declaring and re-exporting its children is no cycle.
Usage: scripts/check-module-cycles.py CRATE_SRC_DIR...
"""
import os
import re
import sys

PATH = re.compile(r"\b(crate|super)((?:::[A-Za-z_][A-Za-z0-9_]*)+)")
GROUP = re.compile(r"\b(crate|super)::\{([^}]*)\}", re.S)


def module_of(src, path):
    rel = os.path.relpath(path, src)[:-3].split(os.sep)
    if rel[-1] in ("mod", "lib", "main"):
        rel = rel[:-1]
    return tuple(rel)


def strip_comments(text):
    """The code without comments and doc attributes (their links are not imports)."""
    text = re.sub(r'doc\s*=\s*"(?:[^"\\]|\\.)*"', 'doc = ""', text)
    text = re.sub(r"//[^\n]*", "", text)
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def targets(module, text):
    """Absolute module paths this module names."""
    found = set()
    for root, rest in PATH.findall(text):
        parts = rest.strip(":").split("::")
        base = () if root == "crate" else module[:-1]
        found.add(base + tuple(parts))
    for root, inner in GROUP.findall(text):
        base = () if root == "crate" else module[:-1]
        for item in inner.split(","):
            item = item.strip().split(" as ")[0].strip()
            if item and item != "self":
                found.add(base + tuple(p for p in item.split("::") if p and p != "{"))
    return found


def main():
    failed = False
    for src in sys.argv[1:]:
        modules = {}
        for dirpath, _, files in os.walk(src):
            for name in files:
                if name.endswith(".rs"):
                    path = os.path.join(dirpath, name)
                    modules[module_of(src, path)] = strip_comments(open(path).read())
        known = set(modules)
        # Names the crate root re-exports (`pub use module::{A, B}`), by the module they
        # come from, so that `crate::A` counts as an import of that module.
        reexports = {}
        root_text = modules.get((), "")
        for path, inner in re.findall(r"pub use ([A-Za-z_][\w:]*)::\{([^}]*)\}", root_text):
            for item in inner.split(","):
                item = item.strip().split("::")[-1].split(" as ")[-1].strip()
                if item:
                    reexports[item] = tuple(path.split("::"))
        for path, item in re.findall(r"pub use ([A-Za-z_][\w:]*)::(\w+);", root_text):
            reexports[item] = tuple(path.split("::"))
        edges = set()
        for module, text in modules.items():
            for target in targets(module, text):
                if len(target) >= 1 and target[0] in reexports and target[:1] not in known:
                    target = reexports[target[0]] + target[1:]
                # The longest known module the path starts with.
                while target and target not in known:
                    target = target[:-1]
                if not target or target == module:
                    continue
                # Compare as siblings under their common parent.
                common = 0
                while common < min(len(module), len(target)) and module[common] == target[common]:
                    common += 1
                if common == len(module) or common == len(target):
                    continue  # parent and descendant
                a, b = module[: common + 1], target[: common + 1]
                edges.add((a, b))
        for a, b in sorted(edges):
            if (b, a) in edges and a < b:
                failed = True
                print(f"{src}: modules {'::'.join(a)} and {'::'.join(b)} import each other")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
