#!/usr/bin/env node
// Acquire+release cycles through the TypeScript SyncGuard reference (kriasoft/syncguard v2.5.2,
// built into ./build by build.sh), for comparison with the Rust benches on the same servers:
//
//   node bench/reference/cycles.mjs --backend redis|postgres --url <url> --workers N --secs S
//        [--warmup-ms W] [--prefix P] [--pool M] [--locks-table T] [--fence-table F]
//
// N workers run closed loops in this one process (as a node service would use the library),
// each acquiring (ttl 30 s) and releasing its own key, `<P>:<random per run>:<worker>`, so
// nothing contends. The loop follows syncguard/benches/support/mod.rs: cycles that start
// during the W ms warm-up (default 300) are not counted; every cycle that starts in the next S
// seconds is, with its latency (acquire start to release end); cycles/s is cycles / S.
// Prints one JSON line on stdout:
//   {"backend":..,"workers":N,"cycles":..,"secs":S,"per_sec":..,"p50_us":..,"p99_us":..}
// Anything else goes to stderr; on any error it exits nonzero.
//
// Options:
//   --prefix P        user-key prefix (default "bench:ref")
//   --pool M          postgres only: postgres.js pool size (`max`); default min(N, 64), see below
//   --locks-table T   postgres only: the reference's `tableName` (default "syncguard_locks")
//   --fence-table F   postgres only: its `fenceTableName` (default "syncguard_fence_counters")
//
// PostgreSQL tables: the reference's own setupSchema() creates them if missing (CREATE ... IF
// NOT EXISTS). Its default names are the Rust library's too; the Rust schema is a superset of
// the reference's by design (extra nullable columns, and a trigger that fires only when an
// UPDATE changes a row's lock_id, which this workload never does), so both may share them.
// Pass --locks-table/--fence-table to keep the reference's rows apart.

import { randomBytes } from "node:crypto";
import { existsSync } from "node:fs";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

const TTL_MS = 30_000;

function fail(message) {
  process.stderr.write(`cycles.mjs: error: ${message}\n`);
  process.exit(1);
}

function note(message) {
  process.stderr.write(`cycles.mjs: ${message}\n`);
}

let args;
try {
  ({ values: args } = parseArgs({
    options: {
      backend: { type: "string" },
      url: { type: "string" },
      workers: { type: "string" },
      secs: { type: "string" },
      "warmup-ms": { type: "string", default: "300" },
      prefix: { type: "string", default: "bench:ref" },
      pool: { type: "string" },
      "locks-table": { type: "string" },
      "fence-table": { type: "string" },
      help: { type: "boolean", short: "h" },
    },
    strict: true,
    allowPositionals: false,
  }));
} catch (error) {
  fail(error.message);
}
if (args.help) {
  process.stderr.write(
    "usage: node cycles.mjs --backend redis|postgres --url <url> --workers N --secs S\n" +
      "       [--warmup-ms W] [--prefix P] [--pool M] [--locks-table T] [--fence-table F]\n",
  );
  process.exit(0);
}

function positiveInt(name, text) {
  const n = Number(text);
  if (text === undefined || !Number.isInteger(n) || n < 1) fail(`--${name} must be a positive integer (got ${text})`);
  return n;
}
const backendName = args.backend;
if (backendName !== "redis" && backendName !== "postgres") fail("--backend must be redis or postgres");
if (!args.url) fail("--url is required");
const workers = positiveInt("workers", args.workers);
const secs = Number(args.secs);
if (args.secs === undefined || !(secs > 0) || !Number.isFinite(secs)) fail(`--secs must be a positive number (got ${args.secs})`);
const warmupMs = Number(args["warmup-ms"]);
if (!(warmupMs >= 0) || !Number.isFinite(warmupMs)) fail(`--warmup-ms must be a number >= 0 (got ${args["warmup-ms"]})`);
if (backendName === "redis" && (args.pool || args["locks-table"] || args["fence-table"]))
  fail("--pool, --locks-table and --fence-table apply to --backend postgres only");

const buildDir = fileURLToPath(new URL("./build/", import.meta.url));
if (!existsSync(`${buildDir}${backendName}/index.js`))
  fail(`the reference is not built (no ${buildDir}${backendName}/index.js): run bash bench/reference/build.sh`);

// Each open client, and how to close it, so that every exit path closes it.
let close = async () => {};

// --- Backend setup -------------------------------------------------------------------------

