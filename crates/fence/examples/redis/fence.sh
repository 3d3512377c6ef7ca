#!/bin/sh
# The fence from redis-cli: load the library, write under a token, and see a stale write
# refused. Any client that can send FCALL does the same.
#
#   REDIS_URL  the server (default redis://127.0.0.1:6379)
#   RESOURCE   the resource whose mark guards the writes (default orders:17)
#   PREFIX     the key prefix of the marks (default palisade:fence:)
set -eu
here=$(dirname "$0")
url=${REDIS_URL:-redis://127.0.0.1:6379}
resource=${RESOURCE:-orders:17}
prefix=${PREFIX:-palisade:fence:}
cli() { redis-cli -u "$url" --no-raw "$@"; }

# The keys: the mark lives at <prefix>{<resource>}:mark; a data key that starts with
# {<resource>} is in the mark's Redis Cluster slot.
mark="${prefix}{${resource}}:mark"
status="{${resource}}:status"

# Load (or replace) the library. Its functions are persisted and replicated with the data.
cli FUNCTION LOAD REPLACE "$(cat "$here/../../redis/palisade_fence.lua")"

# A holder of token 281474976710700 (epoch 1, revision 44) writes: admitted, the mark rises.
cli FCALL fenced_set 2 "$mark" "$status" 281474976710700 paid
# A paused holder of an older token writes: refused with FENCESTALE, nothing is written.
cli FCALL fenced_set 2 "$mark" "$status" 281474976710699 refunded
# Tokens are compared exactly, also above 2^53 (epoch 32 and later), where a Lua number
# could not tell them apart: 9007199254740993 is admitted, then 9007199254740992 refused.
cli FCALL fence_raise 1 "$mark" 9007199254740993
cli FCALL fenced_incrby 2 "$mark" "{${resource}}:count" 9007199254740992 1
# A malformed token (a leading zero) is refused too.
cli FCALL fenced_set 2 "$mark" "$status" 0281474976710700 refunded
# The data is the admitted holder's; the mark is the highest token admitted.
cli GET "$status"
cli FCALL_RO fence_mark 1 "$mark"
