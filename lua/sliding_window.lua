-- Sliding window counter (Cloudflare): KEYS[1] "{k}:cur" is a hash {w = window
-- start ms, n = count}, KEYS[2] "{k}:prev" the previous window's count. The
-- estimate prev·(W−elapsed)/W + cur is computed in integer ms so Lua doubles
-- stay exact (the limiter keeps limit·W below 2^53). A take made after a
-- sign of a master change is tallied (tally.lua) in the window it counts
-- in, for as long as that window's count decides: its own and the next.
local cur, prev = KEYS[1], KEYS[2]
local W = math.floor(window / 1000)
local nowms = math.floor(now / 1000)
local ws = nowms - math.fmod(nowms, W)
local h = redis.call('HMGET', cur, 'w', 'n')
local cw = tonumber(h[1])
local cn = tonumber(h[2]) or 0
local stored = tonumber(redis.call('GET', prev))
local pn = stored or 0
if mode == 'refund' then
  if cw == aux then
    redis.call('HSET', cur, 'n', math.max(0, cn - cost))
    if tally then tally(cur, aux, -math.min(cn, cost), aux + 2 * W - nowms) end
  elseif cw == aux + W and pn > 0 then
    redis.call('SET', prev, math.max(0, pn - cost), 'KEEPTTL')
    if tally then tally(cur, aux, -math.min(pn, cost), aux + 2 * W - nowms) end
  end
  return 0
end
local need = aux
if dated and cw and cw > ws then
  -- A dated call for a window before the stored one (a restore, or a
  -- replay of units admitted then) counts in its own window, as of then:
  -- the window just before the stored one is its previous count, which
  -- still weighs on it; an older one weighs on nothing any more. Counted in
  -- the stored window instead, a restore read that window's count as its
  -- own and took too little.
  local n = 0
  if cw == ws + W then n = pn end
  local admitted = whole(math.max(0, math.min(cost, limit - n)), need)
  local counted = 0
  if admitted > 0 and cw == ws + W then
    if stored then
      redis.call('SET', prev, n + admitted, 'KEEPTTL')
    else
      redis.call('SET', prev, n + admitted, 'PX', ws + 2 * W - nowms)
    end
    counted = admitted
  end
  local ran = tally and tally(cur, ws, counted, ws + 2 * W - nowms)
  local reset = ws + 2 * W - nowms
  local retry = 0
  if admitted < cost then retry = reset end
  if ran then
    return {admitted, math.max(0, limit - n - admitted), reset, retry, ws, ran}
  end
  return {admitted, math.max(0, limit - n - admitted), reset, retry, ws}
end
if cw == nil then
  cn, pn = 0, 0
elseif cw > ws then
  ws = cw -- clock behind the stored window: keep counting in it
elseif cw < ws then
  if cw == ws - W then pn = cn else pn = 0 end
  cn = 0
end
local e = math.max(0, nowms - ws)
local function fits(c) -- units that fit now on top of c
  local num = limit * W - pn * (W - e)
  if num < 0 then return -c end
  return math.floor(num / W) - c
end
local admitted = math.max(0, math.min(cost, fits(cn)))
admitted = whole(admitted, need)
if admitted > 0 then
  cn = cn + admitted
  if cw == ws then
    -- The window's first admission set both TTLs and the previous count;
    -- every later one would set the same.
    redis.call('HSET', cur, 'n', cn)
  else
    redis.call('HSET', cur, 'w', ws, 'n', cn)
    redis.call('PEXPIRE', cur, ws + 2 * W - nowms)
    if pn > 0 then
      redis.call('SET', prev, pn, 'PX', ws + W - nowms)
    elseif stored then
      redis.call('DEL', prev)
    end
  end
end
local reset = 0
if cn > 0 then reset = ws + 2 * W - nowms elseif pn > 0 then reset = ws + W - nowms end
local retry = 0
if admitted < cost then
  local room = limit - cn - need
  if need > limit then
    retry = reset
  elseif room >= 0 and pn > 0 and (W - e) - math.floor(room * W / pn) < W - e then
    retry = math.max(0, (W - e) - math.floor(room * W / pn))
  elseif room >= 0 and pn == 0 then
    retry = 0
  elseif cn == 0 then
    retry = W - e
  else
    retry = (W - e) + math.max(0, W - math.floor((limit - need) * W / cn))
  end
end
local ran = tally and tally(cur, ws, admitted, ws + 2 * W - nowms)
if ran then
  return {admitted, math.max(0, fits(cn)), reset, retry, ws, ran}
end
return {admitted, math.max(0, fits(cn)), reset, retry, ws}
