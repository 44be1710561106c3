-- aq_sess_v1: heartbeat sessions.
--
-- Keyspace: set aq_sess, key "<session id>". Bins:
--   state    'alive' | 'reaping'
--   host     string    where the process runs (for operators)
--   pid      integer   its process id (for operators)
--   started  integer   server ms when the session opened
--   exp      integer   expiry in ms: a session whose record was not updated
--                      for this long (by the server's last-update time) is dead
--   beat     integer   server ms of the last heartbeat
--
-- Liveness is judged by the server's clock only: the heartbeat is a write,
-- which moves the record's last-update time; the reaper compares that with
-- the server's now (SinceUpdateTime). Worker clocks are never compared.
-- The reaper moves alive -> reaping with a generation check (a plain put),
-- releases the session's claims, then deletes the record.

-- open(rec, host, pid, exp) -> 'ok' | 'exists'
function open(rec, host, pid, exp)
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

-- beat(rec) -> 'ok' | 'gone' | 'reaping'
--   Keeps an alive session alive. 'gone' (deleted by a reaper or a close) and
--   'reaping' tell the worker to stop taking work and to acknowledge nothing
--   it holds: its claims are being, or have been, given to others.
function beat(rec)
  if not aerospike:exists(rec) then return 'gone' end
  if rec['state'] ~= 'alive' then return 'reaping' end
  rec['beat'] = aerospike:get_current_time()
  aerospike:update(rec)
  return 'ok'
end
