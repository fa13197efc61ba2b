-- GCRA (token bucket as one number): KEYS[1] holds the theoretical arrival
-- time (TAT, µs). Rate limit/window, capacity burst (extra) or limit.
local key = KEYS[1]
local T = window / limit
local cap = limit
if extra > 0 then cap = extra end
local tau = cap * T
local tat = tonumber(redis.call('GET', key))
if mode == 'refund' then
  if tat then
    tat = tat - cost * T
    if tat > now then
      redis.call('SET', key, tat, 'PX', math.max(1, ms(tat - now)))
    else
      redis.call('DEL', key)
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
local retry = 0
if admitted < cost then
  if need > cap then retry = tat - now else retry = tat + need * T - tau - now end
end
return {admitted, math.max(0, math.floor((tau - (tat - now)) / T + 1e-9)), ms(tat - now), ms(retry), 0}
