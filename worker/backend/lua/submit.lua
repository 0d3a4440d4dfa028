-- A submission: the snapshot stored and the newest revision raised together, refused
-- ('superseded') for a revision older than the newest submitted or not newer than the newest
-- handled; an evaluation queued unless one is already ('coalesced'). The queued flag holds the
-- submission's id (its revision when none is given), so that this script run again for the
-- same submission (a client retrying after the reply was lost) answers 'queued' again: its
-- evaluation was never sent. Replies {status, revision}.
local snapshot_key = KEYS[1]
local latest_key = KEYS[2]
local queued_key = KEYS[3]
local handled_key = KEYS[4]
local payload = ARGV[1]
local revision = ARGV[2]
local ttl_s = ARGV[3]
local submission = ARGV[4]
if not submission or submission == '' then submission = revision end
local latest = tonumber(redis.call('GET', latest_key) or '-1')
local handled = tonumber(redis.call('GET', handled_key) or '-1')
local rev = tonumber(revision)
if rev < latest or rev <= handled then return {'superseded', math.max(latest, handled)} end
redis.call('SET', snapshot_key, payload, 'EX', ttl_s)
redis.call('SET', latest_key, revision, 'EX', ttl_s)
if redis.call('SET', queued_key, submission, 'NX', 'EX', ttl_s) then return {'queued', rev} end
if submission ~= revision and redis.call('GET', queued_key) == submission then
  return {'queued', rev}
end
return {'coalesced', rev}
