#!/usr/bin/env bash
# Builds the TypeScript SyncGuard reference implementation (kriasoft/syncguard v2.5.2, MIT) for
# cycles.mjs: its common/, redis/ and postgres/ sources compiled to ESM JavaScript in
# bench/reference/build/, and the pinned ioredis and postgres (plus the pinned TypeScript
# compiler) installed from package-lock.json into bench/reference/node_modules/.
#
# Source of the reference, in this order:
#   SYNCGUARD_REFERENCE_SRC=<git repo>   `git archive v2.5.2` of it (a work tree or a bare git dir)
#   SYNCGUARD_REFERENCE_SRC=<directory>  a checkout of v2.5.2, used as is (its package.json
#                                        must say version 2.5.2)
#   (unset)                              git clone --depth 1 --branch v2.5.2 from GitHub
# Idempotent: every run replaces build/ whole; npm ci runs only when package-lock.json changed.
set -euo pipefail

TAG=v2.5.2
VERSION=${TAG#v}
UPSTREAM=https://github.com/kriasoft/syncguard

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
BUILD="$HERE/build"

die() { echo "build.sh: error: $*" >&2; exit 1; }
say() { echo "build.sh: $*"; }

command -v node >/dev/null || die "node is not installed (need node >= 20)"
command -v npm >/dev/null || die "npm is not installed"
NODE_MAJOR=$(node -p 'process.versions.node.split(".")[0]')
[ "$NODE_MAJOR" -ge 20 ] || die "node $(node --version) is too old: the reference needs node >= 20"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/syncguard-reference.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
SRC="$WORK/src"
mkdir -p "$SRC"

# --- 1. The reference's sources ------------------------------------------------------------

# Whether $1 is itself a git repository (the top of a work tree, or a git dir: bare, a mirror,
# or a work tree's .git), as opposed to a plain directory that merely lies inside some other
# repository's work tree.
is_git_repo() {
  local dir top gitdir
  dir=$(cd "$1" && pwd -P)
  top=$(git -C "$dir" rev-parse --show-toplevel 2>/dev/null) && [ "$(cd "$top" && pwd -P)" = "$dir" ] && return 0
  gitdir=$(git -C "$dir" rev-parse --absolute-git-dir 2>/dev/null) && [ "$(cd "$gitdir" && pwd -P)" = "$dir" ]
}

if [ -n "${SYNCGUARD_REFERENCE_SRC:-}" ]; then
  [ -d "$SYNCGUARD_REFERENCE_SRC" ] || die "SYNCGUARD_REFERENCE_SRC=$SYNCGUARD_REFERENCE_SRC is not a directory"
  if command -v git >/dev/null && is_git_repo "$SYNCGUARD_REFERENCE_SRC"; then
    COMMIT=$(git -C "$SYNCGUARD_REFERENCE_SRC" rev-parse --verify -q "$TAG^{commit}") ||
      die "the git repository $SYNCGUARD_REFERENCE_SRC has no tag $TAG"
    say "source: git archive $TAG ($COMMIT) of $SYNCGUARD_REFERENCE_SRC"
    git -C "$SYNCGUARD_REFERENCE_SRC" archive --format=tar "$COMMIT" | tar -x -C "$SRC"
    ORIGIN="git archive $TAG ($COMMIT) of $SYNCGUARD_REFERENCE_SRC"
  else
    say "source: the directory $SYNCGUARD_REFERENCE_SRC"
    (cd "$SYNCGUARD_REFERENCE_SRC" && tar -c --exclude=./node_modules --exclude=./.git --exclude=./dist .) | tar -x -C "$SRC"
    ORIGIN="directory $SYNCGUARD_REFERENCE_SRC"
    COMMIT=unknown
  fi
else
  command -v git >/dev/null || die "git is not installed (or set SYNCGUARD_REFERENCE_SRC to a source directory)"
  say "source: git clone --depth 1 --branch $TAG $UPSTREAM"
  git clone -q --depth 1 --branch "$TAG" "$UPSTREAM" "$WORK/clone" ||
    die "cannot clone $UPSTREAM (no network?): set SYNCGUARD_REFERENCE_SRC to a local clone or source directory"
  COMMIT=$(git -C "$WORK/clone" rev-parse HEAD)
  git -C "$WORK/clone" archive --format=tar HEAD | tar -x -C "$SRC"
  ORIGIN="git clone --depth 1 --branch $TAG $UPSTREAM ($COMMIT)"
fi

[ -f "$SRC/package.json" ] || die "no package.json in the reference's sources"
FOUND=$(node -p 'const p = require(process.argv[1]); p.name + "@" + p.version' "$SRC/package.json")
[ "$FOUND" = "syncguard@$VERSION" ] || die "the sources are $FOUND, expected syncguard@$VERSION"
for dir in common redis postgres; do
  [ -f "$SRC/$dir/index.ts" ] || die "the sources have no $dir/index.ts"
done

# --- 2. Pinned npm packages (ioredis, postgres, typescript) --------------------------------

STAMP="$HERE/node_modules/.syncguard-reference-lock.sha256"
LOCK_SUM=$(sha256sum "$HERE/package-lock.json" | cut -d' ' -f1)
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$LOCK_SUM" ]; then
  say "npm packages: up to date in $HERE/node_modules"
else
  say "npm packages: npm ci in $HERE"
  # --prefer-offline: the npm cache serves what it has, so a rebuild needs no network.
  (cd "$HERE" && npm ci --prefer-offline --no-audit --no-fund --ignore-scripts --loglevel=error >&2)
  echo "$LOCK_SUM" >"$STAMP"
fi

# --- 3. Compile common/, redis/, postgres/ (and the root index.ts) to ESM ------------------

# The reference's own compiler settings (its tsconfig.json), minus what we leave out:
# firestore/ (needs @google-cloud/firestore), tests, docs and examples, and declarations. Its
# "module": "preserve" emits the import statements as written, which node runs as ESM (they
# already name their .js files). "target": "ES2022" rather than its ESNext, so that nothing
# newer than node 20 understands (such as `using` declarations) reaches node untranspiled.
cat >"$SRC/tsconfig.bench.json" <<'JSON'
{
  "compilerOptions": {
    "lib": ["ESNext"],
    "target": "ES2022",
    "module": "preserve",
    "moduleDetection": "force",
    "types": ["node"],
    "typeRoots": ["./node_modules/@types"],
    "rootDir": "./",
    "outDir": "./out",
    "declaration": false,
    "sourceMap": false,
    "strict": true,
    "skipLibCheck": true,
    "noFallthroughCasesInSwitch": true,
    "noUncheckedIndexedAccess": true,
    "noImplicitOverride": true
  },
  "files": ["index.ts"],
  "include": ["common/**/*.ts", "redis/**/*.ts", "postgres/**/*.ts"],
  "exclude": ["firestore/**", "test/**", "docs/**", "example/**", "node_modules/**"]
}
JSON
# The compiler resolves ioredis/postgres/@types/node from the pinned node_modules.
ln -s "$HERE/node_modules" "$SRC/node_modules"
# The root index.ts re-exports only common/, so it compiles without firestore/.
if grep -q firestore "$SRC/index.ts"; then die "index.ts of $FOUND imports firestore/: adjust build.sh"; fi

say "compiling with $("$HERE/node_modules/.bin/tsc" --version)"
(cd "$SRC" && "$HERE/node_modules/.bin/tsc" -p tsconfig.bench.json) >&2 || die "tsc failed"

STAGE="$WORK/build"
mkdir -p "$STAGE"
cp -R "$SRC/out/." "$STAGE/"
cp "$SRC/LICENSE" "$STAGE/LICENSE"
# The compiled modules are ESM; node resolves their ioredis/postgres imports upward, from
# bench/reference/node_modules.
cat >"$STAGE/package.json" <<JSON
{ "name": "syncguard", "version": "$VERSION", "private": true, "type": "module" }
JSON
cat >"$STAGE/SOURCE.txt" <<EOF
syncguard $VERSION (MIT, Copyright (c) 2025-present Konstantin Tarkus, Kriasoft; see LICENSE)
from: $ORIGIN
commit: $COMMIT
compiled: common/ redis/ postgres/ index.ts with $("$HERE/node_modules/.bin/tsc" --version)
EOF
[ -f "$STAGE/redis/index.js" ] && [ -f "$STAGE/postgres/index.js" ] || die "tsc produced no redis/ or postgres/ index.js"

rm -rf "$BUILD"
mv "$STAGE" "$BUILD"
node --input-type=module -e '
  const [redis, pg] = await Promise.all([import(process.argv[1]), import(process.argv[2])]);
  for (const [name, fn] of [["createRedisBackend", redis.createRedisBackend], ["createPostgresBackend", pg.createPostgresBackend], ["setupSchema", pg.setupSchema]])
    if (typeof fn !== "function") throw new Error(name + " is missing from the build");
' "$BUILD/redis/index.js" "$BUILD/postgres/index.js" || die "the build does not load"

say "reference syncguard@$VERSION ($COMMIT) built into $BUILD"
say "  redis backend:    $BUILD/redis/index.js"
say "  postgres backend: $BUILD/postgres/index.js"
say "  npm packages:     $HERE/node_modules ($(cd "$HERE" && node -p '["ioredis","postgres"].map(n => n + "@" + require("./node_modules/" + n + "/package.json").version).join(", ")'))"
say "run: node $HERE/cycles.mjs --backend redis|postgres --url <url> --workers N --secs S"
