-- Undoes a 'queued' submit whose task message could not be sent, so that the next submission
-- queues afresh rather than coalescing into a task that does not exist. Only if the flag still
-- holds that revision: an evaluation may have taken it meanwhile (the reconciler's) and another
-- submission set it again. Should that one carry the same revision, it loses its flag while its
-- task exists, which costs at most one extra evaluation later: never a flag without a task.
local queued_key = KEYS[1]
local revision = ARGV[1]
if redis.call('GET', queued_key) == revision then return redis.call('DEL', queued_key) end
return 0
