-- aq_job_v1: the job state machine. Only these functions change `state`.
--
-- Keyspace: set aq_job, key "<list>/<token>". Bins:
--   list     string    the list's name
--   token    integer   ordinal in the list: the job's completion bit
--   jid      string    the customer's job id
--   payload  any       what the handler gets
--   state    'queued' | 'claimed' | 'done' | 'dead' | 'void'
--            ('void': a token whose job turned out to be a duplicate; never reserved)
--   rid      string    the request id of the claim: a claim retried after a lost
--                      answer (a timeout) is recognised as the same claim
--   sess     string    the session holding the claim, only while it is claimed: a
--                      secondary index on it lets the reaper find a dead
--                      session's claims without scanning every job
--   by       string    the session that completed, failed or released it last (so a
--                      repeated acknowledgement is recognised)
--   att      integer   claims so far
--   max_att  integer   attempts before the job goes dead
--   claimed  integer   server ms of the last claim
--   done_at  integer   server ms of completion or death
--   result   any       complete()'s result
--   err      string    the last failure
--   synced   integer   server ms when the sync copied it to MySQL (absent: not yet)
--
-- States: queued -> claimed -> done; claimed -> queued (fail with attempts
-- left, release); claimed -> dead (attempts used up); dead -> queued (kick).
-- Every function returns a status value instead of raising, so a batch call
-- (batch_apply) reports each job's outcome.

local function now()
  return aerospike:get_current_time()
end

-- Ends `sess`'s claim (fail, release): the job goes dead when `dead`, else back
-- to the queue, answering `queued_status`. The session moves to `by`, so a
-- retried call is recognised.
local function end_claim(rec, sess, why, dead, queued_status)
  rec['err'] = why
  rec['sess'] = nil
  rec['by'] = sess
  if dead then
    rec['state'] = 'dead'
    rec['done_at'] = now()
    aerospike:update(rec)
    return 'dead'
  end
  rec['state'] = 'queued'
  aerospike:update(rec)
  return queued_status
end

-- claim(rec, sess, rid) -> map{st='ok', jid, payload, att, token}
--                        | map{st='missing'|'void'|'claimed'|'done'|'dead'}
--   queued -> claimed under session `sess`; att + 1. The same call repeated
--   (same sess and rid: its first answer was lost) answers 'ok' again, so a
--   claim in doubt can be retried instead of being stranded.
function claim(rec, sess, rid)
  if not aerospike:exists(rec) then return map{st = 'missing'} end
  local state = rec['state']
  if state == 'claimed' and rec['sess'] == sess and rid ~= nil and rec['rid'] == rid then
    return map{st = 'ok', jid = rec['jid'], payload = rec['payload'], att = rec['att'], token = rec['token']}
  end
  if state ~= 'queued' then return map{st = state} end
  local att = (rec['att'] or 0) + 1
  rec['state'] = 'claimed'
  rec['sess'] = sess
  rec['rid'] = rid
  rec['att'] = att
  rec['claimed'] = now()
  aerospike:update(rec)
  return map{st = 'ok', jid = rec['jid'], payload = rec['payload'], att = att, token = rec['token']}
end

-- complete(rec, sess, results) -> 'ok' | 'again' | 'lost' | 'missing'
--   claimed by `sess` -> done. `results` is a map token -> result, so that
--   one batch call completes many jobs (batch_apply passes one argument list
--   to every record). 'again': already done by this session (a retried ack,
--   harmless). 'lost': the claim is not this session's any more.
function complete(rec, sess, results)
  if not aerospike:exists(rec) then return 'missing' end
  local state = rec['state']
  if state == 'done' and rec['by'] == sess then return 'again' end
  if state ~= 'claimed' or rec['sess'] ~= sess then return 'lost' end
  rec['state'] = 'done'
  rec['sess'] = nil
  rec['by'] = sess
  rec['done_at'] = now()
  rec['result'] = results[rec['token']]
  aerospike:update(rec)
  return 'ok'
end

-- fail(rec, sess, err) -> 'retry' | 'dead' | 'lost' | 'missing'
--   claimed by `sess` -> queued while attempts remain ('retry': the caller
--   pushes the token to the retry store), else 'dead' (the caller sets its
--   dead bit). A retried fail that already took effect answers the same, so
--   the caller redoes its (idempotent) follow-up.
function fail(rec, sess, err)
  if not aerospike:exists(rec) then return 'missing' end
  local state = rec['state']
  if state ~= 'claimed' or rec['sess'] ~= sess then
    if rec['by'] == sess and rec['err'] == err then
      if state == 'queued' then return 'retry' end
      if state == 'dead' then return 'dead' end
    end
    return 'lost'
  end
  return end_claim(rec, sess, err, rec['att'] >= rec['max_att'], 'retry')
end

-- release(rec, sess, refund, why) -> 'released' | 'dead' | 'not held' | 'missing'
--   claimed by `sess` -> queued (a session closing or reaped gives its jobs
--   back). refund = 1 returns the attempt (a graceful release); a reaped
--   session's claim keeps it, so a job that kills its worker every time
--   ends dead instead of looping. A retried release that already took effect
--   answers the same, so the caller redoes its follow-up.
function release(rec, sess, refund, why)
  if not aerospike:exists(rec) then return 'missing' end
  if rec['state'] ~= 'claimed' or rec['sess'] ~= sess then
    if rec['by'] == sess and rec['err'] == why then
      if rec['state'] == 'queued' then return 'released' end
      if rec['state'] == 'dead' then return 'dead' end
    end
    return 'not held'
  end
  local att = rec['att']
  if refund == 1 and att > 0 then att = att - 1 end
  rec['att'] = att
  return end_claim(rec, sess, why, refund ~= 1 and att >= rec['max_att'], 'released')
end

-- kick(rec) -> 'ok' | 'not dead' | 'missing'
--   dead -> queued with fresh attempts (an operator's decision).
function kick(rec)
  if not aerospike:exists(rec) then return 'missing' end
  if rec['state'] ~= 'dead' then return 'not dead' end
  rec['state'] = 'queued'
  rec['att'] = 0
  rec['done_at'] = nil
  rec['synced'] = nil  -- it will be processed again, so copied again
  aerospike:update(rec)
  return 'ok'
end

-- synced(rec, state, done_at, at) -> 'ok' | 'changed' | 'missing'
--   The sync copied this job to MySQL as it was when it read `state` and
--   `done_at`: set synced = at, unless the job has moved on since (kicked,
--   and maybe processed again), which must be copied again: 'changed', and
--   the next sync picks it up. `state` and `done_at` may also be maps
--   token -> value, so that one batch call marks many jobs of one list
--   (batch_apply passes one argument list to every record).
function synced(rec, state, done_at, at)
  if not aerospike:exists(rec) then return 'missing' end
  if type(state) ~= 'string' then
    local token = rec['token']
    state, done_at = state[token], done_at[token]
  end
  if state == nil or rec['state'] ~= state or rec['done_at'] ~= done_at then return 'changed' end
  rec['synced'] = at
  aerospike:update(rec)
  return 'ok'
end
