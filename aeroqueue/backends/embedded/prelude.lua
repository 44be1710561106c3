-- Aerospike's Lua UDF API for the embedded backend: the `record`,
-- `aerospike`, `list`, `map` and `bytes` objects and the log functions, with
-- the semantics of the server's mod-lua (mod_lua_*.c, udf_record.c,
-- udf_aerospike.c) as observed on Aerospike 8.1.
--
-- lua_runtime.py loads this chunk once per Lua state, with the full standard
-- library, and calls it with two Python callbacks; it returns the functions
-- Python drives. UDF modules never see this chunk's globals: each one runs in
-- the sandbox built by new_env().
--
-- On the server these objects are userdata. Here they are tables whose state
-- sits under private keys (tables, which UDF code cannot name), and the
-- sandbox's `type`, `next`, `rawget`... treat them as userdata.

local py_getbin, py_binnames = ...

local type, next, select, error, pcall, tostring, tonumber =
  type, next, select, error, pcall, tostring, tonumber
local rawget, rawset, rawequal, rawlen = rawget, rawset, rawequal, rawlen
local setmetatable, getmetatable, load, ipairs, pairs = setmetatable, getmetatable, load, ipairs, pairs
local getmt = debug.getmetatable
local mtype, tointeger, min, max = math.type, math.tointeger, math.min, math.max
local sfind, ssub, sbyte, schar, sformat, sgsub, spack, sunpack =
  string.find, string.sub, string.byte, string.char, string.format, string.gsub, string.pack, string.unpack
local tconcat, tunpack, tmove, tsort = table.concat, table.unpack, table.move, table.sort
local utf8len = utf8.len

-- Private keys of the objects' state.
local VALS, SIZE, KEYS, ORDER, POS, HOLES, SORTED, MAXK = {}, {}, {}, {}, {}, {}, {}, {}
local STR, ARR, CAP, BTYPE, STATE = {}, {}, {}, {}, {}

local NIL = {}    -- a nil held in a map (m[k] = nil keeps the key), or a staged bin delete
local DEL = {}    -- a bin deleted from the record that will be written
local UNSUP = {}  -- a Lua value Aerospike cannot hold (plain table, function...)
local TOMB = {}   -- a removed slot in a map's insertion order

local LIST = {__name = "List"}
local MAP = {__name = "Map"}
local BYTES = {__name = "Bytes"}
local RECORD = {__name = "Record"}
local AEROSPIKE = {__name = "Aerospike"}
local BADSTR = {}  -- wraps a string that is not UTF-8 on its way to Python

local CHUNK = 4096
local UINT32_MAX = 0xFFFFFFFF
local BYTES_BLOB = 4

local HEX = {}
for i = 0, 255 do HEX[schar(i)] = sformat("%02x", i) end

local function hex(s)
  return (sgsub(s, ".", HEX))
end

local function is_object(v)
  local mt = getmt(v)
  return mt == LIST or mt == MAP or mt == BYTES or mt == RECORD or mt == AEROSPIKE
end

-- ---------------------------------------------------------------------------
-- Argument checks, worded like the C API's (luaL_checkudata, luaL_optinteger).
-- Each raises at level 3: the caller of the API function that checks.

local function typename(v)
  local mt = getmt(v)
  if mt then
    local n = rawget(mt, "__name")
    if type(n) == "string" then return n end
  end
  return type(v)
end

local function check(v, mt, i, fname)
  if getmt(v) ~= mt then
    if not is_object(v) then
      error(sformat("bad argument #%d to '%s' (userdata expected, got %s)", i, fname, typename(v)), 3)
    end
    error(sformat("bad argument #%d to '%s' (%s expected, got %s)", i, fname, mt.__name, typename(v)), 3)
  end
end

local function optint(v, def, i, fname)
  if v == nil then return def end
  if mtype(v) == "integer" then return v end
  local n
  if type(v) == "number" then
    n = tointeger(v)
  elseif type(v) == "string" and tonumber(v) then
    n = tointeger(tonumber(v))
  else
    error(sformat("bad argument #%d to '%s' (number expected, got %s)", i, fname, typename(v)), 3)
  end
  if n == nil then
    error(sformat("bad argument #%d to '%s' (number has no integer representation)", i, fname), 3)
  end
  return n
end

-- mod_lua_toval: what a Lua value becomes when Aerospike stores it (in a bin,
-- list or map). Strings are copied as C strings, so they end at the first NUL.
local function toval(v)
  local t = type(v)
  if t == "number" or t == "boolean" or t == "nil" then return v end
  if t == "string" then
    local z = sfind(v, "\0", 1, true)
    if z then return ssub(v, 1, z - 1) end
    return v
  end
  local mt = getmt(v)
  if mt == LIST or mt == MAP or mt == BYTES then return v end
  return UNSUP
end

-- ---------------------------------------------------------------------------
-- bytes: an Aerospike blob. The content is kept as a Lua string until it is
-- first written to, then as an array of byte values (the string is rebuilt
-- and cached on demand).

local function new_bytes(s, cap)
  return setmetatable({[STR] = s, [ARR] = false, [SIZE] = #s, [CAP] = max(cap or 0, #s),
                       [BTYPE] = BYTES_BLOB}, BYTES)
end

