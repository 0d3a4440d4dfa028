-- The idle scan's take, for each tenant given. A tenant may have per_tenant conversations
-- handed out at once: as many of its oldest due ones as it has room for move from its index to
-- its busy set. Its place in the tenant list becomes its oldest entry's time or, while it still
-- has due entries, idle_since less a microsecond per tenant looked at after it: due at the next
-- scan, but behind every tenant due longer and in the order of this scan, so the tenants take
-- turns. Scores go back as strings of 17 digits (a Lua number is written with 14), and the
-- times given are passed on as the strings they are. Replies each tenant's taken ids.
local tenants_key = KEYS[1]
local indexes_from = 2  -- KEYS[indexes_from] onwards: each tenant's index, then its busy set
local idle_since = ARGV[1]
local expired_before = ARGV[2]
local busy_since = ARGV[3]
local per_tenant = tonumber(ARGV[4])
local now = ARGV[5]
local busy_ttl_s = ARGV[6]
local scan_left = tonumber(ARGV[7])  -- tenants this scan looks at from the first given on
local tenants_from = 8  -- ARGV[tenants_from] onwards: the tenants
local since = tonumber(idle_since)
local out = {}
for i = 1, (#KEYS - indexes_from + 1) / 2 do
  local index = KEYS[indexes_from + 2 * (i - 1)]
  local busy = KEYS[indexes_from + 2 * (i - 1) + 1]
  local tenant = ARGV[tenants_from + i - 1]
  redis.call('ZREMRANGEBYSCORE', index, '-inf', expired_before)
  redis.call('ZREMRANGEBYSCORE', busy, '-inf', busy_since)
  local room = per_tenant - redis.call('ZCARD', busy)
  local taken = {}
  if room > 0 then
    taken = redis.call('ZRANGEBYSCORE', index, '-inf', idle_since, 'LIMIT', 0, room)
  end
  if #taken > 0 then
    local scored = {}
    for k, conv in ipairs(taken) do scored[2 * k - 1], scored[2 * k] = now, conv end
    redis.call('ZREM', index, unpack(taken))
    redis.call('ZADD', busy, unpack(scored))
    redis.call('EXPIRE', busy, busy_ttl_s)
  end
  local first = redis.call('ZRANGE', index, 0, 0, 'WITHSCORES')
  if #first == 0 then
    redis.call('ZREM', tenants_key, tenant)
  elseif tonumber(first[2]) <= since then
    local behind = since - (scan_left - i) * 1e-6
    redis.call('ZADD', tenants_key, string.format('%.17g', behind), tenant)
  else
    redis.call('ZADD', tenants_key, first[2], tenant)
  end
  out[i] = taken
end
return out
