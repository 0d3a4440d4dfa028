-- Declines the held compaction: the proposal goes and the declined event is published.
-- Replies {status, stream id}.
local proposal_key = KEYS[1]
local events_key = KEYS[2]
local published_key = KEYS[3]
local proposal_id = ARGV[1]
local event = ARGV[2]
local stream_maxlen = ARGV[3]
local stream_ttl_s = ARGV[4]
local announce_channel = ARGV[5]
local held = redis.call('GET', proposal_key)
if not held or cjson.decode(held)['event']['event_id'] ~= proposal_id then
  return {'not_held', ''}
end
if not redis.call('SET', published_key, 1, 'NX', 'EX', stream_ttl_s) then
  return {'duplicate', ''}
end
redis.call('DEL', proposal_key)
local id = redis.call('XADD', events_key, 'MAXLEN', '~', stream_maxlen, '*', 'event', event)
redis.call('EXPIRE', events_key, stream_ttl_s)
redis.call('PUBLISH', announce_channel, event)
return {'declined', id}
