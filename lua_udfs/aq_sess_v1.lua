-- aq_sess_v1: heartbeat sessions.
--
-- Keyspace: set aq_sess, key "<session id>". Bins:
--   state    'alive' | 'reaping'
--   host     string    where the process runs (for operators)
--   pid      integer   its process id (for operators)
--   started  integer   server ms when the session opened
--   exp      integer   expiry in ms: a session whose last heartbeat is older
--                      than this (by the server's clock) is dead
--   beat     integer   server ms of the last heartbeat (open, beat and lease
--                      are heartbeats; unlease, a reaper's write, is not)
--   leases   map id -> list{list, until, groups}   jobs the session holds without a
--                      claim on their records (Queue.reserve(..., lease=True)):
--                      id is the lease's own request id (claims made from it
--                      carry it), until the server ms its time limit ends,
--                      groups a list of list{att, claimed, tokens, created}:
--                      the jobs' attempt count and last claim time as read,
--                      which any later claim changes, and their list's stamp
--                      (bin c), which a list loaded again under the name
--                      changes (the ack's fence)
--
-- Liveness is judged by the server's clock only: each heartbeat stores the
-- server's now in `beat`, and the reaper compares it with the server's now
-- (last-update time plus SinceUpdateTime). Not the record's last-update time
-- itself: a reaper's own write (unlease, ending a live session's overdue
-- leases) would then make a session that died just before look alive for one
-- more expiry. Worker clocks are never compared.
-- The reaper moves alive -> reaping with a generation check (a native write,
-- filtered on the deadline below where there is one: sessions.py, `_take_for_reaping`),
-- turns the session's leases into claims, releases its claims, then deletes
-- the record.
--
-- `deadline` (Unix ms, the sender's clock plus its timeout and a margin, as for
-- aq_job_v1's functions; nil: none): past it a call answers 'stale' and changes
-- nothing. A node frozen past the heartbeat timeout runs, when it resumes, the
-- calls that waited in its sockets on its stale copy, and its replica write then
-- replaces the record the rest of the cluster made meanwhile (README, "Running on
-- a cluster"): a replayed beat or unlease wrote back the session as it was, and
-- the leases made since were gone, so a sweep offered their jobs to others while
-- the live session still ran them.
local function stale(deadline)
  return deadline ~= nil and aerospike:get_current_time() > deadline
end

-- open(rec, host, pid, exp, deadline) -> 'ok' | 'exists' | 'stale'
function open(rec, host, pid, exp, deadline)
  if stale(deadline) then return 'stale' end
  if aerospike:exists(rec) then return 'exists' end
  local now = aerospike:get_current_time()
  rec['state'] = 'alive'
  rec['host'] = host
  rec['pid'] = pid
  rec['started'] = now
  rec['exp'] = exp
  rec['beat'] = now
  aerospike:create(rec)
  return 'ok'
end

-- beat(rec, settled, deadline) -> 'ok' | 'gone' | 'reaping' | 'stale'
--   Keeps an alive session alive. 'gone' (deleted by a reaper or a close) and
--   'reaping' tell the worker to stop taking work and to acknowledge nothing
--   it holds: its claims are being, or have been, given to others. `settled`
--   (nil: none): ids of leases whose every job was acknowledged or claimed, to
--   forget now rather than with the next lease (a session that stops leasing
--   would keep them until it closes).
function beat(rec, settled, deadline)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 'gone' end
  if rec['state'] ~= 'alive' then return 'reaping' end
  rec['beat'] = aerospike:get_current_time()
  local leases = rec['leases']
  if settled ~= nil and leases ~= nil then
    for s in list.iterator(settled) do map.remove(leases, s) end
    rec['leases'] = leases
  end
  aerospike:update(rec)
  return 'ok'
end

-- lease(rec, id, entry, settled[, by]) -> 'ok' | 'gone' | 'reaping' | 'late'
--   Records lease `id` (entry: list{list, until, groups}) and forgets the leases
--   in `settled` (ids whose every job was acknowledged or claimed). Only for an
--   alive session: a session being reaped takes no more work. It also counts
--   as a heartbeat. `by` (server ms, optional): 'late', and nothing written,
--   past it. A sweep reads the leases a while after the stores' heads and
--   offers again what no lease holds: a lease that lands later (its writer was
--   frozen after sending it, or a node held it) would hold jobs someone else
--   may have claimed meanwhile. The caller claims them instead: a claim fences.
function lease(rec, id, entry, settled, by)
  if not aerospike:exists(rec) then return 'gone' end
  if rec['state'] ~= 'alive' then return 'reaping' end
  if by ~= nil and aerospike:get_current_time() > by then return 'late' end
  rec['beat'] = aerospike:get_current_time()
  local leases = rec['leases'] or map()
  for s in list.iterator(settled) do map.remove(leases, s) end
  leases[id] = entry
  rec['leases'] = leases
  aerospike:update(rec)
  return 'ok'
end

-- unlease(rec, ids, deadline) -> integer | 'stale'
--   Forgets leases (turned into claims, or settled at close); answers how many
--   remain. Whatever the session's state: the reaper calls it too.
function unlease(rec, ids, deadline)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 0 end
  local leases = rec['leases']
  if leases == nil then return 0 end
  for s in list.iterator(ids) do map.remove(leases, s) end
  rec['leases'] = leases
  aerospike:update(rec)
  return map.size(leases)
end
