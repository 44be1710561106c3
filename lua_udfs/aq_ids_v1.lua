-- aq_ids_v1: the list-pop ID store, one chunk per record.
--
-- Keyspace: set aq_ids, key "<list>/<chunk>". Bins:
--   ids   list   the chunk's remaining entries (job tokens), popped from the front
--   due   map    token -> server ms: the chunk's jobs with a later run_at of their
--                own (only for counting them delayed; their claim decides)
--   c     int    the list's `created`: which list of the name wrote the chunk
--
-- A list in ID mode writes one chunk per load range, before the range is
-- published; chunks hold at most the configured chunk size, so no record
-- outgrows max-record-size. The list record's `cursor` says which chunk
-- reservations pop from; it only moves forward (aq_list_v1.advance).
--
-- Both functions write, so both take an argument `deadline` (their last but for
-- `created`, added after it: nil from a caller that predates it) and answer 'stale',
-- changing nothing, when the server runs them past it (aq_job_v1, `stale`): a
-- frozen node that resumes runs the calls that waited in its sockets on its stale
-- copy of the chunk, and its replica write replaces the live one. The chunk goes
-- back as it was: IDs popped meanwhile are handed out again (their claims fence
-- them, at the cost of wasted claims), a kicked job's ID is back in it.
-- nil (older clients, the embedded store): no such limit.

local function stale(deadline)
  return deadline ~= nil and aerospike:get_current_time() > deadline
end

-- A chunk of another list of the name than the caller's (`created`: the stamp it
-- read; nil: not checked): that list was dropped and loaded again since.
local function other_list(rec, created)
  return created ~= nil and rec['c'] ~= nil and rec['c'] ~= created
end

-- pop(rec, k, deadline, created) -> list of up to k entries (empty when the chunk is drained or missing)
--                                  | 'other' | 'stale'
--   `created`: the stamp of the list whose take gave the cursor (nil: not checked).
--   A chunk of another stamp is another list of the name, dropped and loaded again
--   since the take: 'other', nothing popped (its IDs would be claimed under the
--   old list's stamp, refused, and held by no one until a sweep).
function pop(rec, k, deadline, created)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return list() end
  if other_list(rec, created) then return 'other' end
  local ids = rec['ids']
  local n = list.size(ids)
  if n == 0 or k <= 0 then return list() end
  local m = math.min(k, n)
  local got = list.take(ids, m)
  if m == n then rec['ids'] = list() else rec['ids'] = list.drop(ids, m) end
  aerospike:update(rec)
  return got
end

-- remove(rec, tokens, deadline, created) -> integer removed | 'stale'
--   Kicked jobs wait in the retry store from then on: each leaves the chunk
--   (and its `due`), or a pop would hand it out a second time and status would
--   count it reservable while it runs. O(chunk size): an operator's kick.
--   created: the stamp of the list whose jobs were kicked; a chunk of another list
--   of the name (dropped and loaded again since) is left alone.
function remove(rec, tokens, deadline, created)
  if stale(deadline) then return 'stale' end
  if not aerospike:exists(rec) then return 0 end
  if other_list(rec, created) then return 0 end
  local want = map()
  for t in list.iterator(tokens) do want[t] = 1 end
  local kept, removed = list(), 0
  for t in list.iterator(rec['ids']) do
    if want[t] == nil then list.append(kept, t) else removed = removed + 1 end
  end
  if removed == 0 then return 0 end
  rec['ids'] = kept
  local due = rec['due']
  if due ~= nil then
    for t in list.iterator(tokens) do map.remove(due, t) end
    rec['due'] = due
  end
  aerospike:update(rec)
  return removed
end