local function bytes_str(b)
  local s = b[STR]
  if s then return s end
  local a, n, parts = b[ARR], b[SIZE], {}
  for i = 1, n, CHUNK do parts[#parts + 1] = schar(tunpack(a, i, min(i + CHUNK - 1, n))) end
  s = tconcat(parts)
  b[STR] = s
  return s
end

local function bytes_arr(b)
  local a = b[ARR]
  if not a then
    local s, n = b[STR], b[SIZE]
    a = {}
    for i = 1, n, CHUNK do
      local j = min(i + CHUNK - 1, n)
      tmove({sbyte(s, i, j)}, 1, j - i + 1, i, a)
    end
    b[ARR] = a
  end
  b[STR] = false
  return a
end

local function bytes_byte(b, i)
  local a = b[ARR]
  if a then return a[i] end
  return sbyte(b[STR], i)
end

-- as_bytes_set: write string s at 1-based position i, growing the blob
-- (zero-filled) as as_bytes_ensure does.
local function bytes_write(b, i, s)
  local a, n, w = bytes_arr(b), b[SIZE], #s
  for k = n + 1, i - 1 do a[k] = 0 end
  for k = 1, w do a[i + k - 1] = sbyte(s, k) end
  local size = max(n, i - 1 + w)
  b[SIZE] = size
  b[CAP] = max(b[CAP], size)
  return true
end

-- n bytes from position i; past the end reads zeros (the server reads
-- whatever its buffer holds there).
local function bytes_sub(b, i, n)
  local s = ssub(bytes_str(b), i, i + n - 1)
  if #s < n then s = s .. string.rep("\0", n - #s) end
  return s
end

local bytes = {}

setmetatable(bytes, {__call = function(_, ...)
  local argc = select("#", ...)
  if argc == 0 then return new_bytes("", 0) end
  if argc == 1 then
    -- bytes(n) reserves n bytes of capacity; the blob is still empty
    return new_bytes("", optint((...), 0, 1, "bytes") & UINT32_MAX)
  end
end})

function bytes.size(...)
  if select("#", ...) ~= 1 then return 0 end
  local b = ...
  check(b, BYTES, 1, "size")
  return b[SIZE]
end

function bytes.set_size(...)
  if select("#", ...) ~= 2 then return false end
  local b, c = ...
  check(b, BYTES, 1, "set_size")
  c = optint(c, 0, 2, "set_size")
  if c < 0 or c > UINT32_MAX then return false end
  -- as_bytes_ensure with resize: it only ever grows the capacity
  b[CAP] = max(b[CAP], c)
  return true
end

function bytes.get_type(b)
  check(b, BYTES, 1, "get_type")
  return b[BTYPE]
end

function bytes.set_type(...)
  if select("#", ...) ~= 2 then return false end
  local b, t = ...
  check(b, BYTES, 1, "set_type")
  t = optint(t, 0, 2, "set_type")
  if t == 0 then return false end
  b[BTYPE] = t
  return true
end

local function get_byte(fname, ...)
  if select("#", ...) ~= 2 then return end
  local b, i = ...
  check(b, BYTES, 1, fname)
  i = optint(i, 0, 2, fname)
  if i < 1 or i > b[SIZE] then return end
  return bytes_byte(b, i)
end

function bytes.get_byte(...) return get_byte("get_byte", ...) end

local function set_byte(fname, ...)
  if select("#", ...) ~= 3 then return false end
  local b, i, v = ...
  check(b, BYTES, 1, fname)
  i = optint(i, 0, 2, fname)
  v = optint(v, 0, 3, fname)
  if i < 1 or i > UINT32_MAX or v < 0 or v > 255 then return false end
  local a, n = bytes_arr(b), b[SIZE]
  for k = n + 1, i - 1 do a[k] = 0 end
  a[i] = v
  if i > n then
    b[SIZE] = i
    b[CAP] = max(b[CAP], i)
  end
  return true
end

function bytes.set_byte(...) return set_byte("set_byte", ...) end

-- The fixed-width integers: (name, string.pack format, width, min, max).
local INTS = {
  {"int16", "i2", 2, -0x8000, 0x7FFF},
  {"int32", "i4", 4, -0x80000000, 0x7FFFFFFF},
  {"int64", "i8", 8, math.mininteger, math.maxinteger},
}

for _, spec in ipairs(INTS) do
  local name, fmt, width, lo, hi = spec[1], spec[2], spec[3], spec[4], spec[5]
  for _, endian in ipairs({{"", ">"}, {"_be", ">"}, {"_le", "<"}}) do
    local suffix, e = endian[1], endian[2]
    local pfmt = e .. fmt

    local gname = "get_" .. name .. suffix
    bytes[gname] = function(...)
      if select("#", ...) ~= 2 then return end
      local b, i = ...
      check(b, BYTES, 1, gname)
      i = optint(i, 0, 2, gname)
      if i < 1 or i + width - 1 > b[SIZE] then return end
      return (sunpack(pfmt, bytes_sub(b, i, width)))
    end

    local sname = "set_" .. name .. suffix
    bytes[sname] = function(...)
      if select("#", ...) ~= 3 then return false end
      local b, i, v = ...
      check(b, BYTES, 1, sname)
      i = optint(i, 0, 2, sname)
      v = optint(v, 0, 3, sname)
      if i < 1 or i > UINT32_MAX or v < lo or v > hi then return false end
      return bytes_write(b, i, spack(pfmt, v))
    end

    local aname = "append_" .. name .. suffix
    bytes[aname] = function(...)
      if select("#", ...) ~= 2 then return false end
      local b, v = ...
      check(b, BYTES, 1, aname)
      v = optint(v, 0, 2, aname)
      if v < lo or v > hi then return false end
      return bytes_write(b, b[SIZE] + 1, spack(pfmt, v))
    end
  end
end

-- as_bytes_set_var_int: 7 bits per byte, low bits first, high bit = more.
local function varint(v)
  v = v & UINT32_MAX
  local out = {}
  while v >= 0x80 do
    out[#out + 1] = schar((v & 0x7F) | 0x80)
    v = v >> 7
  end
  out[#out + 1] = schar(v)
  return tconcat(out)
end

function bytes.get_var_int(...)
  if select("#", ...) ~= 2 then return end
  local b, i = ...
  check(b, BYTES, 1, "get_var_int")
  i = optint(i, 0, 2, "get_var_int")
  if i < 1 or i > UINT32_MAX then return end
  local val, shift, k, n = 0, 0, i, b[SIZE]
  while k <= n do
    local c = bytes_byte(b, k)
    val = val | ((c & 0x7F) << shift)
    shift = shift + 7
    k = k + 1
    if c < 0x80 then break end
  end
  return val & UINT32_MAX, k - i
end

function bytes.set_var_int(...)
  if select("#", ...) ~= 3 then return 0 end
  local b, i, v = ...
  check(b, BYTES, 1, "set_var_int")
  i = optint(i, 0, 2, "set_var_int")
  v = optint(v, 0, 3, "set_var_int")
  if i < 1 or i > UINT32_MAX or v < -0x80000000 or v > 0x7FFFFFFF then return 0 end
  local s = varint(v)
  bytes_write(b, i, s)
  return #s
end

function bytes.append_var_int(...)
  if select("#", ...) ~= 2 then return 0 end
  local b, v = ...
  check(b, BYTES, 1, "append_var_int")
  v = optint(v, 0, 2, "append_var_int")
  if v < -0x80000000 or v > 0x7FFFFFFF then return 0 end
  local s = varint(v)
  bytes_write(b, b[SIZE] + 1, s)
  return #s
end

local function optstring(v, i, fname)
  if v == nil then return nil end
  if type(v) == "string" then return v end
  if type(v) == "number" then return tostring(v) end
  error(sformat("bad argument #%d to '%s' (string expected, got %s)", i, fname, typename(v)), 3)
end

function bytes.get_string(...)
  if select("#", ...) ~= 3 then return end
  local b, i, n = ...
  check(b, BYTES, 1, "get_string")
  i = optint(i, 0, 2, "get_string")
  n = optint(n, 0, 3, "get_string")
  if i < 1 or i > UINT32_MAX or n < 0 or n > UINT32_MAX then return end
  return bytes_sub(b, i, n)
end

function bytes.get_bytes(...)
  if select("#", ...) ~= 3 then return end
  local b, i, n = ...
  check(b, BYTES, 1, "get_bytes")
  i = optint(i, 0, 2, "get_bytes")
  n = optint(n, 0, 3, "get_bytes")
  if i < 1 or i > UINT32_MAX or n < 0 or n > UINT32_MAX then return end
  return new_bytes(bytes_sub(b, i, n))
end

function bytes.set_string(...)
  if select("#", ...) ~= 3 then return false end
  local b, i, s = ...
  check(b, BYTES, 1, "set_string")
  i = optint(i, 0, 2, "set_string")
  s = optstring(s, 3, "set_string")
  if i < 1 or i > UINT32_MAX or s == nil then return false end
  return bytes_write(b, i, s)
end

function bytes.set_bytes(...)
  if select("#", ...) ~= 4 then return false end
  local b, i, v, n = ...
  check(b, BYTES, 1, "set_bytes")
  i = optint(i, 0, 2, "set_bytes")
  check(v, BYTES, 3, "set_bytes")
  n = optint(n, 0, 4, "set_bytes")
  if i < 1 or i > UINT32_MAX or n < 0 or n > UINT32_MAX then return false end
  return bytes_write(b, i, ssub(bytes_str(v), 1, n))
end

function bytes.append_string(...)
  if select("#", ...) ~= 2 then return false end
  local b, s = ...
  check(b, BYTES, 1, "append_string")
  s = optstring(s, 2, "append_string")
  if s == nil or #s == 0 then return false end
  return bytes_write(b, b[SIZE] + 1, s)
end

function bytes.append_bytes(...)
  if select("#", ...) ~= 3 then return false end
  local b, v, n = ...
  check(b, BYTES, 1, "append_bytes")
  check(v, BYTES, 2, "append_bytes")
  n = optint(n, 0, 3, "append_bytes")
  if n < 0 or n > UINT32_MAX then return false end
  return bytes_write(b, b[SIZE] + 1, ssub(bytes_str(v), 1, n))
end

function bytes.append_byte(...)
  if select("#", ...) ~= 2 then return false end
  local b, v = ...
  check(b, BYTES, 1, "append_byte")
  v = optint(v, 0, 2, "append_byte")
  if v < 0 or v > 255 then return false end
  return bytes_write(b, b[SIZE] + 1, schar(v))
end

bytes.put_string, bytes.put_bytes, bytes.put_byte = bytes.set_string, bytes.set_bytes, bytes.set_byte
bytes.put_int16, bytes.put_int32, bytes.put_int64 = bytes.set_int16, bytes.set_int32, bytes.set_int64
bytes.ensure, bytes.truncate = bytes.set_size, bytes.set_size

local function bytes_tostring(b)
  -- as_bytes_val_tostring: upper-case hex pairs separated by spaces
  local s = bytes_str(b)
  if #s == 0 then return nil end
  return (sgsub(s, ".", function(c) return sformat("%02X ", sbyte(c)) end):sub(1, -2))
end

BYTES.__index = function(b, i) return get_byte("index", b, i) end
BYTES.__newindex = function(b, i, v) set_byte("newindex", b, i, v) end
-- mod_lua_bytes_size answers 0 unless called with exactly one argument, and
-- Lua calls __len with two: on the server #b is always 0. Use bytes.size.
BYTES.__len = function() return 0 end
BYTES.__tostring = function(b) return bytes_tostring(b) or "Bytes()" end
BYTES.__pairs = function(b)
  return function() error(sformat("bad argument #1 to 'for iterator' (table expected, got %s)", typename(b)), 2) end, b, nil
end

-- ---------------------------------------------------------------------------
-- as_val_tostring, for tostring() of lists and maps.

local valstr

local function list_str(l)
  local vals, parts = l[VALS], {}
  for i = 1, l[SIZE] do parts[i] = valstr(vals[i]) end
  return "[" .. tconcat(parts, ", ") .. "]"
end

local map_str  -- defined with the map

valstr = function(v)
  if v == nil or v == NIL then return "NIL" end
  local t = type(v)
  if t == "string" then return '"' .. v .. '"' end
  if t == "number" then
    if mtype(v) == "integer" then return sformat("%d", v) end
    return sformat("%.16g", v)
  end
  if t == "boolean" then return tostring(v) end
  local mt = getmt(v)
  if mt == LIST then return list_str(v) end
  if mt == MAP then return map_str(v) end
  if mt == BYTES then return bytes_tostring(v) or "<NULL>" end
  return "<NULL>"
end

-- ---------------------------------------------------------------------------
-- list: an Aerospike array list. Values live in a private array with an
-- explicit size, because a list may hold nils.

local function new_list(vals, n)
  return setmetatable({[VALS] = vals, [SIZE] = n}, LIST)
end

local list = {}

setmetatable(list, {__call = function(_, ...)
  -- mod_lua_list_cons: a single table argument supplies the values of its
  -- numeric keys, in table traversal order
  local vals, n = {}, 0
  local t = ...
  if select("#", ...) == 1 and type(t) == "table" and not is_object(t) then
    for k, v in next, t do
      if type(k) == "number" then
        n = n + 1
        v = toval(v)
        if v ~= UNSUP then vals[n] = v end
      end
    end
  end
  return new_list(vals, n)
end})

function list.create(...)
  local argc = select("#", ...)
  if argc < 1 or argc > 2 then return end
  local cap, step = ...
  if optint(cap, -1, 1, "create") < 0 then return end
  if optint(step, 10, 2, "create") < 0 then return end
  return new_list({}, 0)
end
list.new = list.create

function list.size(l)
  check(l, LIST, 1, "size")
  return l[SIZE]
end

local function list_insert(l, i, v)
  local vals, n = l[VALS], l[SIZE]
  if i > n then
    -- as_arraylist_insert past the end leaves empty (nil) slots before i
    vals[i] = v
    l[SIZE] = i
  else
    tmove(vals, i, n, i + 1)
    vals[i] = v
    l[SIZE] = n + 1
  end
end

function list.insert(l, i, v)
  check(l, LIST, 1, "insert")
  i = optint(i, 0, 2, "insert")
  if i < 1 or i > UINT32_MAX then return end
  v = toval(v)
  if v == UNSUP then return end
  list_insert(l, i, v)
end

function list.append(l, v)
  check(l, LIST, 1, "append")
  v = toval(v)
  if v == UNSUP then return end
  local n = l[SIZE] + 1
  l[VALS][n] = v
  l[SIZE] = n
end

function list.prepend(l, v)
  check(l, LIST, 1, "prepend")
  v = toval(v)
  if v == UNSUP then return end
  list_insert(l, 1, v)
end

function list.remove(l, i)
  check(l, LIST, 1, "remove")
  i = optint(i, 0, 2, "remove")
  local vals, n = l[VALS], l[SIZE]
  if i < 1 or i > n then return end
  tmove(vals, i + 1, n, i)
  vals[n] = nil
  l[SIZE] = n - 1
end

function list.concat(l, l2)
  check(l, LIST, 1, "concat")
  check(l2, LIST, 2, "concat")
  local vals, n, n2 = l[VALS], l[SIZE], l2[SIZE]
  tmove(l2[VALS], 1, n2, n + 1, vals)
  l[SIZE] = n + n2
end

function list.trim(l, i)
  check(l, LIST, 1, "trim")
  i = optint(i, 0, 2, "trim")
  local vals, n = l[VALS], l[SIZE]
  -- keeps elements 1 .. i-1
  if i < 1 or i > n then return end
  for k = i, n do vals[k] = nil end
  l[SIZE] = i - 1
end

function list.take(l, c)
  check(l, LIST, 1, "take")
  c = optint(c, 0, 2, "take")
  if c <= 0 then return nil end
  local m = min(c, l[SIZE])
  return new_list(tmove(l[VALS], 1, m, 1, {}), m)
end

function list.drop(l, c)
  check(l, LIST, 1, "drop")
  c = optint(c, 0, 2, "drop")
  if c <= 0 then return nil end
  local n = l[SIZE]
  local d = min(c, n)
  return new_list(tmove(l[VALS], d + 1, n, 1, {}), n - d)
end

function list.clone(l)
  check(l, LIST, 1, "clone")
  local n = l[SIZE]
  return new_list(tmove(l[VALS], 1, n, 1, {}), n)
end

function list.merge(l, l2)
  check(l, LIST, 1, "merge")
  check(l2, LIST, 2, "merge")
  local n, n2 = l[SIZE], l2[SIZE]
  local vals = tmove(l[VALS], 1, n, 1, {})
  tmove(l2[VALS], 1, n2, n + 1, vals)
  return new_list(vals, n + n2)
end

function list.iterator(l)
  check(l, LIST, 1, "iterator")
  local i = 0
  -- the server's iterator stops at the first nil element, as a for loop does
  return function()
    i = i + 1
    if i <= l[SIZE] then return l[VALS][i] end
  end
end

function list.tostring(l)
  check(l, LIST, 1, "tostring")
  return list_str(l)
end

-- l[i]: luaL_optlong on the index (optint is called from here so that its
-- errors point at the UDF's line)
LIST.__index = function(l, i)
  if mtype(i) ~= "integer" then i = optint(i, 0, 2, "index") end
  if i >= 1 and i <= l[SIZE] then return l[VALS][i] end
  return nil
end

LIST.__newindex = function(l, i, v)
  if mtype(i) ~= "integer" then i = optint(i, 0, 2, "newindex") end
  if i < 1 or i > UINT32_MAX then return end
  v = toval(v)
  if v == UNSUP then return end
  -- as_arraylist_set past the end grows the list, with nil slots between
  l[VALS][i] = v
  if i > l[SIZE] then l[SIZE] = i end
end

LIST.__len = function(l) return l[SIZE] end
LIST.__tostring = list_str
LIST.__pairs = BYTES.__pairs

-- ---------------------------------------------------------------------------
-- map: an Aerospike map, iterated in key order as the server's are (integers,
-- then strings bytewise, then blobs: key_less; whatever the order of insertion, for maps
-- made in Lua and maps read from bins alike). Entries are keyed by a normalised
-- key: a float key must not merge with the equal integer (as Lua table keys do)
-- and a bytes key is found by its content. The order is kept lazily: sorted
-- when iterated, if a key came in below the largest one since the last sort.

local FLOAT_TAG, BYTES_TAG = "\255\254F", "\255\254B"

local function nkey(k)
  local t = type(k)
  if t == "string" or t == "boolean" then return k end
  if t == "number" then
    if mtype(k) == "integer" then return k end
    return FLOAT_TAG .. spack("d", k)
  end
  if getmt(k) == BYTES then return BYTES_TAG .. bytes_str(k) end
  return k  -- lists and maps as keys: by identity
end

local function new_map()
  return setmetatable({[VALS] = {}, [KEYS] = false, [ORDER] = {}, [POS] = {}, [SIZE] = 0, [HOLES] = 0, [SORTED] = true,
                      [MAXK] = false}, MAP)  -- every private key present: a missing one would go to __newindex
end

-- The server's order of types (docs: cdt-ordering): boolean, integer, string,
-- list, map, bytes, double. Lists and maps as keys sort by identity here.
local function key_rank(k)
  local t = type(k)
  if t == "boolean" then return 1 end
  if t == "number" then return mtype(k) == "integer" and 2 or 6 end
  if t == "string" then return 3 end
  if getmt(k) == BYTES then return 5 end
  return 4
end

-- the server's order of map keys (originals, not normalised)
local function key_less(a, b)
  local ra, rb = key_rank(a), key_rank(b)
  if ra ~= rb then return ra < rb end
  if ra == 2 or ra == 3 or ra == 6 then return a < b end
  if ra == 5 then return bytes_str(a) < bytes_str(b) end
  if ra == 1 then return (not a) and b end
  return false
end

-- k and v have been through toval; v may be nil (stored as NIL)
local function map_set(m, k, v)
  local nk = nkey(k)
  local vals = m[VALS]
  if vals[nk] == nil then
    local order = m[ORDER]
    local p = #order + 1
    order[p] = nk
    m[POS][nk] = p
    m[SIZE] = m[SIZE] + 1
    if m[SORTED] then
      local top = m[MAXK]
      if top == false or key_less(top, k) then m[MAXK] = k else m[SORTED] = false end
    end
    if nk ~= k then
      local keys = m[KEYS]
      if not keys then keys = {}; m[KEYS] = keys end
      keys[nk] = k
    end
  end
  if v == nil then v = NIL end
  vals[nk] = v
end

local function map_compact(m)
  local order, pos, out = m[ORDER], m[POS], {}
  for i = 1, #order do
    local nk = order[i]
    if nk ~= TOMB then
      out[#out + 1] = nk
      pos[nk] = #out
    end
  end
  m[ORDER] = out
  m[HOLES] = 0
end

local function map_remove(m, k)
  local nk = nkey(k)
  local vals = m[VALS]
  if vals[nk] == nil then return end
  vals[nk] = nil
  local pos = m[POS]
  m[ORDER][pos[nk]] = TOMB
  pos[nk] = nil
  local keys = m[KEYS]
  if keys then keys[nk] = nil end
  m[SIZE] = m[SIZE] - 1
  local holes = m[HOLES] + 1
  m[HOLES] = holes
  if holes > 16 and holes > m[SIZE] then map_compact(m) end
end

local function map_key(m, nk)
  local keys = m[KEYS]
  return keys and keys[nk] or nk
end

-- Compacts the order of entries, and sorts it by key if it is not sorted.
local function map_sort(m)
  if m[SORTED] then
    if m[HOLES] > 0 then map_compact(m) end
    return
  end
  local order, out = m[ORDER], {}
  for i = 1, #order do
    if order[i] ~= TOMB then out[#out + 1] = order[i] end
  end
  tsort(out, function(x, y) return key_less(map_key(m, x), map_key(m, y)) end)
  local pos = m[POS]
  for i = 1, #out do pos[out[i]] = i end
  m[ORDER] = out
  m[HOLES] = 0
  m[SORTED] = true
  if #out > 0 then m[MAXK] = map_key(m, out[#out]) else m[MAXK] = false end
end

local function map_value(v)
  if v == NIL then return nil end
  return v
end

-- the live entries as an iterator of (key, value)
local function map_entries(m)
  map_sort(m)
  local i = 0
  return function()
    local order = m[ORDER]
    repeat
      i = i + 1
      local nk = order[i]
      if nk == nil then return end
      if nk ~= TOMB then return map_key(m, nk), map_value(m[VALS][nk]) end
    until false
  end
end

local map = {}

setmetatable(map, {__call = function(_, ...)
  local m = new_map()
  local t = ...
  if select("#", ...) == 1 and type(t) == "table" and not is_object(t) then
    for k, v in next, t do
      k, v = toval(k), toval(v)
      if k ~= UNSUP and v ~= UNSUP then map_set(m, k, v) end
    end
  end
  return m
end})

function map.create(...)
  if select("#", ...) ~= 1 then return end
  if optint((...), 0, 1, "create") < 1 then return end
  return new_map()
end
map.new = map.create

function map.size(m)
  check(m, MAP, 1, "size")
  return m[SIZE]
end

function map.pairs(m)
  check(m, MAP, 1, "pairs")
  return map_entries(m)
end
map.iterator = map.pairs

function map.keys(m)
  check(m, MAP, 1, "keys")
  local it = map_entries(m)
  return function() return (it()) end
end

function map.values(m)
  check(m, MAP, 1, "values")
  local it = map_entries(m)
  return function()
    local _, v = it()
    return v
  end
end

function map.remove(m, k)
  check(m, MAP, 1, "remove")
  k = toval(k)
  if k == UNSUP or k == nil then return end
  map_remove(m, k)
end

function map.clone(m)
  check(m, MAP, 1, "clone")
  local c = new_map()
  for k, v in map_entries(m) do map_set(c, k, v) end
  return c
end

-- a new map with m1's entries then m2's; f(v1, v2) resolves a key in both
function map.merge(m1, m2, f)
  check(m1, MAP, 1, "merge")
  check(m2, MAP, 2, "merge")
  local out = new_map()
  for k, v in map_entries(m1) do map_set(out, k, v) end
  local vals = m1[VALS]
  for k, v in map_entries(m2) do
    local mine = vals[nkey(k)]
    if mine ~= nil and f ~= nil then
      v = toval(f(map_value(mine), v))
      if v ~= UNSUP then map_set(out, k, v) end
    else
      map_set(out, k, v)
    end
  end
  return out
end

-- a new map of the entries whose key is in only one of m1 and m2
function map.diff(m1, m2)
  check(m1, MAP, 1, "diff")
  check(m2, MAP, 2, "diff")
  local out, v1, v2 = new_map(), m1[VALS], m2[VALS]
  for k, v in map_entries(m1) do
    if v2[nkey(k)] == nil then map_set(out, k, v) end
  end
  for k, v in map_entries(m2) do
    if v1[nkey(k)] == nil then map_set(out, k, v) end
  end
  return out
end

map_str = function(m)
  local parts = {}
  for k, v in map_entries(m) do parts[#parts + 1] = valstr(k) .. ":" .. valstr(v) end
  return "{" .. tconcat(parts, ", ") .. "}"
end

function map.tostring(m)
  check(m, MAP, 1, "tostring")
  return map_str(m)
end

MAP.__index = function(m, k)
  k = toval(k)
  if k == UNSUP or k == nil then return nil end
  return map_value(m[VALS][nkey(k)])
end

MAP.__newindex = function(m, k, v)
  k = toval(k)
  if k == UNSUP or k == nil then return end
  v = toval(v)
  -- mod_lua_map_newindex: a value Aerospike cannot hold removes the key,
  -- while nil is stored as a nil value
  if v == UNSUP then
    map_remove(m, k)
  else
    map_set(m, k, v)
  end
end

MAP.__len = function(m) return m[SIZE] end
MAP.__tostring = map_str
MAP.__pairs = BYTES.__pairs

-- ---------------------------------------------------------------------------
-- msgpack sizes, for list.nbytes / map.nbytes (as the server's serializer
-- writes them: strings and blobs carry a one-byte type prefix).

local nbytes

local function len_header(n, small, fix)
  if n < small then return fix end
  if n < 0x10000 then return 3 end
  return 5
end

nbytes = function(v)
  if v == nil or v == NIL then return 1 end
  local t = type(v)
  if t == "boolean" then return 1 end
  if t == "number" then
    if mtype(v) == "float" then return 9 end
    if v >= -32 and v < 128 then return 1 end
    if v >= -0x80 and v < 0x100 then return 2 end
    if v >= -0x8000 and v < 0x10000 then return 3 end
    if v >= -0x80000000 and v < 0x100000000 then return 5 end
    return 9
  end
  if t == "string" then
    local n = #v + 1
    if n < 32 then return 1 + n end
    if n < 0x100 then return 2 + n end
    return len_header(n, 0, 0) + n
  end
  local mt = getmt(v)
  if mt == BYTES then
    local n = v[SIZE] + 1
    if n < 0x100 then return 2 + n end
    return len_header(n, 0, 0) + n
  end
  if mt == LIST then
    local size, vals = len_header(v[SIZE], 16, 1), v[VALS]
    for i = 1, v[SIZE] do size = size + nbytes(vals[i]) end
    return size
  end
  if mt == MAP then
    local size = len_header(v[SIZE], 16, 1)
    for k, x in map_entries(v) do size = size + nbytes(k) + nbytes(x) end
    return size
  end
  return 1
end

function list.nbytes(l)
  check(l, LIST, 1, "nbytes")
  return nbytes(l)
end

function map.nbytes(m)
  check(m, MAP, 1, "nbytes")
  return nbytes(m)
end

-- as_bin_particle_alloc_from_asval and back: a value written to the record
-- is a copy, so later changes to the Lua object do not reach the record.
local function deep_copy(v)
  local mt = getmt(v)
  if mt == LIST then
    local n = v[SIZE]
    local vals = tmove(v[VALS], 1, n, 1, {})
    for i = 1, n do
      if type(vals[i]) == "table" then vals[i] = deep_copy(vals[i]) end
    end
    return new_list(vals, n)
  elseif mt == MAP then
    local c = new_map()
    for k, x in map_entries(v) do map_set(c, deep_copy(k), deep_copy(x)) end
    return c
  elseif mt == BYTES then
    local c = new_bytes(bytes_str(v))
    c[BTYPE] = v[BTYPE]
    return c
  end
  return v
end

-- ---------------------------------------------------------------------------
-- record and aerospike. One state table per UDF call:
--   open       aerospike:exists(rec): the record existed, or was created
--   existed    it existed when the call began (its bins come from Python)
--   cache      bin name -> value read or staged (NIL: staged delete)
--   dirty      bin name -> true for staged values; dlist keeps their order
--   applied    bin name -> value (or DEL) written by create/update/remove,
--              i.e. the server's storage record; aorder keeps first-write order
--   has_updates  create/update/remove succeeded: the record is written
--              (or deleted, when no bin is left) after the call

local function valid_name(name)
  local n = #name
  return n > 0 and n <= 15 and utf8len(name) ~= nil
end

local function bin_name(name, fname)
  if type(name) == "string" then return name end
  if type(name) == "number" then return tostring(name) end
  if name == nil then return nil end
  error(sformat("bad argument #2 to '%s' (string expected, got %s)", fname, typename(name)), 3)
end

local function stored_names(st)
  local stored = st.stored
  if not stored then
    stored = st.existed and {py_binnames()} or {}
    st.stored = stored
  end
  return stored
end

-- the bins of the server's storage record: stored ones, less deleted ones,
-- plus those created by create/update
local function rd_names(st)
  local stored, applied = stored_names(st), st.applied
  local names, n = {}, 0
  if not applied then
    for i = 1, #stored do names[i] = stored[i] end
    return names
  end
  local seen = {}
  for i = 1, #stored do
    local s = stored[i]
    seen[s] = true
    if applied[s] ~= DEL then
      n = n + 1
      names[n] = s
    end
  end
  local order = st.aorder
  for i = 1, #order do
    local s = order[i]
    if not seen[s] and applied[s] ~= DEL then
      n = n + 1
      names[n] = s
    end
  end
  return names
end

-- udf_aerospike.c execute_updates: staged values go into the storage record
local function execute(st)
  local applied, aorder = st.applied, st.aorder
  if not applied then
    applied, aorder = {}, {}
    st.applied, st.aorder = applied, aorder
  end
  local cache, dirty, dlist = st.cache, st.dirty, st.dlist
  for i = 1, #dlist do
    local name = dlist[i]
    if dirty[name] then
      local v = cache[name]
      if applied[name] == nil then aorder[#aorder + 1] = name end
      if v == NIL then
        applied[name] = DEL
        cache[name] = nil
      else
        applied[name] = deep_copy(v)
      end
      dirty[name] = nil
    end
  end
  st.dlist = {}
  st.has_updates = true
end

RECORD.__index = function(rec, name)
  local st = rec[STATE]
  if type(name) ~= "string" then
    name = bin_name(name, "index")
    if name == nil then return nil end
  end
  local v = st.cache[name]
  if v ~= nil then
    if v == NIL then return nil end
    return v
  end
  if not st.open or not valid_name(name) then return nil end
  local applied = st.applied
  local a = applied and applied[name]
  if a then
    if a == DEL then return nil end
    v = deep_copy(a)
  elseif st.existed then
    v = py_getbin(name)
    if v == nil then return nil end
  else
    return nil
  end
  -- udf_record_get caches what it read (not dirty): later reads return the
  -- same object, but changing it in place writes nothing
  st.cache[name] = v
  return v
end

RECORD.__newindex = function(rec, name, v)
  local st = rec[STATE]
  name = bin_name(name, "newindex")
  v = toval(v)
  if v == UNSUP then
    error(sformat("can't set bin %s to unsupported type", tostring(name)), 2)
  end
  if name == nil or not valid_name(name) then return end
  st.cache[name] = (v == nil) and NIL or v
  if not st.dirty[name] then
    st.dirty[name] = true
    local dlist = st.dlist
    dlist[#dlist + 1] = name
  end
end

RECORD.__tostring = function(rec) return sformat("userdata: %p", rec) end
RECORD.__pairs = BYTES.__pairs

local record = {}

local function rstate(rec, fname)
  if getmt(rec) ~= RECORD then
    if not is_object(rec) then
      error(sformat("bad argument #1 to '%s' (userdata expected, got %s)", fname, typename(rec)), 3)
    end
    error(sformat("bad argument #1 to '%s' (Record expected, got %s)", fname, typename(rec)), 3)
  end
  return rec[STATE]
end

function record.gen(rec)
  local st = rstate(rec, "gen")
  return st.open and st.gen or 0
end

function record.ttl(rec)
  local st = rstate(rec, "ttl")
  return st.open and st.ttl or 0
end

function record.last_update_time(rec)
  local st = rstate(rec, "last_update_time")
  return st.open and st.lut or 0
end

function record.set_ttl(rec, ttl)
  local st = rstate(rec, "set_ttl")
  -- the server keeps it as the write's uint32 ttl
  st.set_ttl = optint(ttl, 0, 2, "set_ttl") & UINT32_MAX
end

function record.drop_key(rec)
  local st = rstate(rec, "drop_key")
  if st.open then st.key = nil end
end

function record.key(rec)
  local st = rstate(rec, "key")
  if not st.open then return nil end
  local k = st.key
  if getmt(k) == BYTES then return deep_copy(k) end
  return k
end

function record.setname(rec)
  local st = rstate(rec, "setname")
  if not st.open then return nil end
  return st.setname
end

function record.digest(rec)
  local st = rstate(rec, "digest")
  return new_bytes(st.digest)
end

function record.numbins(rec)
  local st = rstate(rec, "numbins")
  if not st.open then return 0 end
  return #rd_names(st)
end

function record.bin_names(rec)
  local st = rstate(rec, "bin_names")
  if not st.open then return {} end
  return rd_names(st)
end

function record.device_size(rec)
  rstate(rec, "device_size")
  return 0
end

function record.set_flags(rec) rstate(rec, "set_flags") end
function record.set_type(rec) rstate(rec, "set_type") end

local methods = {}
local current_now = 0  -- aerospike:get_current_time() of the call under way
AEROSPIKE.__index = methods
AEROSPIKE.__tostring = RECORD.__tostring
AEROSPIKE.__pairs = BYTES.__pairs

local function target(self, rec, fname)
  if getmt(self) ~= AEROSPIKE then
    error(sformat("bad argument #1 to '%s' (Aerospike expected, got %s)", fname, typename(self)), 3)
  end
  if getmt(rec) ~= RECORD then
    error(sformat("bad argument #1 to '%s' (Record expected, got %s)", fname, typename(rec)), 3)
  end
  return rec[STATE]
end

function methods.create(self, rec)
  local st = target(self, rec, "create")
  if st.open then
    -- an existing record (with bins) cannot be created again
    if #rd_names(st) ~= 0 then return 1 end
  else
    st.open = true
  end
  execute(st)
  return 0
end

function methods.update(self, rec)
  local st = target(self, rec, "update")
  if not st.open then return -2 end
  execute(st)
  return 0
end

function methods.exists(self, rec)
  local st = target(self, rec, "exists")
  return st.open
end

function methods.remove(self, rec)
  local st = target(self, rec, "remove")
  if not st.open then return 1 end
  -- drop everything staged, then delete every bin; the record itself is
  -- deleted after the call because no bin is left (unless bins are written
  -- again), and until then aerospike:exists(rec) stays true
  local cache, dirty, dlist = {}, {}, {}
  for i, name in ipairs(rd_names(st)) do
    cache[name] = NIL
    dirty[name] = true
    dlist[i] = name
  end
  st.cache, st.dirty, st.dlist = cache, dirty, dlist
  execute(st)
  return 0
end

function methods.get_current_time(self)
  if getmt(self) ~= AEROSPIKE then
    error(sformat("bad argument #1 to 'get_current_time' (Aerospike expected, got %s)", typename(self)), 2)
  end
  return current_now
end

function methods.log(self, level, msg)
  return 0
end

-- ---------------------------------------------------------------------------
-- Log functions: the server formats the message (so format errors reach the
-- UDF) and logs it at its UDF log level; here it is discarded.

local function log(m, ...)
  sformat(m, ...)
end

-- ---------------------------------------------------------------------------
-- The sandbox of one module: its own globals, and copies of the library
-- tables so that a module changing them cannot affect another.

local function copy(t)
  local c = {}
  for k, v in next, t do c[k] = v end
  return setmetatable(c, getmetatable(t))
end

local function not_object(fname, v)
  if is_object(v) then
    error(sformat("bad argument #1 to '%s' (table expected, got userdata)", fname), 3)
  end
end

local function sb_type(v)
  local t = type(v)
  if t == "table" and is_object(v) then return "userdata" end
  return t
end

local function sb_next(t, k)
  not_object("next", t)
  return next(t, k)
end

local function sb_rawget(t, k)
  not_object("rawget", t)
  return rawget(t, k)
end

local function sb_rawset(t, k, v)
  not_object("rawset", t)
  return rawset(t, k, v)
end

local function sb_rawlen(t)
  not_object("rawlen", t)
  return rawlen(t)
end

local function sb_setmetatable(t, mt)
  not_object("setmetatable", t)
  return setmetatable(t, mt)
end

local function new_env()
  local m = copy(math)
  m.pow = nil
  local env = {
    string = copy(string), math = m, table = copy(table),
    -- The server's UDF state has Lua's whole standard library (seen on 8.1); these
    -- parts of it are safe for any UDF: no files, processes or loading of code.
    utf8 = copy(utf8), coroutine = copy(coroutine),
    os = {time = os.time, clock = os.clock, date = os.date, difftime = os.difftime},
    tostring = tostring, tonumber = tonumber, type = sb_type,
    pairs = pairs, ipairs = ipairs, next = sb_next, select = select,
    error = error, pcall = pcall, xpcall = xpcall, assert = assert,
    setmetatable = sb_setmetatable, getmetatable = getmetatable,
    rawget = sb_rawget, rawset = sb_rawset, rawequal = rawequal, rawlen = sb_rawlen,
    _VERSION = _VERSION,
    trace = log, debug = log, info = log, warn = log,
    record = copy(record), list = copy(list), map = copy(map), bytes = copy(bytes),
    aerospike = setmetatable({}, AEROSPIKE),
  }
  env._G = env
  return env
end

-- ---------------------------------------------------------------------------
-- Exported to Python.

local api = {}

function api.compile(name, src)
  local env = new_env()
  local chunk, err = load(src, "@" .. name .. ".lua", "t", env)
  if not chunk then return false, err end
  local ok, e = pcall(chunk)
  if not ok then
    return false, type(e) == "string" and e or (name .. ".lua: module failed to load")
  end
  return true, env
end

-- A value on its way to Python: strings that are not UTF-8 are wrapped (Python
-- decodes them with replacement characters); anything Aerospike cannot hold
-- becomes nil.
local function export(v)
  local t = type(v)
  if t == "string" then
    if utf8len(v) then return v end
    return setmetatable({v}, BADSTR)
  end
  if t == "number" or t == "boolean" then return v end
  local mt = getmt(v)
  if mt == LIST or mt == MAP or mt == BYTES then return v end
  return nil
end

-- status 0: ok, result, has_updates, ttl, then (bin name, value) pairs of
-- the bins written (value nil: deleted). 1: failed, message (nil when the
-- error value is not a string). 2: function not found. 3: failed, message
-- as hex (not UTF-8).
function api.invoke(env, fname, exists, gen, ttl, lut, digest, setname, key, now, ...)
  local f = rawget(env, fname)
  if type(f) ~= "function" then return 2 end
  local st = {
    open = exists, existed = exists, gen = gen, ttl = ttl, lut = lut,
    digest = digest, setname = setname, key = key,
    cache = {}, dirty = {}, dlist = {}, applied = false, aorder = false,
    has_updates = false, set_ttl = false, stored = false,
  }
  current_now = now
  local ok, res = pcall(f, setmetatable({[STATE] = st}, RECORD), ...)
  if not ok then
    if type(res) ~= "string" then return 1 end
    res = toval(res)
    if utf8len(res) then return 1, res end
    return 3, hex(res)
  end
  res = export(toval(res))
  local set_ttl = st.set_ttl
  if set_ttl == false then set_ttl = nil end
  if not st.has_updates then return 0, res, false, set_ttl end
  local applied, aorder, out = st.applied, st.aorder, {}
  local n = #aorder
  for i = 1, n do
    local name = aorder[i]
    local v = applied[name]
    out[2 * i - 1] = name
    if v ~= DEL then out[2 * i] = export(v) end
  end
  return 0, res, true, set_ttl, tunpack(out, 1, 2 * n)
end

-- Python reads lists, maps and blobs through these.
function api.describe(o)
  local mt = getmt(o)
  if mt == LIST then return "L", o[SIZE] end
  if mt == MAP then
    map_sort(o)
    return "M", o[SIZE]
  end
  if mt == BYTES then
    local s = bytes_str(o)
    if utf8len(s) then return "B", s end
    return "X", hex(s)
  end
  if mt == BADSTR then return "S", hex(o[1]) end
  return "N", nil
end

-- Elements i..j of a list, after a leading true (so Python always gets a
-- tuple). The fast form hands the values over as they are, and answers false
-- when one of them is an object: Python then asks for the exported form (as
-- it does when a string is not UTF-8 and cannot be decoded).
function api.list_items(o, i, j)
  local vals = o[VALS]
  for k = i, j do
    if type(vals[k]) == "table" then return false end
  end
  return true, tunpack(vals, i, j)
end

function api.list_items_exported(o, i, j)
  local vals, out = o[VALS], {true}
  for k = i, j do out[k - i + 2] = export(vals[k]) end
  return tunpack(out, 1, j - i + 2)
end

-- Entries i..j (of a compacted map) as key, value, key, value..., after a
-- leading true; the fast and exported forms as for lists.
function api.map_items(o, i, j)
  local order, vals, keys, out = o[ORDER], o[VALS], o[KEYS], {true}
  if keys then return false end
  for p = i, j do
    local nk = order[p]
    local v = vals[nk]
    if type(nk) == "table" then return false end
    if v == NIL then
      v = nil
    elseif type(v) == "table" then
      return false
    end
    out[2 * (p - i) + 2] = nk
    out[2 * (p - i) + 3] = v
  end
  return tunpack(out, 1, 2 * (j - i + 1) + 1)
end

function api.map_items_exported(o, i, j)
  local order, vals, out = o[ORDER], o[VALS], {true}
  for p = i, j do
    local nk = order[p]
    out[2 * (p - i) + 2] = export(map_key(o, nk))
    out[2 * (p - i) + 3] = export(map_value(vals[nk]))
  end
  return tunpack(out, 1, 2 * (j - i + 1) + 1)
end

-- Python builds lists, maps and blobs through these. Values arrive converted.
function api.new_list(vals, n)
  return new_list(vals, n)
end

function api.new_map(keys, vals, n)
  local m = new_map()
  for i = 1, n do map_set(m, keys[i], vals[i]) end
  return m
end

function api.new_bytes(s)
  return new_bytes(s)
end

return api
