-- aq_list_v1: the list record. Token store, load publication, retry store.
--
-- Keyspace: set aq_list, key "<list>". Bins:
--   mode     'tokens' | 'ids'   how jobs are reserved (token store or ID store)
--   max_att  integer            attempts before a job goes dead
--   created  integer            server ms when the list was created
--   sealed   0 | 1              1: loading is finished, no more allocations
--   paused   0 | 1              1: reservations return nothing
--   alloc    integer            next token to allocate to a loader
--   seq      integer            next load range number to allocate
--   pubs     integer            ranges published so far (ranges publish in seq order)
--   tail     integer            tokens published: [0, tail) are written and reservable
--   total    integer            real jobs published (tokens minus void ones)
--   head     integer            next token the token store hands out (never past tail)
--   cursor   integer            ID store: the chunk reservations pop from (never moves back)
--   pend     map seq -> map{start, n, exp, real}   ranges allocated, not yet published
--   retry    list of tokens     jobs that came back: served before the token store
--   done_at  integer            server ms when status first saw the list complete
--
-- Invariant 4: a token is reservable only after its job record is written.
-- A loader allocates a range (alloc), writes the job records, then publishes
-- it (publish). Ranges publish strictly in seq order, so `tail` only ever
-- covers written ranges, whatever order concurrent loaders finish in.
--
-- Every function returns a status value rather than raising, so that it
-- reports the same way through apply and batch_apply.

local function now()
  return aerospike:get_current_time()
end

-- create(rec, mode, max_att) -> map{st='created'|'exists', mode, max_att}
--   Creates the list if missing; never changes an existing one.
function create(rec, mode, max_att)
  if aerospike:exists(rec) then
    return map{st = 'exists', mode = rec['mode'], max_att = rec['max_att']}
  end
  rec['mode'] = mode
  rec['max_att'] = max_att
  rec['created'] = now()
  rec['sealed'] = 0
  rec['paused'] = 0
  rec['alloc'] = 0
  rec['seq'] = 0
  rec['pubs'] = 0
  rec['tail'] = 0
  rec['total'] = 0
  rec['head'] = 0
  rec['cursor'] = 0
  rec['pend'] = map()
  rec['retry'] = list()
  aerospike:create(rec)
  return map{st = 'created', mode = mode, max_att = max_att}
end

-- alloc(rec, n, lease_ms) -> map{st='ok', seq, start} | map{st='missing'|'sealed'}
--   Reserves tokens [start, start+n) for one loader. The range must be
--   published within lease_ms, or `expired` offers it to recovery.
function alloc(rec, n, lease_ms)
  if not aerospike:exists(rec) then return map{st = 'missing'} end
  if rec['sealed'] == 1 then return map{st = 'sealed'} end
  local start, seq = rec['alloc'], rec['seq']
  local pend = rec['pend']
  pend[seq] = map{start = start, n = n, exp = now() + lease_ms}
  rec['pend'] = pend
  rec['alloc'] = start + n
  rec['seq'] = seq + 1
  aerospike:update(rec)
  return map{st = 'ok', seq = seq, start = start}
end

-- publish(rec, seq, real) -> map{st='ok'|'gone', tail, total}
--   Marks range `seq` written, with `real` non-void jobs, and moves `tail`
--   over every consecutive written range. Idempotent: publishing a range
--   that is already published answers 'ok' and changes nothing. 'gone': the
--   range is unknown (never allocated).
function publish(rec, seq, real)
  if not aerospike:exists(rec) then return map{st = 'gone'} end
  if seq < rec['pubs'] then return map{st = 'ok', tail = rec['tail'], total = rec['total']} end
  local pend = rec['pend']
  local r = pend[seq]
  if r == nil then return map{st = 'gone'} end
  -- First count wins: a loader and a recovery publishing the same range
  -- computed it from the same final job and index records.
  if r['real'] ~= nil then return map{st = 'ok', tail = rec['tail'], total = rec['total']} end
  r['real'] = real
  pend[seq] = r
  local pubs, tail, total = rec['pubs'], rec['tail'], rec['total']
  while pend[pubs] ~= nil and pend[pubs]['real'] ~= nil do
    local p = pend[pubs]
    tail = p['start'] + p['n']
    total = total + p['real']
    map.remove(pend, pubs)
    pubs = pubs + 1
  end
  rec['pend'] = pend
  rec['pubs'] = pubs
  rec['tail'] = tail
  rec['total'] = total
  aerospike:update(rec)
  return map{st = 'ok', tail = tail, total = total}
