-- Publishes one or more events of a conversation, in order, each once (by its published
-- flag); the last is the outcome, whose handled revision, memo and compaction (or proposal,
-- held for review) are recorded with it, only if it is published. Refused while another
-- worker holds the lock. Replies {newest, status of each event} or {'lease_lost'}; newest is 1
-- when the handled revision is the newest submitted.
local events_key = KEYS[1]
local lock_key = KEYS[2]
local handled_key = KEYS[3]
local last_key = KEYS[4]
local latest_key = KEYS[5]
local memo_key = KEYS[6]
local composed_key = KEYS[7]
local proposal_key = KEYS[8]
local flags_from = 9  -- KEYS[flags_from] onwards: each event's published flag
local fencing_token = ARGV[1]
local handled_revision = ARGV[2]
local stream_ttl_s = ARGV[3]
local stream_maxlen = ARGV[4]
local announce_channel = ARGV[5]
local is_completed = ARGV[6]
local last_count = tonumber(ARGV[7])
local memo = ARGV[8]
local memo_ttl_s = ARGV[9]
local memo_digest = ARGV[10]
local composed = ARGV[11]
local dedup_ttl_s = ARGV[12]
local proposal = ARGV[13]
local events_from = 14  -- ARGV[events_from] onwards: each event's JSON, the outcome last
if fencing_token ~= '' and redis.call('GET', lock_key) ~= fencing_token then
  return {'lease_lost'}
end
local reply = {0}
for i = events_from, #ARGV do
  local event = ARGV[i]
  if redis.call('SET', KEYS[flags_from + i - events_from], 1, 'NX', 'EX', dedup_ttl_s) then
    redis.call('XADD', events_key, 'MAXLEN', '~', stream_maxlen, '*', 'event', event)
    redis.call('EXPIRE', events_key, stream_ttl_s)
    redis.call('PUBLISH', announce_channel, event)
    reply[#reply + 1] = 'published'
  else
    reply[#reply + 1] = 'duplicate'
  end
end
if reply[#reply] ~= 'published' then return reply end
local outcome = ARGV[#ARGV]
if handled_revision ~= '' then
  local revision = tonumber(handled_revision)
  local handled = tonumber(redis.call('GET', handled_key) or '-1')
  if revision > handled then redis.call('SET', handled_key, handled_revision, 'EX', stream_ttl_s) end
  local latest = tonumber(redis.call('GET', latest_key) or '-1')
  if revision >= latest then reply[1] = 1 end
end
if memo ~= '' then
  redis.call('HSET', memo_key, 'd', memo_digest, 'b', memo)
  redis.call('EXPIRE', memo_key, memo_ttl_s)
end
if is_completed == '1' then
  redis.call('LPUSH', last_key, outcome)
  redis.call('LTRIM', last_key, 0, last_count - 1)
  redis.call('EXPIRE', last_key, stream_ttl_s)
  if composed ~= '' then redis.call('SET', composed_key, composed, 'EX', stream_ttl_s) end
end
if proposal ~= '' then redis.call('SET', proposal_key, proposal, 'EX', stream_ttl_s) end
return reply
