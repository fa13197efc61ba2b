-- Concurrency: KEYS[1] is a ZSET of in-flight units, member "<id>:<i>", score =
-- when the slot goes stale (µs). Stale slots (holder crashed or never released)
-- expire after the window, which must exceed the longest request.
local key = KEYS[1]
if mode == 'refund' then
  zrem_units(key, cost)
  return 0
end
local need = aux
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
local n = redis.call('ZCARD', key)
local admitted = math.max(0, math.min(cost, limit - n))
admitted = whole(admitted, need)
if admitted > 0 then
  zadd_units(key, now + window, admitted)
  redis.call('PEXPIRE', key, ms(window))
  n = n + admitted
end
local reset = 0
if n > 0 then
  reset = tonumber(redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')[2]) - now
end
-- A slot can free at any moment; suggest a retry within a second at most.
local retry = 0
if admitted < cost then retry = math.min(reset, 1000000) end
return {admitted, math.max(0, limit - n), ms(reset), ms(retry), 0}
