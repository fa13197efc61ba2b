-- Sliding log: KEYS[1] is a ZSET of admitted units, member "<id>:<i>", score = µs.
-- Exact: at most `limit` units in any window; with min_interval (extra) a call
-- is refused until min_interval has passed since the last admitted unit, and
-- admits at most `need` units (one request's worth).
local key = KEYS[1]
if mode == 'refund' then
  zrem_units(key, cost)
  return 0
end
local need = aux
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - window)
local n = redis.call('ZCARD', key)
local admitted = math.max(0, math.min(cost, limit - n))
local last = nil
if extra > 0 and n > 0 then
  last = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
end
if extra > 0 and admitted > 0 then
  if last and now - last < extra then admitted = 0 else admitted = math.min(admitted, need) end
end
admitted = whole(admitted, need)
if admitted > 0 then
  zadd_units(key, now, admitted)
  redis.call('PEXPIRE', key, ms(window))
  n = n + admitted
  last = now
end
local reset = 0
if n > 0 then
  local newest = tonumber(redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')[2])
  if newest then reset = newest + window - now end
end
local retry = 0
if admitted < cost then
  if need > limit then
    retry = reset
  elseif n + need > limit then
    local s = tonumber(redis.call('ZRANGE', key, n + need - limit - 1, n + need - limit - 1, 'WITHSCORES')[2])
    if s then retry = s + window - now end
  end
  if extra > 0 and last then retry = math.max(retry, last + extra - now) end
end
return {admitted, math.max(0, limit - n), ms(reset), ms(retry), 0}
