-- Forgets a request once its outcome is published, unless a newer one replaced it meanwhile.
local requested_key = KEYS[1]
local request_id = ARGV[1]
local request = redis.call('GET', requested_key)
if request and cjson.decode(request)['request_id'] == request_id then
  return redis.call('DEL', requested_key)
end
return 0
