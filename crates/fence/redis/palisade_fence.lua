#!lua name=palisade_fence
--
-- Palisade's fence as a Redis Function library: a write is checked against its resource's
-- high-water mark (the highest fencing token admitted so far) and applied in one atomic
-- call, so a holder whose lock has passed on cannot write.
--
-- Load it with `FUNCTION LOAD REPLACE` (Redis 7 or later). On an older server the same
-- file, without its first line, runs under EVAL/EVALSHA: ARGV[1] names the function and
-- the rest of ARGV are its arguments (see the end of the file). One copy of the logic.
--
-- Keys (every key a function touches is passed in KEYS, as Redis Cluster and ACL key
-- patterns require). The layout is documented once, in docs/resources.md ("Redis"), and
-- built by the Rust crate's `palisade_fence::redis::KeyLayout`:
--   mark       <prefix>{<resource>}:mark     hash: token (decimal), updated_ms (Unix ms)
--   reset log  <prefix>{<resource>}:resets   stream: old, new, reason, reset_by, lock, floor
-- The functions only take keys; they never build them.
--
-- Tokens are canonical decimal strings (no sign, no leading zeros, at most 2^63 - 1) and
-- are compared as strings (length, then byte by byte): a Lua number is a double, which
-- cannot tell 2^53 from 2^53 + 1, and tokens of epoch 32 and above are that large.
--
-- Error replies (the first word is the code; every refusal writes nothing):
--   FENCESTALE mark=<mark> token=<token> key=<mark key>   the token is below the mark
--   FENCETOKEN ...     a token (or a reset's floor) is not a canonical decimal
--   FENCEARGS ...      wrong key or argument count, a first key not named as a mark, a write
--                      aimed at any mark or reset log, or a fenced_call command that
--                      reaches keys it does not name (FLUSHDB, SWAPDB, SELECT, ...)
--   FENCERESET ...     a reset refused: no reason, not below the mark, below the floor
--   FENCENOMARK ...    a reset of a resource with no mark
--   FENCEMARK ...      the mark key holds something that is not a token

-- Bumped whenever this file changes; `fence_version` reports it so a client can tell an
-- older library (replace it) from a newer one (leave it).
local VERSION = 3
local MAX_TOKEN = '9223372036854775807'

-- `s` cut to `max` bytes with every byte outside printable ASCII as '?': error replies
-- are one line.
local function printable(s, max)
    s = tostring(s)
    if #s > max then
        s = string.sub(s, 1, max) .. '...'
    end
    return (string.gsub(s, '[^ -~]', '?'))
end

-- -1, 0 or 1 as canonical decimal `a` is below, equal to or above `b`.
local function compare(a, b)
    if a == b then
        return 0
    end
    local na, nb = #a, #b
    if na ~= nb then
        return na < nb and -1 or 1
    end
    for i = 1, na do
        local x, y = string.byte(a, i), string.byte(b, i)
        if x ~= y then
            return x < y and -1 or 1
        end
    end
    return 0
end

-- Whether `t` is a token: ASCII digits, no leading zero, at most 2^63 - 1.
local function canonical(t)
    if type(t) ~= 'string' then
        return false
    end
    local n = #t
    if n == 0 or n > 19 or string.find(t, '[^0-9]') then
        return false
    end
    if n > 1 and string.byte(t, 1) == 48 then
        return false
    end
    return n < 19 or compare(t, MAX_TOKEN) <= 0
end

local function refuse(code, text, key)
    return redis.error_reply(code .. ' ' .. text .. ' key=' .. printable(key, 512))
end

local function malformed(what, t, key)
    return refuse('FENCETOKEN', 'malformed ' .. what .. ' "' .. printable(t, 40)
        .. '": expected a decimal integer in 0..' .. MAX_TOKEN
        .. ' with no sign and no leading zeros; nothing was written', key)
end

local function usage(name, shape, key)
    return refuse('FENCEARGS', name .. ' takes ' .. shape .. '; nothing was written', key or '')
end

-- Whether `k` is named as the fence names a mark: `<prefix>{<resource>}:mark`.
local function mark_key(k)
    return type(k) == 'string' and string.find(k, '{', 1, true) ~= nil
        and string.sub(k, -6) == '}:mark'
end

-- Whether `k` is named as the fence names its own keys, a mark or a reset log, of any
-- resource under any prefix. No write touches such a key but through these functions.
local function fence_key(k)
    return type(k) == 'string' and string.find(k, '{', 1, true) ~= nil
        and (string.sub(k, -6) == '}:mark' or string.sub(k, -8) == '}:resets')
end

-- Checks `token` against the mark at `key`. Returns an error reply when the write must be
-- refused; otherwise nil and whether the mark must rise (false for a token equal to it).
local function check(key, token)
    if not mark_key(key) then
        return refuse('FENCEARGS', 'the first key must be a mark, <prefix>{<resource>}:mark;'
            .. ' nothing was written', key)
    end
    if not canonical(token) then
        return malformed('fencing token', token, key)
    end
    local mark = redis.call('HGET', key, 'token')
    if mark then
        if not canonical(mark) then
            return refuse('FENCEMARK', 'the mark holds "' .. printable(mark, 40)
                .. '", not a token; nothing was written', key)
        end
        local c = compare(token, mark)
        if c < 0 then
            return redis.error_reply('FENCESTALE mark=' .. mark .. ' token=' .. token
                .. ' key=' .. printable(key, 512))
        end
        if c == 0 then
            return nil, false
        end
    end
    return nil, true
end

local function now_ms()
    local t = redis.call('TIME')
    return string.format('%.0f', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
end

local function set_mark(key, token)
    redis.call('HSET', key, 'token', token, 'updated_ms', now_ms())
end

-- Refuses data keys named as the fence's own keys (any resource's mark or reset log): a
-- write there could lower a mark or forge a reset.
local function apart(name, keys)
    for i = 2, #keys do
        if fence_key(keys[i]) then
            return usage(name, 'data keys that are not a mark or a reset log ("'
                .. printable(keys[i], 200) .. '" is)', keys[1])
        end
    end
    return nil
end

-- Commands a fenced_call may not run: they reach keys no argument names (every key of a
-- database, another database) or change what runs (functions, scripts, the config).
local DENIED = {
    flushdb = true, flushall = true, swapdb = true, select = true, move = true, copy = true,
    migrate = true, restore = true, ['restore-asking'] = true, ['function'] = true,
    eval = true, evalsha = true, eval_ro = true, evalsha_ro = true, fcall = true,
    fcall_ro = true, script = true, config = true, debug = true, shutdown = true,
    acl = true, module = true,
}

local F = {}

-- fence_raise(KEYS: mark; ARGV: token) -> 1 if the mark rose (or was created), 0 if the
-- token equals it.
function F.fence_raise(keys, args)
    if #keys ~= 1 or #args ~= 1 then
        return usage('fence_raise', '1 key (the mark) and 1 argument (the token)', keys[1])
    end
    local err, newer = check(keys[1], args[1])
    if err then
        return err
    end
    if newer then
        set_mark(keys[1], args[1])
        return 1
    end
    return 0
end

-- The single-command writes run the write, then raise the mark: a write that Redis
-- refuses (WRONGTYPE, a bad option) aborts the call with nothing changed. `shape_ok` says
-- whether the call has the function's shape (`shape` describes it); `write` runs the
-- write and returns its reply.
local function single(name, keys, args, shape_ok, shape, write)
    if not shape_ok then
        return usage(name, shape, keys[1])
    end
    local err, newer = apart(name, keys)
    if err then
        return err
    end
    err, newer = check(keys[1], args[1])
    if err then
        return err
    end
    local reply = write()
    if newer then
        set_mark(keys[1], args[1])
    end
    return reply
end

-- fenced_set(KEYS: mark, key; ARGV: token, value [, SET options...]) -> SET's reply.
function F.fenced_set(keys, args)
    return single('fenced_set', keys, args, #keys == 2 and #args >= 2,
        '2 keys (mark, key) and the token, the value and SET options',
        function() return redis.call('SET', keys[2], unpack(args, 2)) end)
end

-- fenced_hset(KEYS: mark, key; ARGV: token, field, value [, field, value...]) -> HSET's
-- reply (fields added).
function F.fenced_hset(keys, args)
    return single('fenced_hset', keys, args, #keys == 2 and #args >= 3 and #args % 2 == 1,
        '2 keys (mark, key) and the token then field/value pairs',
        function() return redis.call('HSET', keys[2], unpack(args, 2)) end)
end

-- fenced_del(KEYS: mark, key [, key...]; ARGV: token) -> DEL's reply (keys removed).
function F.fenced_del(keys, args)
    return single('fenced_del', keys, args, #keys >= 2 and #args == 1,
        'the mark key and at least one key, and the token',
        function() return redis.call('DEL', unpack(keys, 2)) end)
end

-- fenced_incrby(KEYS: mark, key; ARGV: token, increment) -> INCRBY's reply (the value).
function F.fenced_incrby(keys, args)
    return single('fenced_incrby', keys, args, #keys == 2 and #args == 2,
        '2 keys (mark, key) and the token and the increment',
        function() return redis.call('INCRBY', keys[2], args[2]) end)
end

-- fenced_call(KEYS: mark, every key the commands touch; ARGV: token, then each command as
-- its argument count followed by its arguments, name first: `2 GET k 3 SET k v`) -> an
-- array of the commands' replies. The whole list is parsed before anything runs. The mark
-- is raised first, then the commands run in order; a command Redis refuses aborts the
-- call, leaving the commands before it applied (Redis has no rollback) and the mark
-- raised, which refuses more, never less.
function F.fenced_call(keys, args)
    local shape = 'the mark key then every key the commands touch, and the token then each '
        .. 'command as its argument count and its arguments'
    if #keys < 1 or #args < 3 then
        return usage('fenced_call', shape, keys[1])
    end
    local cmds, i = {}, 2
    while i <= #args do
        local n = tonumber(args[i])
        if not n or n < 1 or n ~= math.floor(n) or i + n > #args then
            return usage('fenced_call', shape .. ' (argument ' .. i .. ' is not a count that fits)', keys[1])
        end
        local cmd = {}
        for j = i + 1, i + n do
            if fence_key(args[j]) then
                return usage('fenced_call', 'commands that leave marks and reset logs alone ("'
                    .. printable(args[j], 200) .. '" is one)', keys[1])
            end
            cmd[#cmd + 1] = args[j]
        end
        if DENIED[string.lower(cmd[1])] then
            return usage('fenced_call', 'commands that touch only the keys they name ('
                .. printable(cmd[1], 40) .. ' is not one)', keys[1])
        end
        cmds[#cmds + 1] = cmd
        i = i + n + 1
    end
    local err, newer = apart('fenced_call', keys)
    if err then
        return err
    end
    err, newer = check(keys[1], args[1])
    if err then
        return err
    end
    if newer then
        set_mark(keys[1], args[1])
    end
    local replies = {}
    for k = 1, #cmds do
        replies[k] = redis.call(unpack(cmds[k]))
    end
    return replies
end

-- fence_mark(KEYS: mark) -> nil, or [token, updated_ms]. Read-only (FCALL_RO).
function F.fence_mark(keys, args)
    if #keys ~= 1 or #args ~= 0 then
        return usage('fence_mark', '1 key (the mark) and no arguments', keys[1])
    end
    if not mark_key(keys[1]) then
        return usage('fence_mark', 'a mark key, <prefix>{<resource>}:mark', keys[1])
    end
    local m = redis.call('HMGET', keys[1], 'token', 'updated_ms')
    if not m[1] then
        return nil
    end
    return { m[1], m[2] or '0' }
end

-- fence_reset(KEYS: mark, its reset log; ARGV: to, reason, reset_by, lock, floor) -> the
-- mark it replaced. The log is appended to before the mark is lowered, so a reset that
-- cannot be logged (the log key holds another type) changes nothing. Only lowers, to a named token; needs a reason; `lock` and `floor` are both
-- empty (the lock is unknown) or both given, and then `to` may not be below `floor` (the
-- lock's newest grant: a lower mark would admit its earlier holders again). Appends
-- old, new, reason, reset_by, lock and floor to the reset log in the same call.
-- `reset_by` is reported by the caller (a script cannot read the connection's user).
function F.fence_reset(keys, args)
    if #keys ~= 2 or #args ~= 5 then
        return usage('fence_reset', '2 keys (mark, reset log) and 5 arguments (to, reason, reset_by, lock, floor)', keys[1])
    end
    local key, to, reason, by, lock, floor = keys[1], args[1], args[2], args[3], args[4], args[5]
    if not mark_key(key) then
        return usage('fence_reset', 'a mark key, <prefix>{<resource>}:mark', key)
    end
    -- The log is the mark's own: <prefix>{<resource>}:resets.
    if keys[2] ~= string.sub(key, 1, -6) .. ':resets' then
        return usage('fence_reset', 'the mark\'s own reset log, <prefix>{<resource>}:resets', key)
    end
    local kind = redis.call('TYPE', keys[2])
    kind = type(kind) == 'table' and kind.ok or kind
    if kind ~= 'none' and kind ~= 'stream' then
        return refuse('FENCERESET', 'reset refused: the reset log holds a ' .. printable(kind, 20)
            .. ', not a stream; nothing was changed', key)
    end
    if not string.find(reason, '%S') then
        return refuse('FENCERESET', 'reset refused: a reason is required', key)
    end
    if not canonical(to) then
        return malformed('token to reset to', to, key)
    end
    if (lock == '') ~= (floor == '') then
        return refuse('FENCERESET', 'reset refused: a lock and the token of its newest grant go together', key)
    end
    if floor ~= '' then
        if not canonical(floor) then
            return malformed('floor', floor, key)
        end
        if compare(to, floor) < 0 then
            return refuse('FENCERESET', 'reset refused: ' .. to .. ' is below ' .. floor
                .. ', the newest grant of lock ' .. printable(lock, 200)
                .. '; a lower mark would admit its earlier holders again', key)
        end
    end
    local old = redis.call('HGET', key, 'token')
    if not old then
        return refuse('FENCENOMARK', 'reset refused: no mark', key)
    end
    if not canonical(old) then
        return refuse('FENCEMARK', 'the mark holds "' .. printable(old, 40) .. '", not a token', key)
    end
    if compare(to, old) >= 0 then
        return refuse('FENCERESET', 'reset refused: ' .. to .. ' is not below the mark ' .. old
            .. '; a reset only lowers a mark', key)
    end
    if by == '' then
        by = '(not reported)'
    end
    -- The record first: a reset that cannot be logged changes nothing.
    redis.call('XADD', keys[2], '*', 'old', old, 'new', to, 'reason', reason, 'reset_by', by,
        'lock', lock, 'floor', floor)
    set_mark(key, to)
    return old
end

-- fence_version() -> this file's VERSION. Read-only.
function F.fence_version(keys, args)
    return VERSION
end

-- Every function, and whether it only reads (flag no-writes: FCALL_RO, replicas).
local FUNCTIONS = {
    { 'fence_raise', false }, { 'fenced_set', false }, { 'fenced_hset', false },
    { 'fenced_del', false }, { 'fenced_incrby', false }, { 'fenced_call', false },
    { 'fence_mark', true }, { 'fence_reset', false }, { 'fence_version', true },
}

if redis.register_function then
    -- (A library is loaded with few globals: no pairs or ipairs.)
    for i = 1, #FUNCTIONS do
        local name, read_only = FUNCTIONS[i][1], FUNCTIONS[i][2]
        redis.register_function {
            function_name = name,
            callback = F[name],
            flags = read_only and { 'no-writes' } or {},
        }
    end
else
    -- EVAL/EVALSHA: ARGV[1] names the function, the rest of ARGV are its arguments.
    if redis.replicate_commands then
        redis.replicate_commands()
    end
    local fn = F[ARGV[1]]
    if not fn then
        return redis.error_reply('FENCEARGS unknown fence function "' .. printable(ARGV[1] or '', 40)
            .. '"; nothing was written')
    end
    return fn(KEYS, { unpack(ARGV, 2) })
end
