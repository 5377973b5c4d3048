#!/usr/bin/env python3
"""Checks that our `rust-version` (the MSRV claim) holds for every feature.

A minimal toolchain cannot be installed everywhere the test command runs, so this checks what
can be read instead:

1. Every package reachable through normal and build dependencies (any platform, all features)
   from the published crates declares a `rust-version` no greater than ours. Dev-dependencies
   are left out: they build our tests, not a user's program. `cargo metadata` resolves features
   for the whole workspace at once, so the set of packages comes from `cargo tree` over the
   published crates alone (features of the unpublished members do not count); the versions'
   `rust-version` and the chains that reach them come from `cargo metadata`.
2. Our own code's language features are under the claim (let-chains: 1.88). Standard library
   APIs are checked by clippy's `incompatible_msrv` lint, which reads the same `rust-version`.

Prints the offenders and exits 1 if the claim is too low; prints what sets the floor otherwise.

    python3 scripts/check-msrv.py
    python3 scripts/check-msrv.py --as 1.85   # what would fail if the claim were 1.85
"""

import json
import pathlib
import re
import subprocess
import sys

PUBLISHED = ["syncguard-macros", "syncguard", "syncguard-tower"]

# Language features that rustc accepts in edition 2024 whatever `rust-version` says, with the
# release that stabilized them. A pattern that matched something else could only make the check
# stricter, never pass a claim that is too low.
LANGUAGE_FEATURES = [
    ("let chains (`&& let`)", "1.88", re.compile(r"&&\s*let\b")),
    ("let chains (`if let … &&`)", "1.88", re.compile(r"\b(?:if|while)\s+let\b[^{};|]*?&&")),
]
EDITION_FLOOR = {"2015": "1.0", "2018": "1.31", "2021": "1.56", "2024": "1.85"}


def version(text):
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def show(v):
    return ".".join(str(part) for part in v)


def strip_comments(source):
    # Line comments only (doc comments included): block comments are rare enough in this code.
    return re.sub(r"//[^\n]*", "", source)


def main():
    root = pathlib.Path(__file__).resolve().parent.parent
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            cwd=root,
            check=True,
            stdout=subprocess.PIPE,
        ).stdout
    )
    tree = subprocess.run(
        ["cargo", "tree", "--locked", "--all-features", "--edges", "normal,build", "--target", "all"]
        + [arg for name in PUBLISHED for arg in ("-p", name)]
        + ["--prefix", "none", "--format", "{p}"],
        cwd=root,
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    ).stdout
    in_tree = {tuple(line.split()[:2]) for line in tree.splitlines() if line.strip()}
    packages = {package["id"]: package for package in metadata["packages"]}
    members = set(metadata["workspace_members"])
    published = {
        package["name"]: package
        for package in metadata["packages"]
        if package["id"] in members and package["name"] in PUBLISHED
    }
    missing = [name for name in PUBLISHED if name not in published]
    if missing:
        sys.exit(f"check-msrv: not in the workspace: {', '.join(missing)}")

    failures = []
    claims = {name: published[name].get("rust_version") for name in PUBLISHED}
    if None in claims.values() or len(set(claims.values())) != 1:
        sys.exit(f"check-msrv: the published crates must share one rust-version: {claims}")
    ours = version(claims[PUBLISHED[0]])
    if len(sys.argv) == 3 and sys.argv[1] == "--as":
        ours = version(sys.argv[2])

    # 1. Dependencies reachable from the published crates (normal and build edges).
    nodes = {node["id"]: node for node in metadata["resolve"]["nodes"]}
    paths = {}  # package id -> the chain of names that first reached it
    queue = []
    for name in PUBLISHED:
        paths[published[name]["id"]] = [name]
        queue.append(published[name]["id"])
    while queue:
        current = queue.pop(0)
        for dep in nodes[current]["deps"]:
            if all(kind["kind"] == "dev" for kind in dep["dep_kinds"]):
                continue
            package = packages[dep["pkg"]]
            if (package["name"], "v" + package["version"]) not in in_tree:
                continue
            if dep["pkg"] not in paths:
                paths[dep["pkg"]] = paths[current] + [packages[dep["pkg"]]["name"]]
                queue.append(dep["pkg"])

    names_reached = {(packages[i]["name"], "v" + packages[i]["version"]) for i in paths}
    if names_reached != in_tree:
        sys.exit(f"check-msrv: cargo tree and cargo metadata disagree: {in_tree ^ names_reached}")

    highest = None
    undeclared = 0
    for package_id, chain in paths.items():
        package = packages[package_id]
        if package_id in members:
            continue
        declared = package.get("rust_version")
        if declared is None:
            undeclared += 1
            continue
        if highest is None or version(declared) > version(highest[0]):
            highest = (declared, package)
        if version(declared) > ours:
            failures.append(
                f"  {package['name']} {package['version']} needs Rust {declared}"
                f" (via {' -> '.join(chain)})"
            )

    # 2. Our own code.
    own_floor = version(EDITION_FLOOR[published[PUBLISHED[0]]["edition"]])
    own_reason = f"edition {published[PUBLISHED[0]]['edition']}"
    for name in PUBLISHED:
        crate_dir = pathlib.Path(published[name]["manifest_path"]).parent
        for path in sorted(crate_dir.rglob("*.rs")):
            if "target" in path.relative_to(crate_dir).parts:
                continue
            source = strip_comments(path.read_text(encoding="utf-8"))
            for feature, needs, pattern in LANGUAGE_FEATURES:
                match = pattern.search(source)
                if not match:
                    continue
                line = source.count("\n", 0, match.start()) + 1
                where = f"{path.relative_to(root)}:{line}"
                if version(needs) > own_floor:
                    own_floor, own_reason = version(needs), f"{feature} at {where}"
                if version(needs) > ours:
                    failures.append(f"  our code: {feature} needs Rust {needs} ({where})")

    if failures:
        print(f"check-msrv: rust-version {show(ours)} is too low:")
        print("\n".join(sorted(set(failures))))
        print("Raise `rust-version` in the workspace Cargo.toml, or choose dependencies that honour it.")
        sys.exit(1)
    top = f"{highest[1]['name']} {highest[1]['version']} needs {highest[0]}" if highest else "none"
    print(
        f"check-msrv: rust-version {show(ours)} holds: {len(paths) - len(PUBLISHED)} dependencies"
        f" ({undeclared} declare no rust-version); highest: {top}; our code: {show(own_floor)}"
        f" ({own_reason})"
    )


if __name__ == "__main__":
    main()
