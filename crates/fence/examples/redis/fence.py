"""The fence from Python (the `redis` package): write under a token, see a stale write
refused, and read the mark from the refusal.

    REDIS_URL  the server (default redis://127.0.0.1:6379)
    RESOURCE   the resource whose mark guards the writes (default orders:17)
    PREFIX     the key prefix of the marks (default palisade:fence:)
"""

import os
import pathlib

import redis

LIBRARY = pathlib.Path(__file__).parent.parent.parent / "redis" / "palisade_fence.lua"

r = redis.Redis.from_url(os.environ.get("REDIS_URL", "redis://127.0.0.1:6379"))
resource = os.environ.get("RESOURCE", "orders:17")
prefix = os.environ.get("PREFIX", "palisade:fence:")
mark = f"{prefix}{{{resource}}}:mark"  # <prefix>{<resource>}:mark
row = f"{{{resource}}}:row"  # in the mark's Redis Cluster slot

r.function_load(LIBRARY.read_text(), replace=True)


class StaleToken(Exception):
    """A newer holder has written; `mark` is its token. Nothing was written."""

    def __init__(self, token, mark):
        super().__init__(f"token {token} is below the mark {mark}")
        self.token, self.mark = token, mark


def fenced_hset(token, fields):
    """HSET row fields, if `token` is at least the resource's mark (which then rises)."""
    args = [str(token)]
    for k, v in fields.items():
        args += [k, v]
    try:
        return r.fcall("fenced_hset", 2, mark, row, *args)
    except redis.ResponseError as e:
        # "FENCESTALE mark=<mark> token=<token> key=<mark key>"
        code, _, detail = str(e).partition(" ")
        if code != "FENCESTALE":
            raise
        words = dict(w.split("=", 1) for w in detail.split(" ", 2)[:2])
        raise StaleToken(int(words["token"]), int(words["mark"])) from None


# Tokens are Python ints: exact at any size. Epoch 40 puts them above 2^53.
new = (40 << 48) + 1001
old = new - 1

print("admitted, fields added:", fenced_hset(new, {"status": "paid", "by": "holder 1001"}))
try:
    fenced_hset(old, {"status": "refunded", "by": "holder 1000"})
except StaleToken as e:
    print("refused:", e.token, "below", e.mark)
print("row:", r.hget(row, "status").decode(), r.hget(row, "by").decode())

# The general form: any commands after the check, in the same atomic call.
replies = r.fcall("fenced_call", 2, mark, row, str(new), 4, "HINCRBY", row, "writes", 1, 2, "HLEN", row)
print("fenced_call replies:", replies)
token, updated_ms = r.fcall_ro("fence_mark", 1, mark)
print("mark:", int(token))
