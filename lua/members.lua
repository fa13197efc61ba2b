-- Helpers of the algorithms that keep one ZSET member per unit (sliding log,
-- concurrency); lua.Source adds them after the prelude.
local id = ARGV[8]
local first = tonumber(ARGV[9]) or 1
if not id then
  return redis.error_reply('ERR edgeguard: bad script arguments')
end

-- ZADD/ZREM one member per unit ("<id>:<i>", i from first), in chunks that
-- unpack can carry.
local function each_member_chunk(n, per_member, fn)
  local args = {}
  for i = first, first + n - 1 do
    per_member(args, id .. ':' .. i)
    if #args >= 1000 then fn(args); args = {} end
  end
  if #args > 0 then fn(args) end
end

local function zadd_units(key, score, n)
  each_member_chunk(n, function(args, m) args[#args + 1] = score; args[#args + 1] = m end,
    function(args) redis.call('ZADD', key, unpack(args)) end)
end

local function zrem_units(key, n)
  each_member_chunk(n, function(args, m) args[#args + 1] = m end,
    function(args) redis.call('ZREM', key, unpack(args)) end)
end
