-- Shared prelude of every edgeguard limiter script (lua.Source prepends it).
--
-- ARGV: 1 mode ("take" | "refund"), 2 now in µs (0 = Redis server TIME),
--       3 limit, 4 window in µs, 5 extra (burst for GCRA, min_interval µs for
--       the sliding log), 6 request id (unique member prefix),
--       7 take: cost | refund: units, 8 take: need (one request's cost: units
--       are admitted in multiples of it, and the retry time is for it) |
--       refund: state of the take,
--       9 refund: index of the first member to give back (sliding log, concurrency).
-- take returns {admitted, remaining, reset_after_ms, retry_after_ms, state}.
-- Times go out in whole milliseconds rounded up, so a client told to come back
-- after retry_after is never early.
local mode = ARGV[1]
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local extra = tonumber(ARGV[5])
local id = ARGV[6]
local cost = tonumber(ARGV[7])
local aux = tonumber(ARGV[8])
local first = tonumber(ARGV[9]) or 1
if not (now and limit and window and extra and id and cost and aux) or limit <= 0 or window <= 0 or cost < 0 then
  return redis.error_reply('ERR edgeguard: bad script arguments')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000000 + tonumber(t[2])
end

-- Units are admitted in whole requests: `need` is one request's cost, so a
-- single request is all-or-nothing and a coalesced batch of equal-cost
-- requests admits whole ones (partial admission without leftovers).
local function whole(admitted, need)
  return admitted - math.fmod(admitted, need)
end

local function ms(us)
  if us <= 0 then return 0 end
  return math.ceil(us / 1000)
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
