-- Takes the conversation's lock with a fresh fencing token unless another worker holds it or
-- (unless_handled, when given) that revision has an outcome already: {'taken', token},
-- {'held'} or {'handled'}.
local lock_key = KEYS[1]
local fence_key = KEYS[2]
local handled_key = KEYS[3]
local lease_ms = ARGV[1]
local fence_ttl_s = ARGV[2]
local unless_handled = ARGV[3]
if unless_handled ~= ''
    and tonumber(redis.call('GET', handled_key) or '-1') >= tonumber(unless_handled) then
  return {'handled'}
end
if redis.call('EXISTS', lock_key) == 1 then return {'held'} end
local token = redis.call('INCR', fence_key)
redis.call('EXPIRE', fence_key, fence_ttl_s)
redis.call('SET', lock_key, token, 'PX', lease_ms)
return {'taken', tostring(token)}
