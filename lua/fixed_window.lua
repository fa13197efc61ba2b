-- Fixed window: KEYS[1] is a hash {w = window start ms, n = count}; windows are
-- aligned to the epoch. Cheapest, and admits up to 2×limit across a boundary
-- (limit at the end of one window, limit at the start of the next).
-- The TTL ends the window: it is set when a window's first unit is admitted
-- and stays (every later admission of the window would set the same time).
local key = KEYS[1]
local W = math.floor(window / 1000)
local nowms = math.floor(now / 1000)
local ws = nowms - math.fmod(nowms, W)
local h = redis.call('HMGET', key, 'w', 'n')
local w = tonumber(h[1])
if mode == 'refund' then
  if w == aux then
    redis.call('HSET', key, 'n', math.max(0, tonumber(h[2]) - cost))
  end
  return 0
end
local n = 0
if w and w >= ws then
  ws = w
  n = tonumber(h[2])
end
local need = aux
local admitted = math.max(0, math.min(cost, limit - n))
admitted = whole(admitted, need)
if admitted > 0 then
  n = n + admitted
  if w == ws then
    redis.call('HSET', key, 'n', n)
  else
    redis.call('HSET', key, 'w', ws, 'n', n)
    redis.call('PEXPIRE', key, math.max(1, ws + W - nowms))
  end
end
local reset = ws + W - nowms
local retry = 0
if admitted < cost and (need > limit or n + need > limit) then retry = reset end
return {admitted, math.max(0, limit - n), reset, retry, ws}
