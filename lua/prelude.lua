-- Shared prelude of every edgeguard limiter script (lua.Source prepends it).
--
-- ARGV: 1 mode ("take" | "refund"), 2 now in µs (0 = Redis server TIME;
--       below 0: Redis server TIME, and the latest TIME at which the call
--       may still run is -now: past it the caller has stopped waiting, and
--       the call refuses with "edgeguard: past the caller's deadline"
--       before it reads or writes anything),
--       3 limit, 4 window in µs, 5 extra (burst for GCRA and the leaky
--       bucket, min_interval µs for the sliding log),
--       6 take: cost | refund: units, 7 take: need (one request's cost: units
--       are admitted in multiples of it, and the retry time is for it) |
--       refund: state of the take,
--       8 request id (unique member prefix; sliding log and concurrency only),
--       9 refund: index of the first member to give back (same);
--       fixed and sliding window: 8 '1' to tally the call (tally.lua).
-- take returns {admitted, remaining, reset_after_ms, retry_after_ms, state}
-- (and, from a tallied take, who ran it).
-- Times go out in whole milliseconds rounded up, so a client told to come back
-- after retry_after is never early.
--
-- Every redis.call costs the server about as much as a command a client
-- sends: the scripts make as few as the algorithm allows (one read of the
-- state, one write when something is admitted, a TTL only when it moves) and
-- define no functions they do not use.
local mode = ARGV[1]
local now = tonumber(ARGV[2])
local limit = tonumber(ARGV[3])
local window = tonumber(ARGV[4])
local extra = tonumber(ARGV[5])
local cost = tonumber(ARGV[6])
local aux = tonumber(ARGV[7])
if not (now and limit and window and extra and cost and aux) or limit <= 0 or window <= 0 or cost < 0 then
  return redis.error_reply('ERR edgeguard: bad script arguments')
end
-- dated: the caller gave the time (a restore, a replay, a test), which may
-- be earlier than the state's last write: a script never lets such a call
-- shorten a key's life or move its clock back.
local dated = now > 0
if now <= 0 then
  local latest = -now
  now = server_now()
  if latest > 0 and now > latest then
    return redis.error_reply("ERR edgeguard: past the caller's deadline")
  end
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
