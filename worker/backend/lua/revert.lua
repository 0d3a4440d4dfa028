-- Restores (undoes) the newest completed compaction: only while no worker holds the
-- conversation (it may be publishing one computed on it), only if it is still the newest, and
-- only if the composition is still the one the new one was computed from; the composition goes
-- back to what it was before it ('': none). Replies {status, stream id}.
local last_key = KEYS[1]
local composed_key = KEYS[2]
local lock_key = KEYS[3]
local events_key = KEYS[4]
local published_key = KEYS[5]
local reverted_id = ARGV[1]
local composed_now = ARGV[2]
local composed_before = ARGV[3]
local event = ARGV[4]
local stream_maxlen = ARGV[5]
local stream_ttl_s = ARGV[6]
local announce_channel = ARGV[7]
if redis.call('EXISTS', lock_key) == 1 then return {'busy', ''} end
local head = redis.call('LINDEX', last_key, 0)
if not head or cjson.decode(head)['event_id'] ~= reverted_id then return {'not_newest', ''} end
if (redis.call('GET', composed_key) or '') ~= composed_now then return {'changed', ''} end
if not redis.call('SET', published_key, 1, 'NX', 'EX', stream_ttl_s) then
  return {'duplicate', ''}
end
redis.call('LPOP', last_key)
if composed_before == '' then redis.call('DEL', composed_key)
else redis.call('SET', composed_key, composed_before, 'EX', stream_ttl_s) end
local id = redis.call('XADD', events_key, 'MAXLEN', '~', stream_maxlen, '*', 'event', event)
redis.call('EXPIRE', events_key, stream_ttl_s)
redis.call('PUBLISH', announce_channel, event)
return {'reverted', id}
