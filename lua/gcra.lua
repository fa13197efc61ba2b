-- GCRA (token bucket as one number): KEYS[1] holds the theoretical arrival
-- time (TAT, µs). Rate limit/window, capacity burst (extra) or limit.
local key = KEYS[1]
local T = window / limit
local cap = limit
if extra > 0 then cap = extra end
local tau = cap * T
local tat = tonumber(redis.call('GET', key))
-- A take made after a sign of a master change is tallied (tally.lua): one
-- count per server (field 0: a bucket has no window), kept a window past
-- its last tallied take; a refund takes off what it gives back.
if mode == 'refund' then
  if tat then
    local before = tally and math.max(tat, now)
    tat = tat - cost * T
    if tat > now then
      redis.call('SET', key, tat, 'PX', math.max(1, ms(tat - now)))
    else
      redis.call('DEL', key)
    end
    if tally then
      -- What fits now, before and after: the units given back.
      local function fits(t) return math.max(0, math.floor((tau - (t - now)) / T + 1e-9)) end
      tally(key, 0, fits(before) - fits(math.max(tat, now)), math.ceil(window / 1000))
    end
  end
  return 0
end
local need = aux
if not tat or tat < now then tat = now end
-- 1e-9 absorbs float error in (tau - lead) / T, which is exact in real numbers.
local admitted = math.max(0, math.min(cost, math.floor((tau - (tat - now)) / T + 1e-9)))
admitted = whole(admitted, need)
if admitted > 0 then
  tat = tat + admitted * T
  redis.call('SET', key, tat, 'PX', math.max(1, ms(tat - now)))
end
local ran = tally and tally(key, 0, admitted, math.ceil(window / 1000))
local retry = 0
if admitted < cost then
  if need > cap then retry = tat - now else retry = tat + need * T - tau - now end
end
local left = math.max(0, math.floor((tau - (tat - now)) / T + 1e-9))
if ran then
  return {admitted, left, ms(tat - now), ms(retry), 0, ran}
end
return {admitted, left, ms(tat - now), ms(retry), 0}
