-- A compaction on demand: stored for the workers if the conversation has a snapshot (a newer
-- request replaces a waiting one). Replies {'requested', latest, replaced request or false} or
-- {'no_snapshot'}.
local requested_key = KEYS[1]
local latest_key = KEYS[2]
local request = ARGV[1]
local ttl_s = ARGV[2]
local latest = redis.call('GET', latest_key)
if not latest then return {'no_snapshot'} end
local replaced = redis.call('GET', requested_key)
redis.call('SET', requested_key, request, 'EX', ttl_s)
return {'requested', latest, replaced or false}