async function redisBackend() {
  const { createRedisBackend } = await import(`${buildDir}redis/index.js`);
  const { default: Redis } = await import("ioredis");
  // One ioredis client for all workers, as the reference is used (its README: new Redis(),
  // then createLock/createRedisBackend on it): ioredis pipelines the workers' commands over
  // its one connection. No reconnecting: a lost connection fails the run.
  const redis = new Redis(args.url, { lazyConnect: true, retryStrategy: () => null, maxRetriesPerRequest: 0 });
  let lastError; // ioredis reports the cause as an event, then fails with "Connection is closed."
  redis.on("error", (error) => {
    lastError = error;
  });
  close = async () => {
    await redis.quit().catch(() => redis.disconnect());
  };
  try {
    await redis.connect();
  } catch (error) {
    throw new Error(`cannot connect to Redis at ${args.url}: ${lastError?.message ?? error.message}`);
  }
  // createRedisBackend registers its Lua scripts as ioredis commands (EVALSHA, falling back to
  // EVAL on the first NOSCRIPT), so the warm-up's first cycles also load them on the server.
  return createRedisBackend(redis);
}

async function postgresBackend() {
  const { createPostgresBackend, setupSchema } = await import(`${buildDir}postgres/index.js`);
  const { default: postgres } = await import("postgres");
  // Pool size: each cycle runs two transactions one after the other (acquire, release), each
  // holding one connection throughout, so N workers never use more than N connections at once.
  // The reference's docs (docs/postgres.md, "Connection Pooling") show `max: 20` as an example
  // and only insist on a pool; its spec calls a single connection the bottleneck. We give each
  // worker its own connection (max = N), as the Rust bench's pool also never makes a worker
  // wait, capped at 64 to stay well inside a default server's max_connections (100); --pool
  // overrides. All connections are opened before the warm-up (as the Rust bench's
  // min_connections does), so no cycle pays for a connect.
  const max = args.pool ? positiveInt("pool", args.pool) : Math.min(workers, 64);
  const sql = postgres(args.url, {
    max,
    idle_timeout: 0,
    connect_timeout: 10,
    // postgres.js prints server notices with console.log, which would write to stdout (such as
    // setupSchema's "relation ... already exists, skipping"): they go to stderr, if at all.
    onnotice: (notice) => {
      if (notice.severity !== "NOTICE") note(`server ${notice.severity}: ${notice.message}`);
    },
  });
  close = async () => {
    await sql.end({ timeout: 5 });
  };
  const options = {};
  if (args["locks-table"]) options.tableName = args["locks-table"];
  if (args["fence-table"]) options.fenceTableName = args["fence-table"];
  // The backend first: its config validates the table names, which setupSchema (it builds its
  // DDL with sql.unsafe) does not.
  const backend = createPostgresBackend(sql, options);
  try {
    await setupSchema(sql, options);
  } catch (error) {
    throw new Error(`cannot set up the reference's tables at ${args.url}: ${error.message}`);
  }
  await Promise.all(Array.from({ length: max }, () => sql`SELECT 1`));
  note(`postgres pool: max ${max} connections; tables ${options.tableName ?? "syncguard_locks"}, ${options.fenceTableName ?? "syncguard_fence_counters"}`);
  return backend;
}

// --- The closed loops ----------------------------------------------------------------------

async function worker(backend, key, start, end, latencies) {
  for (;;) {
    const began = performance.now();
    if (began >= end) return;
    const acquired = await backend.acquire({ key, ttlMs: TTL_MS });
    if (!acquired.ok) throw new Error(`acquire of ${key} refused (${acquired.reason}), though no one else uses the key`);
    const released = await backend.release({ lockId: acquired.lockId });
    if (!released.ok) throw new Error(`release of ${key} failed, though its lock was live`);
    if (began >= start) latencies.push(Math.floor((performance.now() - began) * 1000));
  }
}

function percentile(sorted, p) {
  if (sorted.length === 0) return null;
  return sorted[Math.round((sorted.length - 1) * p)];
}

async function main() {
  const backend = backendName === "redis" ? await redisBackend() : await postgresBackend();
  const run = randomBytes(6).toString("hex");
  const start = performance.now() + warmupMs;
  const end = start + secs * 1000;
  const perWorker = Array.from({ length: workers }, () => []);
  await Promise.all(perWorker.map((latencies, i) => worker(backend, `${args.prefix}:${run}:${i}`, start, end, latencies)));
  await close();
  close = async () => {};

  const latencies = Float64Array.from(perWorker.flat()).sort();
  const cycles = latencies.length;
  process.stdout.write(
    JSON.stringify({
      backend: backendName,
      workers,
      cycles,
      secs,
      per_sec: Math.round((cycles / secs) * 10) / 10,
      p50_us: percentile(latencies, 0.5),
      p99_us: percentile(latencies, 0.99),
    }) + "\n",
  );
}

main().catch(async (error) => {
  const cause = error?.cause ? ` (cause: ${error.cause.message ?? error.cause})` : "";
  process.stderr.write(`cycles.mjs: error: ${error?.stack ?? error}${cause}\n`);
  await Promise.race([close().catch(() => {}), new Promise((resolve) => setTimeout(resolve, 2000))]);
  process.exit(1);
});
