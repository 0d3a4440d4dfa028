-- Releases the lock while the token is still the holder's, and takes the re-run flag in the
-- same step, so that a flag set while the lock was held (defer.lua) is always taken by the one
-- releasing: never set after the last holder looked. While another worker holds the lock (this
-- lease was lost) the flag is left for that one. Also says whether a compaction on demand
-- waits (it was stored before its task was sent, so a task that found the lock held is
-- answered by this release), unless it is the request this holder took itself (taken_request:
-- its id; a request it could not finish must not queue itself at every release). What the
-- release took is remembered beside the lock for reply_ttl_ms: the script run again with the
-- same token (its reply was lost and the client sent it again) answers the re-run flag the
-- first run took. Replies {released, rerun, requested}: 1 or 0 each.
local lock_key = KEYS[1]
local rerun_key = KEYS[2]
local requested_key = KEYS[3]
local reply_key = KEYS[4]
local token = ARGV[1]
local taken_request = ARGV[2]
local reply_ttl_ms = ARGV[3]
local holder = redis.call('GET', lock_key)
if holder and holder ~= token then return {0, 0, 0} end
local released = 0
local rerun = 0
if holder then
  released = redis.call('DEL', lock_key)
  rerun = redis.call('DEL', rerun_key)
  redis.call('SET', reply_key, 'released ' .. token .. ' ' .. rerun, 'PX', reply_ttl_ms)
else
  local before = redis.call('GET', reply_key)
  if before == 'released ' .. token .. ' 1' then
    released, rerun = 1, 1
  elseif before == 'released ' .. token .. ' 0' then
    released = 1
  end
  rerun = math.max(rerun, redis.call('DEL', rerun_key))
end
local requested = 0
local waiting = redis.call('GET', requested_key)
if waiting and (taken_request == '' or cjson.decode(waiting)['request_id'] ~= taken_request) then
  requested = 1
end
return {released, rerun, requested}
