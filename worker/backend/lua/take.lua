-- An evaluation's work in one round trip: the queued flag cleared (later submissions queue
-- afresh), then the newest and handled revisions and, when there is work, the newest snapshot,
-- the recent compactions, the memo (its bytes only when its digest is not known_memo), the
-- composition, whether a compaction is held for review, and the conversation's pace.
-- idle == '1': the work of an idle compaction, whose revision has an outcome already (a skip
-- under the threshold): read it all the same, unless a newer revision waits (the normal path
-- has it) or none exists; the queued flag is then left alone.
local queued_key = KEYS[1]
local latest_key = KEYS[2]
local handled_key = KEYS[3]
local last_key = KEYS[4]
local memo_key = KEYS[5]
local snapshot_key = KEYS[6]
local composed_key = KEYS[7]
local proposal_key = KEYS[8]
local activity_key = KEYS[9]
local known_memo = ARGV[1]
local idle = ARGV[2]
local is_idle = idle == '1'
local latest = redis.call('GET', latest_key)
local handled = redis.call('GET', handled_key) or '-1'
if not is_idle then redis.call('DEL', queued_key) end
if not latest or (tonumber(latest) <= tonumber(handled)) ~= is_idle then
  return {latest or false, handled}
end
local payload = redis.call('GET', snapshot_key)
local digest = redis.call('HGET', memo_key, 'd')
local memo = false
if digest and digest ~= known_memo then memo = redis.call('HGET', memo_key, 'b') end
return {latest, handled, payload or false, redis.call('LRANGE', last_key, 0, -1), digest or false,
        memo, redis.call('GET', composed_key) or false, redis.call('EXISTS', proposal_key),
        redis.call('HMGET', activity_key, 'n', 'f', 't')}
