-- What a requested compaction works on: the request, the newest revision, its snapshot, the
-- recent compactions, their composition and whether a compaction is held for review ({false}
-- when nothing is requested).
local requested_key = KEYS[1]
local latest_key = KEYS[2]
local snapshot_key = KEYS[3]
local last_key = KEYS[4]
local composed_key = KEYS[5]
local proposal_key = KEYS[6]
local request = redis.call('GET', requested_key)
if not request then return {false} end
return {request, redis.call('GET', latest_key) or false, redis.call('GET', snapshot_key) or false,
        redis.call('LRANGE', last_key, 0, -1), redis.call('GET', composed_key) or false,
        redis.call('EXISTS', proposal_key)}
