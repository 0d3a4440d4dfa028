-- Releases the lock while the token is still the holder's, and takes the re-run flag in the
-- same step, so that a flag set while the lock was held (defer.lua) is always taken by the one
-- releasing: never set after the last holder looked. While another worker holds the lock (this
-- lease was lost) the flag is left for that one. Also says whether a compaction on demand
-- waits (it was stored before its task was sent, so a task that found the lock held is
-- answered by this release), unless it is the request this holder took itself (taken_request:
-- its id; a request it could not finish must not queue itself at every release). Replies
-- {released, rerun, requested}: 1 or 0 each.
local lock_key = KEYS[1]
local rerun_key = KEYS[2]
local requested_key = KEYS[3]
local token = ARGV[1]
local taken_request = ARGV[2]
local holder = redis.call('GET', lock_key)
if holder and holder ~= token then return {0, 0, 0} end
local released = 0
if holder then released = redis.call('DEL', lock_key) end
local rerun = redis.call('DEL', rerun_key)
local requested = 0
local waiting = redis.call('GET', requested_key)
if waiting and (taken_request == '' or cjson.decode(waiting)['request_id'] ~= taken_request) then
  requested = 1
end
return {released, rerun, requested}
