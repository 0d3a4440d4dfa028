-- An evaluation over the threshold while another worker compacts the conversation: flags a
-- re-run for that holder (its release takes the flag, release.lua) in the same step as it reads
-- the lease, so the holder cannot release between the two. Replies the milliseconds left on the
-- lease, 0 when nobody holds the lock (nothing flagged: compact now).
local lock_key = KEYS[1]
local rerun_key = KEYS[2]
local ttl_s = ARGV[1]
local left_ms = redis.call('PTTL', lock_key)
if left_ms <= 0 then return 0 end
redis.call('SET', rerun_key, 1, 'EX', ttl_s)
return left_ms
