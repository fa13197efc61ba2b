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
-- A take made after a sign of a master change is tallied (tally.lua): the
-- tally of a window ends with it.
if mode == 'refund' then
  local n = tonumber(redis.call('HGET', key, aux))
  if n then
    redis.call('HSET', key, aux, math.max(0, n - cost))
    if tally then tally(key, aux, -math.min(n, cost), aux + W - nowms) end
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
local ran = tally and tally(key, ws, admitted, ws + W - nowms)
local reset = ws + W - nowms
local retry = 0
if admitted < cost and (need > limit or n + need > limit) then retry = reset end
if ran then
  return {admitted, math.max(0, limit - n), reset, retry, ws, ran}
end
return {admitted, math.max(0, limit - n), reset, retry, ws}
