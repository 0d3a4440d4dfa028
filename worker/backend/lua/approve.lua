-- Approves the held compaction: only if it is still the one held and the composition is still
-- the one it was computed on (its newest compaction's id; '' for none). Then, as a publish of a
-- completed event does: the proposal goes, the event enters the recent compactions, the stream
-- and the composition. Replies {status, stream id}.
local proposal_key = KEYS[1]
local last_key = KEYS[2]
local composed_key = KEYS[3]
local events_key = KEYS[4]
local published_key = KEYS[5]
local proposal_id = ARGV[1]
local base_id = ARGV[2]
local event = ARGV[3]
local composed = ARGV[4]
local stream_maxlen = ARGV[5]
local stream_ttl_s = ARGV[6]
local announce_channel = ARGV[7]
local last_count = tonumber(ARGV[8])
local held = redis.call('GET', proposal_key)
if not held or cjson.decode(held)['event']['event_id'] ~= proposal_id then
  return {'not_held', ''}
end
local stored = redis.call('GET', composed_key)
local base = ''
if stored then base = cjson.decode(stored)['event_id'] or '' end
if base ~= base_id then return {'changed', ''} end
if not redis.call('SET', published_key, 1, 'NX', 'EX', stream_ttl_s) then
  return {'duplicate', ''}
end
redis.call('DEL', proposal_key)
redis.call('LPUSH', last_key, event)
redis.call('LTRIM', last_key, 0, last_count - 1)
redis.call('EXPIRE', last_key, stream_ttl_s)
if composed ~= '' then redis.call('SET', composed_key, composed, 'EX', stream_ttl_s) end
local id = redis.call('XADD', events_key, 'MAXLEN', '~', stream_maxlen, '*', 'event', event)
redis.call('EXPIRE', events_key, stream_ttl_s)
redis.call('PUBLISH', announce_channel, event)
return {'approved', id}
