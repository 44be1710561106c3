-- aq_job_v1: the job state machine. Only these functions change `state`, and
-- aeroqueue/hotpath.py, which does the common case of `claim` (a queued job)
-- and `complete` (a claim acknowledged in time by its holder) as native
-- operations with the same writes, leaving every other case to these functions:
-- a change here must be made there too.
--
-- Keyspace: set aq_job, key "<list>/<token>". Bins:
--   list     string    the list's name
--   token    integer   ordinal in the list: the job's completion bit
--   jid      string    the customer's job id
--   payload  any       what the handler gets
--   state    'queued' | 'delayed' | 'claimed' | 'done' | 'dead' | 'void'
--            ('delayed': not reservable before `due`; 'void': a token whose job
--            turned out to be a duplicate; never reserved)
--   due      integer   delayed only: server ms from which it may be claimed
--   rid      string    the request id of the claim: a claim retried after a lost
--                      answer (a timeout) is recognised as the same claim
--   sess     string    the session holding the claim, only while it is claimed: a
--                      secondary index on it lets the reaper find a session's claims
--                      without scanning every job
--   dl       integer   claimed only: server ms when the claim's time limit runs out
--   tl       integer   claimed only: the limit (ms) granted at the last claim or
--                      touch, so a query finds overdue claims by the server's own
--                      clock: SinceUpdateTime >= tl
--   by       string    the session that completed, failed or released it last (so a
--                      repeated acknowledgement is recognised)
--   att      integer   claims so far (a snooze and a graceful release give one back)
--   max_att  integer   attempts before the job goes dead
--   c        integer   the list's `created` when the load wrote it: which list of
--                      the name it belongs to (a list dropped and made again, a
--                      loader stopped past its lease); absent on older records
--   claimed  integer   server ms of the last claim
--   done_at  integer   server ms of completion or death; after the last kick (`ended_at`)
--   result   any       complete()'s result
--   err      string    the last failure
--   errs     list      the last 10 failures, oldest first: map{at, err}
--   synced   integer   server ms when the sync copied it to MySQL (absent: not yet)
--   tx       string    the id the call (fail, expire, release) that ended the last
--                      claim gave, when it gave one (a reaper's for its pass, a holder's
--                      the claim's request id): its repeat is told from the same call
--                      made by another (see `repeated`); 'kick' after a kick, which
--                      no call's repeat matches
--   snz      string    the request id of the last claim that ended snoozed: a snooze
--                      repeated after a lost answer is told from one after a fail
--   kicked   integer   server ms of the last kick, later than the end it undid and
--                      than the kick before (`kick`). A kicked job is pushed onto the
--                      retry store and may still lie ahead in the token store (buried
--                      or delayed before it was ever handed out): a reservation that
--                      reaches it there claims it instead of leasing it (queue.py,
--                      `_lease`), so that its two copies are fenced by one claim
--   swept    integer   server ms when a sweeper last offered it again, written
--                      natively (aeroqueue/sessions.py, `_fence`) under a generation check
--   off      string    who offered it again since its last claim ended: the call that
--                      ended it, when it offers the job itself right after ('own': a
--                      holder's own fail, expire or release, its `off` argument), or,
--                      written natively afterwards, the release pass's `tx` or 'sweep'
--                      (aeroqueue/sessions.py, `_offer` and `_fence`)
--
-- States (README, "The life of a job"): queued -> claimed -> done;
-- claimed -> queued | delayed (fail or time limit with attempts left: delayed
-- when a backoff applies; release; snooze); claimed -> dead (attempts used
-- up; bury); delayed -> claimed once due; dead | delayed -> queued (kick);
-- queued | delayed -> dead (bury).
-- Every function returns a status value instead of raising, so a batch call
-- (batch_apply) reports each job's outcome. Every function but `synced` takes
-- an argument `deadline`, its last but for those added after it (a caller that
-- predates them leaves them out: nil), and answers 'stale' (changing nothing) when
-- the server runs it past it (see `stale` below).

local ERRS_KEPT = 10

local function now()
  return aerospike:get_current_time()
end

-- When a job ends (done or dead) at server time `t`: `t`, but after its last kick,
-- which is itself after every earlier end (`kick`). So each end of a job is later
-- than the one before, even on a clock set back since (a step back, or a record
-- moved to a node whose clock is behind): the sync's upsert keeps the latest
-- `done_at` of a job, and its mark is the `done_at` it copied. A later end at an
-- earlier time would be kept out of the copy, marked as copied, and deleted.
local function ended_at(rec, t)
  local k = rec['kicked']
  if k ~= nil and k >= t then return k + 1 end
  return t
end

-- The error history keeps the last ERRS_KEPT failures.
local function add_err(rec, t, why)
  rec['err'] = why
  local old = rec['errs']
  local errs = list()
  if old ~= nil then
    local n = list.size(old)
    local from = 1
    if n >= ERRS_KEPT then from = n - ERRS_KEPT + 2 end
    for i = from, n do list.append(errs, old[i]) end
  end
  list.append(errs, map{at = t, err = why})
  rec['errs'] = errs
end

-- A claimed record's claim ends: no holder, no time limit.
local function unclaim(rec, sess)
  rec['sess'] = nil
  rec['dl'] = nil
  rec['tl'] = nil
  rec['by'] = sess
end

-- Back to waiting: 'queued' at once, or 'delayed' for delay_ms (server clock).
local function requeue(rec, t, delay_ms)
  if delay_ms ~= nil and delay_ms > 0 then
    rec['state'] = 'delayed'
    rec['due'] = t + delay_ms
    return 'delayed'
  end
  rec['state'] = 'queued'
  rec['due'] = nil
  return nil
end

-- Ends `sess`'s claim as a failed attempt (fail, time limit, release): the job
-- goes dead when `dead`, else back to waiting, answering `queued_status` (or
-- 'delayed' when a backoff applies). The session moves to `by`, and the call's
-- id ('' for none) to `tx`, so a retried call is recognised. `off`: the mark of
-- a caller that offers the job itself right after (a holder: a marking write of
-- its own would cost its every failure a round trip), so that a reaper recounting
-- the session, reaped meanwhile, leaves the job to it. nil: not offered yet.
local function end_claim(rec, sess, why, dead, queued_status, delay_ms, tx, off)
  local t = now()
  add_err(rec, t, why)
  unclaim(rec, sess)
  rec['tx'] = tx or ''
  rec['off'] = off
  if dead then
    rec['state'] = 'dead'
    rec['done_at'] = ended_at(rec, t)
    aerospike:update(rec)
    return 'dead'
  end
  local st = requeue(rec, t, delay_ms) or queued_status
  aerospike:update(rec)
  return st
end

-- Whether the caller's claim is the record's claim: its session, and its request
-- id when it gives one ('' or nil: any claim of the session). A session can
-- claim the same job twice (its first claim timed out and the job came back):
-- only the request id tells an ack of the old claim from one of the new.
local function same_claim(rec, rid)
  return rid == nil or rid == '' or rec['rid'] == rid
end

local function holds(rec, sess, rid)
  return rec['state'] == 'claimed' and rec['sess'] == sess and same_claim(rec, rid)
end

-- An answer that repeats a transition already made by `sess` (its first answer
-- was lost): the outcome it had, or nil. Reapers end the claims of a session
-- they do not own, and two of them (every worker runs one) may end the same
-- claim at once, with the same error: each gives its call an id (`tx`), so that
-- only a repeat of the call that made the transition answers as it did. The
-- other answers 'lost' or 'not held', and does not offer the job a second time.
-- The holder's own call gives one too, its claim's request id (the same for every
-- repeat of it): a reaper's call with the same error is not taken for its repeat.
local function repeated(rec, sess, why, queued_status, rid, tx)
  if rec['by'] ~= sess or rec['err'] ~= why or not same_claim(rec, rid) then return nil end
  if tx ~= nil and rec['tx'] ~= tx then return nil end
  local state = rec['state']
  if state == 'dead' then return 'dead' end
  if state == 'delayed' then return 'delayed' end
  if state == 'queued' then return queued_status end
  return nil
end

-- A request the server runs after its sender gave up on it changes nothing. The
-- sender passes `deadline` (Unix ms, its clock): when it sent the call, plus its
-- timeout, plus a margin for clock skew. Past it, the client has already counted
-- the call as in doubt and repeated it elsewhere; a node that was frozen (SIGSTOP,
-- a VM pause) longer than that and resumes runs the calls that waited in its
-- sockets on its stale copy, and Aerospike CE then lets its replica writes replace
-- the newer copy the rest of the cluster made meanwhile (replica writes are
-- resolved by last-update time, and the replayed write is the latest): an
-- acknowledged transition would be undone (README, "Running on a cluster").
-- nil (older clients, the embedded store): no such limit.
local function stale(deadline)
  return deadline ~= nil and now() > deadline
end

-- A record of another list of the name than the caller's (`created`: the stamp it
-- read; nil: not checked): that list was dropped and loaded again since, and this
-- job is the new list's. A record without a stamp was written before stamps were.
local function other_list(rec, created)
  return created ~= nil and rec['c'] ~= nil and rec['c'] ~= created
end

local function late(rec, t)
  local dl = rec['dl']
  return dl ~= nil and t > dl
end

-- claim(rec, sess, rid, tlim, deadline, created)
--     -> map{st='ok', jid, payload, att, token, dl, c}
--      | map{st='delayed', due, wait, token, c} (wait: ms until due)
--      | map{st='other', c}
--      | map{st='missing'|'void'|'claimed'|'done'|'dead'|'stale'}
--   queued (or delayed and due) -> claimed under session `sess`, with a time
--   limit of `tlim` ms; att + 1. The same call repeated (same sess and rid: its
--   first answer was lost) answers 'ok' again, so a claim in doubt can be
--   retried instead of being stranded. c: the list's stamp (its `created`), which a
--   job offered again carries to its list (aq_list_v1's push_retry and schedule).
--   `created`: the stamp of the list the token was taken from (nil: not checked).
--   A record of another stamp is another list of the name, dropped and loaded
--   again since the take: 'other', unclaimed. Its own takes hand it out, leased
--   from its block entry without a claim, so a claim here would run it twice.
--   A record without a stamp (written before stamps were) is claimed.
function claim(rec, sess, rid, tlim, deadline, created)
  if stale(deadline) then return map{st = 'stale'} end
  if not aerospike:exists(rec) then return map{st = 'missing'} end
  if other_list(rec, created) then return map{st = 'other', c = rec['c']} end
  local state = rec['state']
  if state == 'claimed' and rec['sess'] == sess and rid ~= nil and rec['rid'] == rid then
    return map{st = 'ok', jid = rec['jid'], payload = rec['payload'], att = rec['att'], token = rec['token'], dl = rec['dl'],
               c = rec['c']}
  end
  local t = now()
  if state == 'delayed' then
    if rec['due'] ~= nil and rec['due'] > t then
      return map{st = 'delayed', due = rec['due'], wait = rec['due'] - t, token = rec['token'], c = rec['c']}
    end
  elseif state ~= 'queued' then
    return map{st = state}
  end
  local att = (rec['att'] or 0) + 1
  tlim = tlim or 300000
  rec['state'] = 'claimed'
  rec['due'] = nil
  rec['sess'] = sess
  rec['rid'] = rid
  rec['att'] = att
  rec['claimed'] = t
  rec['dl'] = t + tlim
  rec['tl'] = tlim
  aerospike:update(rec)
  return map{st = 'ok', jid = rec['jid'], payload = rec['payload'], att = att, token = rec['token'], dl = t + tlim,
             c = rec['c']}
end

-- complete(rec, sess, results, rid, deadline) -> 'ok' | 'again' | 'lost' | 'late' | 'missing' | 'stale'
--   claimed by `sess` (under request id `rid`, if given) -> done. `results` is a map token -> result, so that
--   one batch call completes many jobs (batch_apply passes one argument list
--   to every record). 'again': already done by this session (a retried ack,
--   harmless). 'lost': the claim is not this session's any more. 'late': the
--   claim's time limit ran out: the result is refused, and the job is retried.
function complete(rec, sess, results, rid, deadline)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  local state = rec['state']
  if state == 'done' and rec['by'] == sess and same_claim(rec, rid) then return 'again' end
  if not holds(rec, sess, rid) then return 'lost' end
  local t = now()
  if late(rec, t) then return 'late' end
  unclaim(rec, sess)
  rec['state'] = 'done'
  rec['done_at'] = ended_at(rec, t)
  rec['result'] = results[rec['token']]
  aerospike:update(rec)
  return 'ok'
end

-- fail(rec, sess, err, delay_ms, rid, deadline, tx, off) -> 'retry' | 'delayed' | 'dead' | 'lost' | 'late' | 'missing' | 'stale'
--   claimed by `sess` -> waiting again while attempts remain: 'delayed' for
--   delay_ms (the backoff) when it is positive, else 'retry' (the caller
--   offers it again), or 'dead' (the caller sets its dead bit). The error joins
--   the job's history. A retried fail that already took effect answers the same,
--   so the caller redoes its (idempotent) follow-up. 'late': the time limit ran
--   out first; the reaper records that failure instead. `tx`, `off` (nil: none):
--   the call's id (see `repeated`) and its mark (see `end_claim`).
function fail(rec, sess, err, delay_ms, rid, deadline, tx, off)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  if not holds(rec, sess, rid) then return repeated(rec, sess, err, 'retry', rid, tx) or 'lost' end
  if late(rec, now()) then return 'late' end
  return end_claim(rec, sess, err, rec['att'] >= rec['max_att'], 'retry', delay_ms, tx, off)
end

-- expire(rec, sess, delay_ms, why, rid, deadline, tx, off) -> 'retry' | 'delayed' | 'dead' | 'early' | 'lost' | 'missing' | 'stale'
--   A claim of `sess` past its time limit ends as a failed attempt whose error
--   is `why` (the reaper, or the worker that stopped waiting for the handler).
--   'early': the limit has not run out by the server's clock; nothing changes.
--   `tx`, `off` (nil: none): the call's id (see `repeated`) and its mark (see `end_claim`).
function expire(rec, sess, delay_ms, why, rid, deadline, tx, off)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  if not holds(rec, sess, rid) then return repeated(rec, sess, why, 'retry', rid, tx) or 'lost' end
  if not late(rec, now()) then return 'early' end
  return end_claim(rec, sess, why, rec['att'] >= rec['max_att'], 'retry', delay_ms, tx, off)
end

-- release(rec, sess, refund, why, rid, deadline, tx, off) -> 'released' | 'dead' | 'not held' | 'missing' | 'stale'
--   claimed by `sess` -> queued (a session closing or reaped gives its jobs
--   back). refund = 1 returns the attempt (a graceful release); a reaped
--   session's claim keeps it, so a job that kills its worker every time
--   ends dead instead of looping. A claim past its time limit has timed out:
--   its attempt counts whatever `refund` says (dead on the last one), as the
--   reaper's expire would count it had it come first, so the attempt a
--   time-out spends does not depend on which of the two ends the claim. A
--   retried release that already took effect answers the same, so the caller
--   redoes its follow-up. `tx`, `off`: as for expire.
function release(rec, sess, refund, why, rid, deadline, tx, off)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  if not holds(rec, sess, rid) then return repeated(rec, sess, why, 'released', rid, tx) or 'not held' end
  local att = rec['att']
  local refunded = refund == 1 and not late(rec, now())
  if refunded and att > 0 then att = att - 1 end
  rec['att'] = att
  return end_claim(rec, sess, why, not refunded and att >= rec['max_att'], 'released', 0, tx, off)
end

-- snooze(rec, sess, delay_ms, rid, deadline) -> 'delayed' | 'lost' | 'late' | 'missing' | 'stale'
--   The handler asked to run later (Retry(after=...)): claimed by `sess` ->
--   delayed for delay_ms, the attempt given back, no error recorded.
function snooze(rec, sess, delay_ms, rid, deadline)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  local state = rec['state']
  if not holds(rec, sess, rid) then
    -- A repeat of this snooze (its answer was lost). A fail with a backoff leaves the
    -- same state, `by` and `rid`: only `snz` tells that this claim ended snoozed.
    if state == 'delayed' and rec['by'] == sess and same_claim(rec, rid) and rec['snz'] == rec['rid'] then
      return 'delayed'
    end
    return 'lost'
  end
  local t = now()
  if late(rec, t) then return 'late' end
  if rec['att'] > 0 then rec['att'] = rec['att'] - 1 end
  rec['snz'] = rec['rid']
  unclaim(rec, sess)
  requeue(rec, t, math.max(delay_ms, 1))
  aerospike:update(rec)
  return 'delayed'
end

-- touch(rec, sess, tlim, rid, deadline) -> map{st='ok', dl} | map{st='lost'|'late'|'missing'|'stale'}
--   The handler needs longer: the claim's limit becomes `tlim` ms from now.
function touch(rec, sess, tlim, rid, deadline)
  if stale(deadline) then return map{st = 'stale'} end
  if not aerospike:exists(rec) then return map{st = 'missing'} end
  if not holds(rec, sess, rid) then return map{st = 'lost'} end
  local t = now()
  if late(rec, t) then return map{st = 'late'} end
  rec['dl'] = t + tlim
  rec['tl'] = tlim
  aerospike:update(rec)
  return map{st = 'ok', dl = t + tlim}
end

-- kick(rec, deadline, dead_only, created) -> 'ok' | 'not kickable' | 'missing' | 'other' | 'stale'
--   dead -> queued with fresh attempts, or delayed -> queued now (an
--   operator's decision). Replayed late on a stale copy, a kick would bring back,
--   queued, a job the cluster has since run and completed: hence the deadline.
--   dead_only = 1: a delayed job is not kickable (a kick of the jobs an operator
--   saw dead: one kicked by another since and delayed again by its backoff keeps it).
--   created: the stamp of the list the operator kicks in (nil: not checked); a
--   record of another stamp is another list's of the name, dropped and loaded again
--   since: 'other', unchanged (as `claim`).
function kick(rec, deadline, dead_only, created)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  if other_list(rec, created) then return 'other' end
  local state = rec['state']
  if state == 'dead' then
    rec['att'] = 0
  elseif state ~= 'delayed' or dead_only == 1 then
    return 'not kickable'
  end
  -- After the end it undoes and after any kick before (`ended_at`).
  rec['kicked'] = math.max(now(), (rec['done_at'] or 0) + 1, (rec['kicked'] or 0) + 1)
  rec['state'] = 'queued'
  rec['due'] = nil
  rec['done_at'] = nil
  rec['synced'] = nil  -- it will be processed again, so copied again
  -- A call that ended the claim before, repeated after its answer was lost, is no
  -- repeat of anything once the job was kicked (`repeated`): it would answer as then
  -- ('retry' for a job that went dead) and its caller would offer the job again. An
  -- id no call gives, not none: a reaper's offer mark takes a job with no `tx` for
  -- one written before `tx` was (sessions.py, `_offer`), and would offer it again.
  rec['tx'] = 'kick'
  aerospike:update(rec)
  return 'ok'
end

-- bury(rec, why, deadline, created) -> 'dead' | 'done' | 'void' | 'missing' | 'other' | 'stale'
--   queued, delayed or claimed -> dead (an operator's decision; a holder's
--   acknowledgement is then refused). Burying a dead job answers 'dead' again.
--   created: the stamp of the job the operator named, as read; 'other' as for `kick`.
function bury(rec, why, deadline, created)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'missing' end
  if other_list(rec, created) then return 'other' end
  local state = rec['state']
  if state == 'dead' or state == 'done' or state == 'void' then return state end
  local t = now()
  add_err(rec, t, why)
  unclaim(rec, 'operator')
  rec['state'] = 'dead'
  rec['due'] = nil
  rec['done_at'] = ended_at(rec, t)
  aerospike:update(rec)
  return 'dead'
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
