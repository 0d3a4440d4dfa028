-- Takes the conversation's lock with a fresh fencing token unless another worker holds it or
-- (unless_handled, when given) that revision has an outcome already: {'taken', token},
-- {'held'} or {'handled'}. The taking is remembered beside the lock by its claim (the id of
-- this taking), so that the script run again with the same claim (its reply was lost and the
-- client sent it again) answers {'taken', token} for the lock it took, not {'held'}.
local lock_key = KEYS[1]
local fence_key = KEYS[2]
local handled_key = KEYS[3]
local reply_key = KEYS[4]
local lease_ms = ARGV[1]
local fence_ttl_s = ARGV[2]
local unless_handled = ARGV[3]
local claim = ARGV[4]
if unless_handled ~= ''
    and tonumber(redis.call('GET', handled_key) or '-1') >= tonumber(unless_handled) then
  return {'handled'}
end
local holder = redis.call('GET', lock_key)
if holder then
  if redis.call('GET', reply_key) == 'taken ' .. claim .. ' ' .. holder then
    return {'taken', holder}
  end
  return {'held'}
end
local token = tostring(redis.call('INCR', fence_key))
redis.call('EXPIRE', fence_key, fence_ttl_s)
redis.call('SET', lock_key, token, 'PX', lease_ms)
redis.call('SET', reply_key, 'taken ' .. claim .. ' ' .. token, 'PX', lease_ms)
return {'taken', token}
