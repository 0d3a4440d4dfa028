-- Undoes a 'queued' submit whose task message could not be sent, so that the next submission
-- queues afresh rather than coalescing into a task that does not exist. Only if the flag still
-- holds that submission's id (its revision, for a submission that gave none): an evaluation
-- may have taken it meanwhile (the reconciler's) and another submission set it again.
local queued_key = KEYS[1]
local submission = ARGV[1]
if redis.call('GET', queued_key) == submission then return redis.call('DEL', queued_key) end
return 0
