-- aq_contract: UDFs that pin down the server behaviours aeroqueue relies on.
-- Registered by the contract tests only (never by `aeroqueue udf register`).
--
-- Keyspace: whatever record the test names, in a set of its own.
--
-- incr(rec, bin, by)         -> new value; read-increment-write of an integer bin
-- stage_then_fail(rec, v)    -> never returns; writes bin 'a' = v, updates, then error('boom', 0)
-- fail_with(rec, msg)        -> never returns; error(msg, 0)
-- fail_located(rec)          -> never returns; error('located') at level 1 (file:line prefix)
-- take(rec, n)               -> {taken = list.take(l, n), is_nil = (result == nil)} for l = {1,2,3}
-- divide(rec, a, b)          -> a / b   (always a float in Lua 5.4)
-- idivide(rec, a, b)         -> a // b  (an integer for integer arguments)
-- claim(rec, who)            -> 'missing' | 'taken' | 'ok'; 'q' -> 'c', a status value (batch-safe)
-- now(rec)                   -> aerospike:get_current_time()
-- lut(rec)                   -> record.last_update_time(rec) (ms since 2010-01-01)
-- map_keys(rec, m)           -> list of m's keys as map.pairs walks them, then those of a map
--                               made here with keys 5, 1, 'b', 3, 'a' (in that order)

function incr(rec, bin, by)
  local v = (rec[bin] or 0) + by
  rec[bin] = v
  if aerospike:exists(rec) then aerospike:update(rec) else aerospike:create(rec) end
  return v
end

function stage_then_fail(rec, v)
  rec['a'] = v
  aerospike:update(rec)
  error('boom', 0)
end

function fail_with(rec, msg)
  error(msg, 0)
end

function fail_located(rec)
  error('located')
end

function take(rec, n)
  local t = list.take(list{1, 2, 3}, n)
  return map{taken = t, is_nil = (t == nil)}
end

function divide(rec, a, b)
  return a / b
end

function idivide(rec, a, b)
  return a // b
end

function claim(rec, who)
  if not aerospike:exists(rec) then return 'missing' end
  if rec['state'] ~= 'q' then return 'taken' end
  rec['state'] = 'c'
  rec['who'] = who
  aerospike:update(rec)
  return 'ok'
end

function now(rec)
  return aerospike:get_current_time()
end

function lut(rec)
  return record.last_update_time(rec)
end

function map_keys(rec, m)
  local out = list()
  for k in map.keys(m) do list.append(out, k) end
  local made = map()
  made[5] = 1; made[1] = 1; made['b'] = 1; made[3] = 1; made['a'] = 1
  map.remove(made, 3)
  made[2] = 1
  for k, _ in map.pairs(made) do list.append(out, k) end
  return out
end

-- create_then_remove(rec) -> aerospike:remove's answer after creating the record
function create_then_remove(rec)
  rec['a'] = 1
  aerospike:create(rec)
  return aerospike:remove(rec)
end

-- stdlib(rec) -> utf8.len('héllo'), a coroutine's yield, os.date's year, whether _G is there
function stdlib(rec)
  local co = coroutine.wrap(function() coroutine.yield(7) end)
  return list{utf8.len('h\195\169llo'), co(), type(os.date('*t').year), _G ~= nil}
end

-- holes(rec) -> list{1, nil, 3} and list{nil, 2} as the server builds them (aq_list_v1's
-- list{item[1], item[2], item[4]} meets a missing item), and a map with a nil value
function holes(rec)
  return map{a = list{1, nil, 3}, c = list{nil, 2}, m = map{x = nil, y = 1}}
end
