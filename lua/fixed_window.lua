-- Fixed window: KEYS[1] is a hash with one field per window, named by the
-- window's start (ms; windows are aligned to the epoch), holding the units
-- admitted in it. Cheapest, and admits up to 2×limit across a boundary
-- (limit at the end of one window, limit at the start of the next).
-- A take adds its cost first (one HINCRBY: the read and the write of an
-- admitted request in one call) and gives back what it did not admit, so a
-- denial leaves the count as it found it. The TTL ends the window: it is set
-- when a window's first unit is admitted, and a field left from the window
-- before (the key outlived its window by a rounding) goes with the key.
local key = KEYS[1]
local W = math.floor(window / 1000)
local nowms = math.floor(now / 1000)
local ws = nowms - math.fmod(nowms, W)
-- ARGV[8] '1': the caller saw a sign that the master serving the key may
-- have changed, in this window, in the last minute. What the call admits
-- (or gives back) is also tallied for the server it runs on, as it is now:
-- a hash beside the count, KEYS[1]..':post:'..run_id..':'..master_replid,
-- one field per window start, which ends with the window. A restore on
-- this server of an answer another server gave adds the window's tally
-- (lua.Batch): the units admitted here since the change, which that
-- answer cannot hold, so they are not absorbed by it. Such a take answers
-- a sixth value, who ran it (run_id:master_replid), so the edge knows
-- which server its answer came from. Only such calls read INFO, once per
-- script run (identity(), lua.go).
local function tally(w, units)
  if ARGV[8] ~= '1' then return end
  local here = identity()
  if not here then return end
  if units == 0 then return here end
  local pk = key .. ':post:' .. here
  if redis.call('HINCRBY', pk, w, units) <= 0 then
    redis.call('HDEL', pk, w)
  end
  local ttl = math.max(1, w + W - nowms)
  if redis.call('PTTL', pk) < ttl then
    redis.call('PEXPIRE', pk, ttl)
  end
  return here
end
if mode == 'refund' then
  local n = tonumber(redis.call('HGET', key, aux))
  if n then
    redis.call('HSET', key, aux, math.max(0, n - cost))
    tally(aux, -math.min(n, cost))
  end
  return 0
end
local need = aux
local n
if cost > 0 then
  n = redis.call('HINCRBY', key, ws, cost) - cost
else
  n = tonumber(redis.call('HGET', key, ws)) or 0
end
local admitted = math.max(0, math.min(cost, limit - n))
admitted = whole(admitted, need)
if admitted < cost then
  if n + admitted == 0 then
    redis.call('HDEL', key, ws)
  else
    redis.call('HINCRBY', key, ws, admitted - cost)
  end
end
if admitted > 0 and n == 0 then
  -- A dated call's window may be an earlier one than the key's (a restore
  -- that reached Redis after its window ended): its TTL would end the
  -- key, and the newer window's count in it, that much from now.
  local ttl = math.max(1, ws + W - nowms)
  if not dated or redis.call('PTTL', key) < ttl then
    redis.call('PEXPIRE', key, ttl)
  end
end
n = n + admitted
local ran = tally(ws, admitted)
local reset = ws + W - nowms
local retry = 0
if admitted < cost and (need > limit or n + need > limit) then retry = reset end
if ran then
  return {admitted, math.max(0, limit - n), reset, retry, ws, ran}
end
return {admitted, math.max(0, limit - n), reset, retry, ws}
