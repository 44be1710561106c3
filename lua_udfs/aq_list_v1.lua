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
--   pend     map seq -> map{start, n, exp, real, rid, at, cr, k}   ranges allocated, not yet published
--                               (rid: the loader's id for the range, so a repeated alloc
--                               finds it; at: server ms of the alloc; cr: ms of holds
--                               credited to its lease, see credit; k: written ranges
--                               seq..seq+k-1 merged into one entry, see publish)
--   retry    list of tokens     jobs that came back: served before the token store
--   done_at  integer            server ms when status first saw the list complete
--   tlim     integer            a claim's time limit, ms (handed to claim by take)
--   bo       integer            backoff base, ms: attempt n waits up to bo*2^(n-1)
--   bo_max   integer            backoff cap, ms
--   dropped  integer            server ms of the drop: the record is a tombstone (see
--                               `tombstone`), a missing list to every function here
-- The schedule (delayed jobs; design.md has no such records: they live here):
--   sched    map due -> list    jobs waiting for server ms `due`: tokens, and
--                               ranges list{start, n, real[, skip]} of a delayed
--                               load that `take` stepped over before they were due
--   nsch     integer            tokens in sched (bounded by the caller's cap)
--   ndue     integer | nil      the earliest due in sched: take looks at sched
--                               only once the server's clock passes it
--   gates    map start -> map{n, real, due, seq[, skip]}   published ranges of a
--                               delayed load (`load --delay`): the token store
--                               (ID mode: the cursor, at chunk `seq`) steps over
--                               them, into sched, until they are due. real: its
--                               jobs but those in skip; skip: map token -> due,
--                               its jobs with a later run_at of their own, each
--                               in sched already (counted in nsch, not in real)
--   ngate    integer | nil      the lowest gate start (take checks one number)
--   timed    map token -> due   token mode: jobs in [head, tail) outside gates
--                               with their own run_at, also in sched: the
--                               token store skips them (and forgets them as
--                               it passes)
--   ready    list of list{start, n[, skip]}   due ranges of a delayed load,
--                               served after the retry store, before the
--                               token store, but for the tokens in skip
-- A job is counted in one place: a gate's real, nsch (a token in sched), a
-- sched range's real, ready, the retry store, or the token store / ID store.
-- ID mode has no token store to skip single jobs: a job with its own run_at
-- is popped with its chunk, and its claim refuses it and schedules it. A kick
-- takes its job out of an unpopped chunk (aq_ids_v1.remove) as unschedule
-- takes it out of the places listed here.
--
-- Invariant 4: a token is reservable only after its job record is written.
-- A loader allocates a range (alloc), writes the job records, then publishes
-- it (publish). Ranges publish strictly in seq order, so `tail` only ever
-- covers written ranges, whatever order concurrent loaders finish in.
--
-- Every function returns a status value rather than raising, so that it
-- reports the same way through apply and batch_apply.
--
-- Every function that writes (but `credit`, for the embedded store alone) takes an
-- argument `deadline`, its last but for the `created` of schedule, push_retry,
-- unschedule, reopen and advance (added later: a caller that predates it leaves
-- it out), and answers 'stale'
-- (map{st='stale'} where it answers a map), changing nothing, when the server runs
-- it past it, as aq_job_v1's transitions do (see `stale` there): a frozen node that
-- resumes runs the calls that waited in its sockets on its stale copy of this
-- record, and its replica write replaces the
-- newer copy the cluster made meanwhile. The whole record goes back: `head` too,
-- and the token store hands out again tokens already handed out. A claim refuses
-- a job that is not queued, but a leased job's record stays queued while it runs:
-- it would run twice. nil (older clients, the embedded store): no such limit.

local function now()
  return aerospike:get_current_time()
end

local TUNABLE = {tlim = true, bo = true, bo_max = true}

local function stale(deadline)
  return deadline ~= nil and now() > deadline
end

-- The list a caller read (its `created`, nil: any) is not this record's: it was
-- dropped, and maybe made again under its name, while the caller was stopped (a
-- drop waits only for live leases and claims). Ranges, and their numbers, are then
-- the new list's: a loader must not allocate, publish nor renew any; and a token is
-- another job's: one a paused holder or reaper pushed back would be offered twice.
local function replaced(rec, created)
  return created ~= nil and rec['created'] ~= created
end

-- A list record that is not a tombstone (a dropped list: see `tombstone`).
local function live(rec)
  return aerospike:exists(rec) and rec['dropped'] == nil
end

-- -- the schedule ---------------------------------------------------------------

-- Due times are rounded up to a grain of a hundredth of the wait (10 ms to 60 s):
-- never early, at most 1% late, and few distinct keys for release_due to walk
-- (thousands of jobs backing off after an outage share a handful).
local function bucket(due, t)
  local grain = math.floor((due - t) / 100)
  if grain < 10 then grain = 10 elseif grain > 60000 then grain = 60000 end
  return math.ceil(due / grain) * grain
end

local function sched_add(rec, due, item, ntok, t)
  due = bucket(due, t)
  local sched = rec['sched'] or map()
  local items = sched[due] or list()
  list.append(items, item)
  sched[due] = items
  rec['sched'] = sched
  rec['nsch'] = (rec['nsch'] or 0) + ntok
  local nd = rec['ndue']
  if nd == nil or due < nd then rec['ndue'] = due end
end

-- Gates of a delayed load: ranges the token store steps over until due. `skip`
-- (nil: none): the range's jobs that sched holds for a later run_at.
local function add_gate(rec, start, n, real, due, seq, skip)
  local gates = rec['gates'] or map()
  local g = map{n = n, real = real, due = due, seq = seq}
  if skip ~= nil then g['skip'] = skip end
  gates[start] = g
  rec['gates'] = gates
  local ng = rec['ngate']
  if ng == nil or start < ng then rec['ngate'] = start end
end

-- Jobs with their own run_at: scheduled, up to `cap` tokens in sched. Returns
-- those scheduled (map token -> due) and how many: whoever serves their range
-- must skip them (the token store through `timed`, a gate through its skip).
local function sched_timed(rec, timed, cap)
  local skip = map()
  local ns = 0
  local t = now()
  for token, due in map.pairs(timed) do
    if due > t and (rec['nsch'] or 0) < cap then
      sched_add(rec, due, token, 1, t)
      skip[token] = due
      ns = ns + 1
    end
  end
  return skip, ns
end

-- Adds the entries of map `from` to map bin `bin`.
local function merge_into(rec, bin, from)
  local into = rec[bin] or map()
  for k, v in map.pairs(from) do into[k] = v end
  rec[bin] = into
end

-- Moves what is due from sched to the retry store (tokens) and to ready
-- (ranges); O(entries in sched), paid only when the earliest due has passed.
local function release_due(rec, t)
  local nd = rec['ndue']
  if nd == nil or nd > t then return false end
  local sched = rec['sched']
  local retry = rec['retry']
  local ready = rec['ready'] or list()
  local keep = map()
  local nsch = rec['nsch'] or 0
  local next_due = nil
  local due_now = {}
  for due, items in map.pairs(sched) do
    if due <= t then
      due_now[#due_now + 1] = due
    else
      keep[due] = items
      if next_due == nil or due < next_due then next_due = due end
    end
  end
  -- Earliest due first. The server walks a map in key order (so does the
  -- embedded store: tests/contract), which is that order already; sorted
  -- anyway, so that the order of release never rests on how a map is walked.
  table.sort(due_now)
  for _, due in ipairs(due_now) do
    for item in list.iterator(sched[due]) do
      if type(item) == 'number' then
        list.append(retry, item)
        nsch = nsch - 1
      else
        list.append(ready, list{item[1], item[2], item[4]})
      end
    end
  end
  rec['sched'] = keep
  rec['nsch'] = nsch
  rec['ndue'] = next_due
  rec['retry'] = retry
  rec['ready'] = ready
  return true
end

-- Next gate start after `start` (nil: none): O(gates), once per gate passed.
local function lowest_gate(gates)
  local low = nil
  for start, _ in map.pairs(gates) do
    if low == nil or start < low then low = start end
  end
  return low
end

-- Removes the lowest gate (start ng) and returns it; steps over it (into sched,
-- with its skip) if it is not due yet: returns true as second value then.
local function pass_gate(rec, ng, t)
  local gates = rec['gates']
  local g = gates[ng]
  map.remove(gates, ng)
  rec['gates'] = gates
  rec['ngate'] = lowest_gate(gates)
  if g['due'] > t then
    sched_add(rec, g['due'], list{ng, g['n'], g['real'], g['skip']}, 0, t)
    return g, true
  end
  return g, false
end

-- ID mode: the cursor steps over gated chunks not due yet (their ranges wait in
-- sched, then are served from ready); a due gate is dropped and its chunk popped.
-- A gate without seq (made before gates knew their chunk) or behind the cursor
-- is dropped: its chunk is popped, and the claims refuse jobs not yet due.
-- Returns the cursor and whether the record changed.
local function pass_gates_ids(rec, cursor, t)
  local changed = false
  local ng = rec['ngate']
  while ng ~= nil do
    local seq = rec['gates'][ng]['seq']
    if seq ~= nil and seq > cursor then break end
    if seq == nil or seq < cursor then
      local gates = rec['gates']
      map.remove(gates, ng)
      rec['gates'] = gates
      rec['ngate'] = lowest_gate(gates)
    else
      local _, stepped = pass_gate(rec, ng, t)
      if stepped then cursor = cursor + 1 end
    end
    changed = true
    ng = rec['ngate']
  end
  if changed then rec['cursor'] = cursor end
  return cursor, changed
end

-- Tokens in the retry store, and in the schedule too when `sched_too`: what a
-- repeated offer must not add again.
local function offered(rec, sched_too)
  local present = map()
  local sched = rec['sched']
  if sched_too and sched ~= nil then
    for _, items in map.pairs(sched) do
      for item in list.iterator(items) do
        if type(item) == 'number' then present[item] = 1 end
      end
    end
  end
  local retry = rec['retry']
  if retry ~= nil then
    for t in list.iterator(retry) do present[t] = 1 end
  end
  return present
end

-- schedule(rec, tokens, delay_ms, cap, again, deadline, created) -> integer accepted | 'stale'
--   Jobs that wait (a backoff, a snooze, a delayed job found early) come back
--   delay_ms from now by the server's clock, up to `cap` tokens in sched; the
--   caller leaves the rest in their records (state delayed) for the sweeper.
--   again = 1: a repeat of a call whose answer was lost, which may have landed
--   (and, due since, moved to the retry store): a token found in either is not
--   added twice. Only then, as that costs a pass over both.
--   created (after the deadline, so that a caller older than it leaves it out):
--   the list the jobs are of (nil: any); another one takes none (`replaced`).
function schedule(rec, tokens, delay_ms, cap, again, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) or replaced(rec, created) then return 0 end
  local t = now()
  local due = t + delay_ms
  local present = nil
  if again == 1 then present = offered(rec, true) end
  local accepted = 0
  for tok in list.iterator(tokens) do
    if (rec['nsch'] or 0) >= cap then break end
    if present == nil or present[tok] == nil then sched_add(rec, due, tok, 1, t) end
    accepted = accepted + 1
  end
  if accepted > 0 then aerospike:update(rec) end
  return accepted
end

-- unschedule(rec, tokens, deadline, created) -> integer moved | 'stale'
--   Kicked jobs now wait in the retry store: each leaves every other place the
--   list record keeps it, or it would be counted twice (delayed, or reservable,
--   while it runs) and offered again: sched (a single token: removed), a delayed
--   load's range, gated, scheduled or ready (into its skip, out of its real), and,
--   token mode, the token store ahead (into timed, which take skips). Returns how
--   many tokens moved. O(entries in sched + gates) a token: an operator's kick.
--   created: the stamp of the list whose jobs were kicked; another list of the name
--   since (dropped and loaded again) is left alone: its tokens are other jobs.
function unschedule(rec, tokens, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) or replaced(rec, created) then return 0 end
  local want = map()
  for t in list.iterator(tokens) do want[t] = 1 end
  local moved = 0
  -- Single tokens in sched; ranges in sched skip theirs.
  if rec['sched'] ~= nil and map.size(rec['sched']) > 0 then
    local keep = map()
    local removed = 0
    local next_due = nil
    for due, items in map.pairs(rec['sched']) do
      local left = list()
      for item in list.iterator(items) do
        if type(item) == 'number' then
          if want[item] ~= nil then removed = removed + 1 else list.append(left, item) end
        else
          -- A delayed load's range stepped over: {start, n, real, skip}.
          local s0, n0, skip = item[1], item[2], item[4]
          for t in list.iterator(tokens) do
            if t >= s0 and t < s0 + n0 and (skip == nil or skip[t] == nil) then
              if skip == nil then skip = map() end
              skip[t] = 0
              item[3] = item[3] - 1
              moved = moved + 1
            end
          end
          if skip ~= nil then
            if list.size(item) >= 4 then item[4] = skip else list.append(item, skip) end
          end
          list.append(left, item)
        end
      end
      if list.size(left) > 0 then
        keep[due] = left
        if next_due == nil or due < next_due then next_due = due end
      end
    end
    rec['sched'] = keep
    rec['nsch'] = (rec['nsch'] or 0) - removed
    rec['ndue'] = next_due
    moved = moved + removed
  end
  -- Gated ranges not reached yet.
  local gates = rec['gates']
  local gated = map()
  if gates ~= nil then
    for g0, g in map.pairs(gates) do
      local skip = g['skip']
      for t in list.iterator(tokens) do
        if t >= g0 and t < g0 + g['n'] then
          gated[t] = 1
          if skip == nil or skip[t] == nil then
            if skip == nil then skip = map() end
            skip[t] = 0
            g['real'] = g['real'] - 1
            moved = moved + 1
          end
        end
      end
      if skip ~= nil then
        g['skip'] = skip
        gates[g0] = g
      end
    end
    rec['gates'] = gates
  end
  -- Due ranges of a delayed load: {start, n[, skip]}.
  local ready = rec['ready']
  if ready ~= nil and list.size(ready) > 0 then
    local out = list()
    for rg in list.iterator(ready) do
      local s0, n0, skip = rg[1], rg[2], rg[3]
      for t in list.iterator(tokens) do
        if t >= s0 and t < s0 + n0 and (skip == nil or skip[t] == nil) then
          if skip == nil then skip = map() end
          skip[t] = 0
          moved = moved + 1
        end
      end
      list.append(out, list{s0, n0, skip})
    end
    rec['ready'] = out
  end
  -- Token mode: a job kicked before the token store reached it (buried there).
  if rec['mode'] == 'tokens' then
    local head, tail = rec['head'], rec['tail']
    local timed = rec['timed']
    for t in list.iterator(tokens) do
      if t >= head and t < tail and gated[t] == nil and (timed == nil or timed[t] == nil) then
        if timed == nil then timed = map() end
        timed[t] = 0
        moved = moved + 1
      end
    end
    if timed ~= nil then rec['timed'] = timed end
  end
  -- The retry store: a job that waited there already (buried there, or delayed and
  -- released there by a take, before its kick) is in it twice now, counted as
  -- waiting there while the claim of the other copy runs. One copy is kept, the
  -- last (the kick's own push).
  local retry = rec['retry']
  if retry ~= nil and list.size(retry) > 1 then
    local last = map()
    local dups = 0
    for i = list.size(retry), 1, -1 do
      local t = retry[i]
      if want[t] ~= nil then
        if last[t] == nil then last[t] = i else dups = dups + 1 end
      end
    end
    if dups > 0 then
      local out = list()
      for i = 1, list.size(retry) do
        local t = retry[i]
        if want[t] == nil or last[t] == i then list.append(out, t) end
      end
      rec['retry'] = out
      moved = moved + dups
    end
  end
  if moved > 0 then aerospike:update(rec) end
  return moved
end

-- tune(rec, opts, deadline) -> 'ok' | 'missing' | 'stale'
--   Sets tlim, bo, bo_max (ms) from map opts; other keys are ignored.
function tune(rec, opts, deadline)
  if stale(deadline) then return 'stale' end
  if not live(rec) then return 'missing' end
  for k, v in map.pairs(opts) do
    if TUNABLE[k] then rec[k] = v end
  end
  aerospike:update(rec)
  return 'ok'
end

-- reopen(rec, deadline, created) -> 'ok' | 'missing' | 'stale'
--   A job of a complete list was kicked: the list is not complete any more. Each
--   kick counts (`reopens`), so that a status that saw the list complete before it
--   does not mark it complete after it (mark_complete). created: as for unschedule
--   ('missing' for another list of the name).
function reopen(rec, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) or replaced(rec, created) then return 'missing' end
  rec['done_at'] = nil
  rec['reopens'] = (rec['reopens'] or 0) + 1
  aerospike:update(rec)
  return 'ok'
end

-- create(rec, mode, max_att, opts, clean, deadline) -> map{st='created'|'exists'|'stale', mode, max_att}
--                                         | map{st='dropped', dropped, alloc, seq}
--   Creates the list if missing; never changes an existing one. opts: map of
--   tlim, bo, bo_max (ms). Over a tombstone only once the caller has deleted what
--   it names (`clean`: the tombstone's `dropped`, as the caller read it); else it
--   answers the tombstone, for the caller to clean. The new list record carries on
--   the tombstone's generation.
function create(rec, mode, max_att, opts, clean, deadline)
  if stale(deadline) then return map{st = 'stale'} end
  if aerospike:exists(rec) then
    if rec['dropped'] == nil then
      return map{st = 'exists', mode = rec['mode'], max_att = rec['max_att']}
    end
    if clean ~= rec['dropped'] then
      return map{st = 'dropped', dropped = rec['dropped'], alloc = rec['alloc'], seq = rec['seq']}
    end
    rec['dropped'] = nil
  end
  rec['mode'] = mode
  rec['max_att'] = max_att
  rec['tlim'] = 300000
  rec['bo'] = 1000
  rec['bo_max'] = 3600000
  if opts ~= nil then
    for k, v in map.pairs(opts) do
      if TUNABLE[k] then rec[k] = v end
    end
  end
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
  if aerospike:exists(rec) then aerospike:update(rec) else aerospike:create(rec) end
  return map{st = 'created', mode = mode, max_att = max_att}
end

-- tombstone(rec, deadline) -> 'ok' | 'missing' | 'stale'
--   The last step of a drop, instead of deleting the record. Community Edition
--   deletes leave nothing behind, so a node that missed the drop (frozen, cut off)
--   would bring its copy of the list record back when it rejoins, and with it the
--   list. A tombstone is a write: migrations keep the copy with the higher
--   generation (conflict-resolution-policy generation, the default), and the drop's
--   writes put it past any copy from before the drop. It keeps what a later drop or
--   create needs to find the records such a node brings back (`alloc`: the tokens,
--   `seq`: the ranges, i.e. the ID-store chunks) and `dropped`, the server ms of
--   the drop; every other bin goes.
function tombstone(rec, deadline)
  if stale(deadline) then return 'stale' end
  if not live(rec) then return 'missing' end
  for _, b in ipairs(record.bin_names(rec)) do
    if b ~= 'alloc' and b ~= 'seq' then rec[b] = nil end
  end
  rec['dropped'] = now()
  aerospike:update(rec)
  return 'ok'
end


-- alloc(rec, n, lease_ms, rid, created, deadline) -> map{st='ok', seq, start, now} | map{st='missing'|'sealed'|'stale'}
--   Reserves tokens [start, start+n) for one loader. The range must be
--   published within lease_ms, or `expired` offers it to recovery. `now`: the
--   server's clock, from which a delayed load counts its delay. `rid` (a string,
--   or nil): the loader's id for this range; an alloc repeated under it (its
--   answer was lost: a timeout, a node lost) answers the range it made, with the
--   `now` of the first call, instead of making a second one that nobody would
--   publish. Not once the range's lease ran out or a recovery published it:
--   then the repeat gets a new range, as a loader that came late would.
--   `created` (or nil): the list the loader read; another one is 'missing'.
function alloc(rec, n, lease_ms, rid, created, deadline)
  if stale(deadline) then return map{st = 'stale'} end
  if not live(rec) or replaced(rec, created) then return map{st = 'missing'} end
  local pend = rec['pend']
  local t = now()
  if rid ~= nil then
    for seq, r in map.pairs(pend) do
      if r['rid'] == rid and r['real'] == nil and r['exp'] > t then
        return map{st = 'ok', seq = seq, start = r['start'], now = r['at']}
      end
    end
  end
  if rec['sealed'] == 1 then return map{st = 'sealed'} end
  local start, seq = rec['alloc'], rec['seq']
  pend[seq] = map{start = start, n = n, exp = t + lease_ms, rid = rid, at = t}
  rec['pend'] = pend
  rec['alloc'] = start + n
  rec['seq'] = seq + 1
  aerospike:update(rec)
  return map{st = 'ok', seq = seq, start = start, now = t}
end

-- A written range whose publication holds nothing back of its own (no gate, no
-- job with its own run_at): merged with its neighbours, its jobs are published
-- with theirs. Delayed ranges keep an entry each: their gates and timed jobs are
-- taken as each range publishes.
local function plain(r)
  return r ~= nil and r['real'] ~= nil and r['due'] == nil and r['timed'] == nil
end

-- The seq of the entry that range `seq` was merged into (nil: none). O(entries).
local function merged_into(pend, seq)
  for s, p in map.pairs(pend) do
    if s < seq and seq < s + (p['k'] or 1) and p['real'] ~= nil then return s end
  end
  return nil
end

-- Range `seq`, just written, takes in the run of written ranges right after it and
-- goes into the run right before it: tokens and ranges are allocated in sequence, so
-- a run [s, s+k) covers tokens [start, start+n) and publishes as one range would.
-- O(entries), and entries stay few: unwritten ranges, delayed ones, and a run
-- between each two of them.
local function merge_written(pend, seq)
  local r = pend[seq]
  if not plain(r) then return end
  local k = r['k'] or 1
  local nx = pend[seq + k]
  if plain(nx) then
    r = map{start = r['start'], n = r['n'] + nx['n'], real = r['real'] + nx['real'], k = k + (nx['k'] or 1)}
    map.remove(pend, seq + k)
    pend[seq] = r
  end
  local before = nil
  for s, p in map.pairs(pend) do
    if s < seq and s + (p['k'] or 1) == seq then
      before = s
      break
    end
  end
  if before == nil then return end
  local p = pend[before]
  if plain(p) then
    pend[before] = map{start = p['start'], n = p['n'] + r['n'], real = p['real'] + r['real'],
                       k = (p['k'] or 1) + (r['k'] or 1)}
    map.remove(pend, seq)
  end
end

-- publish(rec, seq, real, due, timed, cap, created, deadline) -> map{st='ok'|'gone'|'stale', tail, total}
--   Marks range `seq` written, with `real` non-void jobs, and moves `tail`
--   over every consecutive written range. `due` (server ms, 0: none) delays
--   the whole range (a gate); `timed` (map token -> due, or nil) delays some
--   of its jobs (their own run_at, later than `due`), up to `cap` tokens in
--   sched: the rest wait in their records, where their claim refuses them
--   until due (token mode; in ID mode every one of them does: see the header).
--   Both take effect as the range is published. Idempotent: publishing a
--   range that is already published answers 'ok' and changes nothing.
--   'gone': the range is unknown, or the list is not the one `created` (or nil)
--   says: range `seq` of a list made since under its name is not this loader's.
--   A written range that cannot publish yet (one before it is unwritten: a loader
--   still at work, or one that died and waits out its lease) is merged with the
--   written ranges next to it (`merge_written`), so that `pend` holds a few
--   entries, not one per range, however many wait behind it: every call on the
--   list record reads `pend`, and with one entry per range each call of a load of
--   small ranges behind a dead loader's cost in proportion to the ranges it had
--   loaded (quadratic: 3,000 ranges of one job took minutes).
function publish(rec, seq, real, due, timed, cap, created, deadline)
  if stale(deadline) then return map{st = 'stale'} end
  if not live(rec) or replaced(rec, created) then return map{st = 'gone'} end
  if seq < rec['pubs'] then return map{st = 'ok', tail = rec['tail'], total = rec['total']} end
  local pend = rec['pend']
  local r = pend[seq]
  if r == nil then
    -- Merged into the entry of a written range before it: published already.
    if merged_into(pend, seq) ~= nil then return map{st = 'ok', tail = rec['tail'], total = rec['total']} end
    return map{st = 'gone'}
  end
  -- First count wins: a loader and a recovery publishing the same range
  -- computed it from the same final job and index records.
  if r['real'] ~= nil then return map{st = 'ok', tail = rec['tail'], total = rec['total']} end
  r['real'] = real
  if due ~= nil and due > 0 then r['due'] = due end
  if timed ~= nil and map.size(timed) > 0 then r['timed'] = timed end
  pend[seq] = r
  local pubs, tail, total = rec['pubs'], rec['tail'], rec['total']
  if seq ~= pubs then merge_written(pend, seq) end
  while pend[pubs] ~= nil and pend[pubs]['real'] ~= nil do
    local p = pend[pubs]
    tail = p['start'] + p['n']
    total = total + p['real']
    local skip, ns = nil, 0
    if p['timed'] ~= nil and rec['mode'] == 'tokens' then
      skip, ns = sched_timed(rec, p['timed'], cap or 0)
    end
    if ns == 0 then skip = nil end
    if p['due'] ~= nil then
      -- The jobs in skip are counted by nsch, so not in the gate's real.
      add_gate(rec, p['start'], p['n'], p['real'] - ns, p['due'], pubs, skip)
    elseif skip ~= nil then
      merge_into(rec, 'timed', skip)
    end
    map.remove(pend, pubs)
    pubs = pubs + (p['k'] or 1)
  end
  rec['pend'] = pend
  rec['pubs'] = pubs
  rec['tail'] = tail
  rec['total'] = total
  aerospike:update(rec)
  return map{st = 'ok', tail = tail, total = total}
end

-- Sets the lease end of the unpublished ranges `seqs` (nil: all of them) to
-- what end_of(range) answers (nil: left as it is). Answers how many it moved.
local function move_leases(rec, seqs, end_of)
  if not live(rec) then return 0 end
  local pend = rec['pend']
  if seqs == nil then
    seqs = list()
    for s, _ in map.pairs(pend) do list.append(seqs, s) end
  end
  local n = 0
  for s in list.iterator(seqs) do
    local r = pend[s]
    local exp = r ~= nil and r['real'] == nil and end_of(r)
    if exp then
      r['exp'] = exp
      pend[s] = r
      n = n + 1
    end
  end
  if n > 0 then
    rec['pend'] = pend
    aerospike:update(rec)
  end
  return n
end

-- renew(rec, seqs, lease_ms, created, deadline) -> integer | 'stale'
--   A live loader keeps its ranges still in flight (sequence numbers `seqs`)
--   leased for lease_ms more, so a lease can be short: a dead loader's ranges
--   go to recovery soon, and a slow one is not cut off. Not a range whose lease
--   ran out: a recovery may be finishing it already. Nor those of a list other
--   than `created` (or nil): another loader's. Answers how many it renewed.
function renew(rec, seqs, lease_ms, created, deadline)
  if stale(deadline) then return 'stale' end
  if aerospike:exists(rec) and replaced(rec, created) then return 0 end
  local t = now()
  return move_leases(rec, seqs, function(r) if r['exp'] > t then return t + lease_ms end end)
end

-- credit(rec, ms) -> integer
--   The embedded store was held by one writer for `ms` (aeroqueue/backends/
--   holds.py): no loader could renew meanwhile, so every unpublished range's
--   lease that still ran when the hold began moves that much later; one that
--   had run out before was not held back, and stays with recovery. A range
--   adds its credits up in `cr`: a load waiting behind it tells them from its
--   loader's renewals (load._await_earlier). Answers how many it moved.
function credit(rec, ms)
  local began = now() - ms
  return move_leases(rec, nil, function(r)
    if r['exp'] > began then
      r['cr'] = (r['cr'] or 0) + ms
      return r['exp'] + ms
    end
  end)
end

-- expired(rec) -> list of map{seq, start, n}
--   Ranges whose loader missed its lease: recovery finishes them.
function expired(rec)
  local out = list()
  if not live(rec) then return out end
  local t = now()
  for seq, r in map.pairs(rec['pend']) do
    if r['real'] == nil and r['exp'] <= t then
      list.append(out, map{seq = seq, start = r['start'], n = r['n']})
    end
  end
  return out
end

-- take(rec, k, deadline) -> map{st='ok', retry=list, start, n, cursor, pubs, tlim, now, mode, c}
--                 | map{st='missing'|'paused'|'stale'}
--   The reservation step: up to k tokens from the retry store first (with
--   whatever sched has due), then due ranges of delayed loads, then the token
--   store ([start, start+n), never past tail, stepping over gates and timed
--   jobs; tokens it could not hand out as one run come in `retry`). In ID mode
--   the token store is not used: the caller pops the rest from chunk `cursor`,
--   which has stepped over gated chunks not due yet (as `advance` does).
--   tlim: the list's time limit, for the claims; now: the server ms of the take
--   (a lease's time limit runs from it). mode: the list's own, for the caller to
--   pop the ID store by: a list dropped and loaded again under its name may have
--   another mode than the caller saw before. c: the list's `created`, the stamp
--   a block record must hold for the caller to trust it for [start, start+n)
--   (aeroqueue/blocks.py).
function take(rec, k, deadline)
  if stale(deadline) then return map{st = 'stale'} end
  if not live(rec) then return map{st = 'missing'} end
  if rec['paused'] == 1 then return map{st = 'paused'} end
  local t = now()
  local changed = release_due(rec, t)
  local retry = rec['retry']
  local got = list()
  local r = list.size(retry)
  if r > 0 then
    local m = math.min(k, r)
    got = list.take(retry, m)
    if m == r then retry = list() else retry = list.drop(retry, m) end
    rec['retry'] = retry
    changed = true
  end
  local ready = rec['ready']
  while ready ~= nil and list.size(ready) > 0 and list.size(got) < k do
    local rg = ready[1]
    local s0, n0, skip = rg[1], rg[2], rg[3]
    local m = 0
    while m < n0 and list.size(got) < k do
      if skip == nil or skip[s0 + m] == nil then list.append(got, s0 + m) end
      m = m + 1
    end
    if m == n0 then
      if list.size(ready) == 1 then ready = list() else ready = list.drop(ready, 1) end
    else
      ready[1] = list{s0 + m, n0 - m, skip}
    end
    rec['ready'] = ready
    changed = true
  end
  local start, n = rec['head'], 0
  if rec['mode'] ~= 'tokens' then
    if rec['ngate'] ~= nil then
      local _, passed = pass_gates_ids(rec, rec['cursor'], t)
      if passed then changed = true end
    end
  else
    local head, tail = rec['head'], rec['tail']
    local timed = rec['timed']
    local plain = (rec['ngate'] == nil) and (timed == nil or map.size(timed) == 0)
    if plain then
      n = math.min(k - list.size(got), tail - head)
      rec['head'] = head + n
      if n > 0 then changed = true end
    else
      -- Slow path (a delayed load, or jobs with their own run_at): token by token.
      start = head
      while list.size(got) < k and head < tail do
        local ng = rec['ngate']
        if ng ~= nil and head == ng then
          local g, stepped = pass_gate(rec, ng, t)
          if stepped then
            head = ng + g['n']
          elseif g['skip'] ~= nil then
            -- Due: the walk goes through the range, skipping its later jobs.
            if timed == nil then timed = map() end
            for tok, due in map.pairs(g['skip']) do timed[tok] = due end
          end
        else
          if timed ~= nil and timed[head] ~= nil then
            map.remove(timed, head)
          else
            list.append(got, head)
          end
          head = head + 1
        end
      end
      if timed ~= nil then rec['timed'] = timed end
      if head ~= rec['head'] then changed = true end
      rec['head'] = head
    end
  end
  if changed then aerospike:update(rec) end
  return map{st = 'ok', retry = got, start = start, n = n,
             cursor = rec['cursor'], pubs = rec['pubs'], tlim = rec['tlim'] or 300000, now = t,
             mode = rec['mode'], c = rec['created']}
end

-- advance(rec, seen, deadline, created) -> integer cursor | -1 | 'stale'
--   ID mode: chunk `seen`, the cursor's, was found empty; move the cursor past
--   it, never back and never past the published chunks, and past gated chunks
--   not due. A `seen` ahead of the cursor is another list's (one dropped and
--   loaded again under the name while a reserver held its cursor): moving to it
--   would skip this list's chunks before it, so nothing moves. So does a record
--   of another stamp than `created` (the list whose chunk was found empty; nil:
--   not checked): its own chunk `seen` is not drained (-1, as for no list).
function advance(rec, seen, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) or replaced(rec, created) then return -1 end
  local cursor = rec['cursor']
  if seen == cursor and seen < rec['pubs'] then
    cursor = seen + 1
    rec['cursor'] = cursor
    -- Never onto a gated chunk that is not due: step over it, as take does.
    if rec['ngate'] ~= nil then cursor = pass_gates_ids(rec, cursor, now()) end
    aerospike:update(rec)
  end
  return cursor
end

-- push_retry(rec, tokens, cap, again, deadline, created) -> integer accepted | 'stale'
--   Jobs that came back go to the retry store, up to `cap` entries (the
--   record-size limit); the caller leaves the rest queued for the sweeper.
--   again = 1: a repeat of a push whose answer was lost, which may have landed:
--   a token already in the store is not added twice (counted waiting twice while
--   its one job runs). Only then, as that costs a pass over the whole store.
--   created: as for schedule.
function push_retry(rec, tokens, cap, again, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) or replaced(rec, created) then return 0 end
  local retry = rec['retry']
  local present = nil
  -- The retry store only: a kick pushes a token the schedule holds, then takes
  -- it off the schedule; skipped for being there, it would be left in neither.
  if again == 1 then present = offered(rec, false) end
  local room = cap - list.size(retry)
  local accepted, added = 0, 0
  for t in list.iterator(tokens) do
    -- One the first push left there fits, whatever the room left: it takes none.
    if present == nil or present[t] == nil then
      if added >= room then break end
      list.append(retry, t)
      added = added + 1
      if present ~= nil then present[t] = 1 end
    end
    accepted = accepted + 1
  end
  if added > 0 then
    rec['retry'] = retry
    aerospike:update(rec)
  end
  return accepted
end

-- set_flag(rec, name, value, deadline, created) -> 'ok' | 'missing' | 'bad flag' | 'sealed' | 'dropping'
--                                                  | 'given up' | 'stale' | 'other'
--   sealed / paused / dropping. `created` (optional): the list's stamp as the caller
--   saw it (a dashboard page): 'other', nothing set, for another list of the name
--   (dropped and loaded again since). Sealing is final: unsealing is refused. So is
--   dropping = 1 (set by a drop before it deletes anything): a list a drop left
--   half-deleted stays paused until a drop finishes it. dropping = 2 (set by a
--   drop before its seal, so that the list never looks complete while it goes)
--   never lowers a 1, and a resume (paused = 0) clears it: that drop was given up
--   before anything was deleted. So dropping = 1 is set only over a 2 on a list
--   still paused (or over a 1: a drop finishing one that stopped half-way); else
--   'given up', nothing set: resumed while the drop waited, the list is worked on
--   again, and the drop must not delete it under its workers.
function set_flag(rec, name, value, deadline, created)
  if stale(deadline) then return 'stale' end
  if not live(rec) then return 'missing' end
  if replaced(rec, created) then return 'other' end
  if name ~= 'sealed' and name ~= 'paused' and name ~= 'dropping' then return 'bad flag' end
  if name == 'sealed' and value == 0 and rec['sealed'] == 1 then return 'sealed' end
  if value == 0 and rec['dropping'] == 1 and (name == 'paused' or name == 'dropping') then return 'dropping' end
  if name == 'dropping' and value == 2 and rec['dropping'] == 1 then return 'ok' end
  if name == 'dropping' and value == 1 and rec['dropping'] ~= 1
      and (rec['dropping'] ~= 2 or rec['paused'] ~= 1) then
    return 'given up'
  end
  if name == 'paused' and value == 0 and rec['dropping'] == 2 then rec['dropping'] = nil end
  rec[name] = value
  aerospike:update(rec)
  return 'ok'
end

-- mark_complete(rec, reopens, deadline) -> integer done_at | -1 | 'stale'
--   Records the first time the list was seen complete (server time). `reopens`:
--   the list record's count of kicks as the caller read it before it read the
--   bits; a kick since (-1, nothing written) may have made the list incomplete.
function mark_complete(rec, reopens, deadline)
  if stale(deadline) then return 'stale' end
  if not live(rec) then return 0 end
  local at = rec['done_at']
  if at == nil and reopens ~= nil and (rec['reopens'] or 0) ~= reopens then return -1 end
  if at == nil then
    at = now()
    rec['done_at'] = at
    aerospike:update(rec)
  end
  return at
end