end

-- expired(rec) -> list of map{seq, start, n}
--   Ranges whose loader missed its lease: recovery finishes them.
function expired(rec)
  local out = list()
  if not aerospike:exists(rec) then return out end
  local t = now()
  for seq, r in map.pairs(rec['pend']) do
    if r['real'] == nil and r['exp'] <= t then
      list.append(out, map{seq = seq, start = r['start'], n = r['n']})
    end
  end
  return out
end

-- take(rec, k) -> map{st='ok', retry=list, start, n, cursor, pubs}
--                 | map{st='missing'|'paused'}
--   The reservation step: up to k tokens from the retry store first, then
--   from the token store ([start, start+n), never past tail). In ID mode the
--   token store is not used: the caller pops the rest from chunk `cursor`.
function take(rec, k)
  if not aerospike:exists(rec) then return map{st = 'missing'} end
  if rec['paused'] == 1 then return map{st = 'paused'} end
  local retry = rec['retry']
  local got = list()
  local r = list.size(retry)
  if r > 0 then
    local m = math.min(k, r)
    got = list.take(retry, m)
    if m == r then retry = list() else retry = list.drop(retry, m) end
    rec['retry'] = retry
  end
  local want = k - list.size(got)
  local start, n = rec['head'], 0
  if want > 0 and rec['mode'] == 'tokens' then
    n = math.min(want, rec['tail'] - start)
    rec['head'] = start + n
  end
  if list.size(got) > 0 or n > 0 then aerospike:update(rec) end
  return map{st = 'ok', retry = got, start = start, n = n,
             cursor = rec['cursor'], pubs = rec['pubs']}
end

-- advance(rec, seen) -> integer cursor
--   ID mode: chunk `seen` was found empty; move the cursor past it, never
--   back and never past the published chunks.
function advance(rec, seen)
  if not aerospike:exists(rec) then return -1 end
  local cursor = rec['cursor']
  if seen >= cursor and seen < rec['pubs'] then
    cursor = seen + 1
    rec['cursor'] = cursor
    aerospike:update(rec)
  end
  return cursor
end

-- push_retry(rec, tokens, cap) -> integer accepted
--   Jobs that came back go to the retry store, up to `cap` entries (the
--   record-size limit); the caller leaves the rest queued for the sweeper.
function push_retry(rec, tokens, cap)
  if not aerospike:exists(rec) then return 0 end
  local retry = rec['retry']
  local room = cap - list.size(retry)
  local accepted = 0
  for t in list.iterator(tokens) do
    if accepted >= room then break end
    list.append(retry, t)
    accepted = accepted + 1
  end
  if accepted > 0 then
    rec['retry'] = retry
    aerospike:update(rec)
  end
  return accepted
end

-- set_flag(rec, name, value) -> 'ok' | 'missing' | 'bad flag'
--   sealed / paused. Sealing is final: unsealing is refused.
function set_flag(rec, name, value)
  if not aerospike:exists(rec) then return 'missing' end
  if name ~= 'sealed' and name ~= 'paused' then return 'bad flag' end
  if name == 'sealed' and value == 0 and rec['sealed'] == 1 then return 'sealed' end
  rec[name] = value
  aerospike:update(rec)
  return 'ok'
end

-- mark_complete(rec) -> integer done_at
--   Records the first time the list was seen complete (server time).
function mark_complete(rec)
  if not aerospike:exists(rec) then return 0 end
  local at = rec['done_at']
  if at == nil then
    at = now()
    rec['done_at'] = at
    aerospike:update(rec)
  end
  return at
end
