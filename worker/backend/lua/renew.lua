-- Extends the lock's lease while the token is still the holder's: 1, else 0.
local lock_key = KEYS[1]
local token = ARGV[1]
local lease_ms = ARGV[2]
if redis.call('GET', lock_key) == token then
  return redis.call('PEXPIRE', lock_key, lease_ms)
end
return 0
