-- Leaky bucket (as a meter, the shaping algorithm): KEYS[1] is a hash
-- {l = level in units, t = when it was last leaked, µs}. The bucket leaks at
-- limit/window units per µs and holds burst (extra) or limit; a request fits
-- when level + cost ≤ capacity. Denials write nothing; a refund lowers the
-- stored level.
local key = KEYS[1]
local rate = limit / window
local cap = limit
if extra > 0 then cap = extra end
-- A take made after a sign of a master change is tallied (tally.lua): one
-- count per server (field 0: a bucket has no window), kept a window past
-- its last tallied take; a refund takes off what it gives back.
if mode == 'refund' then
  -- Lower the stored level and leave its time: a refund never moves the
  -- leak clock (the caller's clock may differ from the take's).
  local h = redis.call('HMGET', key, 'l', 't')
  local stored = tonumber(h[1])
  if stored then
    local before = stored
    stored = math.max(0, stored - cost)
    if stored > 0 then redis.call('HSET', key, 'l', stored) else redis.call('DEL', key) end
    if tally then
      -- What fits now, before and after: the units given back.
      local leaked = math.max(0, now - (tonumber(h[2]) or now)) * rate
      local function fits(l) return math.floor(cap - math.max(0, l - leaked) + 1e-9) end
      tally(key, 0, fits(before) - fits(stored), math.ceil(window / 1000))
    end
  end
  return 0
end
local h = redis.call('HMGET', key, 'l', 't')
local level, t = tonumber(h[1]), tonumber(h[2])
if level then
  level = math.max(0, level - math.max(0, now - t) * rate)
else
  level = 0
end
local need = aux
-- 1e-9 absorbs float error in the leaked level.
local function fits() return math.floor(cap - level + 1e-9) end
local admitted = math.max(0, math.min(cost, fits()))
admitted = whole(admitted, need)
if admitted > 0 then
  level = level + admitted
  -- A dated call older than the last leak (a restore of an earlier answer)
  -- adds to the level as of then: the leak clock never goes back, which
  -- would leak again what had already leaked.
  redis.call('HSET', key, 'l', level, 't', math.max(now, t or now))
  redis.call('PEXPIRE', key, math.max(1, ms(level / rate)))
end
local ran = tally and tally(key, 0, admitted, math.ceil(window / 1000))
local retry = 0
if admitted < cost then
  if need > cap then retry = level / rate else retry = (level + need - cap) / rate end
end
if ran then
  return {admitted, math.max(0, fits()), ms(level / rate), ms(retry), 0, ran}
end
return {admitted, math.max(0, fits()), ms(level / rate), ms(retry), 0}
