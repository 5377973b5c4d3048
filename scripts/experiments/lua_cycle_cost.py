"""Server CPU of the batch function per acquire+release cycle, from INFO commandstats.

One-off measurement behind BENCHMARKS.md ("The cluster layout's Lua"): loads a Lua file
that defines `batch(KEYS, ARGV)` (syncguard/src/redis/lua/batch.lua, or lua_cycle_compact.lua)
as a function library on a Redis 7 server of your own, then sends N pipelined pairs of calls,
32 cluster-layout acquires then their 32 releases, and prints the function's usec per cycle
and each command's. NODE=1 sends node calls (no declared key) as on a cluster node;
RELEASE_OP=q sends the releases of a caller with nobody waiting (the default, r, one with waiters).

    redis-server --port 18555 --save '' --appendonly no --daemonize yes
    pip install redis
    N=8000 python3 scripts/experiments/lua_cycle_cost.py syncguard/src/redis/lua/batch.lua 18555

It runs FUNCTION FLUSH: never point it at a server whose functions you need.
"""
import os
import random
import string
import sys

import redis

lua_path = sys.argv[1]
port = int(sys.argv[2]) if len(sys.argv) > 2 else 18555
channel = sys.argv[3] if len(sys.argv) > 3 else ''
r = redis.Redis(port=port)
code = open(lua_path).read()
name = "exp_" + format(abs(hash(code)) % 10**8)
lib = f"#!lua name={name}\n{code}redis.register_function{{function_name='{name}', callback=batch, flags={{'allow-cross-slot-keys'}}}}\n"
r.execute_command('FUNCTION', 'FLUSH')
r.execute_command('FUNCTION', 'LOAD', lib)
B = 32
def lid():
    return ''.join(random.choice(string.ascii_letters + string.digits) for _ in range(22))
keys = [f"p:{{{lid()[:11]}}}" for _ in range(B)]
ids = [lid() for _ in range(B)]
NODE = os.environ.get('NODE')
# 'q': the release of a caller with no waiters (no key read back); 'r' reads it back.
RELEASE_OP = os.environ.get('RELEASE_OP', 'r')
def shape(ks, args):
    if NODE:
        args[1] = '{}'
        return ['FCALL', name, 0] + args[:3] + [len(ks)] + ks + args[3:]
    return ['FCALL', name, len(ks)] + ks + args
def acquire_call():
    ks, args = [], ['1000', '', channel]
    for k, i in zip(keys, ids):
        ks += [k, k + ':fence']
        args += ['A', i, '30000', '31000', 'bench:some-user-key:' + k[3:14]]
    return shape(ks, args)
def release_call():
    ks, args = [], ['1000', '', channel]
    for k, i in zip(keys, ids):
        ks += [k]
        args += [RELEASE_OP, i]
    return shape(ks, args)
a, rel = acquire_call(), release_call()
N = int(os.environ.get('N', '3000'))
r.execute_command('CONFIG', 'RESETSTAT')
p = r.pipeline(transaction=False)
for n in range(N):
    p.execute_command(*a); p.execute_command(*rel)
    if n % 50 == 49:
        res = p.execute()
        p = r.pipeline(transaction=False)
res = p.execute()
st = r.info('commandstats')
f = st['cmdstat_fcall']
print(f"{lua_path}: fcall usec per cycle {f['usec']/(N*B):.2f} (calls {f['calls']}) " + ' '.join(f"{k[8:]}={v['usec']/(N*B):.2f}" for k, v in st.items() if k != 'cmdstat_fcall' and v['calls'] > 1000))
# sanity: last replies
print(str(res[-1])[:100] if res else "")
