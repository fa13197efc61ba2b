-- edgeguard behaviour layer: one client's signals and risk level, region-wide.
-- The model is package behaviour's State (pkg/behaviour/state.go); the two
-- must agree step for step (TestScriptMatchesModel).
--
-- KEYS: 1 the state hash, 2 and 3 the route sketches (HyperLogLog) of the
--       even and odd horizon halves; all three share the client's hash tag.
-- ARGV: 1 now in ms (0 = Redis server TIME), 2 horizon ms, 3 burst window ms,
--       4 cool-down ms, 5 replay gap ms, 6 requests, 7 requests to judge
--       against the stored retry time, 8 requests already judged early,
--       9 retry ms of a 429 given now (0: none), 10 q (0: keep the stored),
--       11 fingerprint ("" none), 12-15 weights (burst, replay, scan, denial),
--       16-23 free and span of burst, replay, scan, denial,
--       24-26 thresholds in thousandths (elevated, suspicious, blocked),
--       27-29 the same × hysteresis, 30.. route hashes.
-- Returns {level, score in thousandths, hold left ms, burst ratio in
-- thousandths, replay run, distinct routes, early requests}.
local now = tonumber(ARGV[1])
local horizon, burstw, cooldown, gap = tonumber(ARGV[2]), tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local n, judge, early, retry, q = tonumber(ARGV[6]), tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), tonumber(ARGV[10])
local fp = ARGV[11]
if not (now and horizon and burstw and cooldown and gap and n and judge and early and retry and q and fp) or horizon <= 0 or burstw <= 0 then
  return redis.error_reply('ERR edgeguard: bad behaviour arguments')
end
if now == 0 then
  local t = redis.call('TIME')
  now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function num(i) return tonumber(ARGV[i]) end
local maxscan = 64 -- behaviour.maxScan

local k = KEYS[1]
local s = redis.call('HMGET', k, 'h', 'ec', 'ep', 'b', 'bc', 'bp', 'fp', 'ft', 'rr', 'ru', 'lv', 'ls', 'q')
local half = tonumber(s[1]) or -1
local ecur, eprev = tonumber(s[2]) or 0, tonumber(s[3]) or 0
local bhalf = tonumber(s[4]) or -1
local bcur, bprev = tonumber(s[5]) or 0, tonumber(s[6]) or 0
local lfp, ft, run = s[7] or '', tonumber(s[8]) or 0, tonumber(s[9]) or 0
local ru, lv, ls, lq = tonumber(s[10]) or 0, tonumber(s[11]) or 0, tonumber(s[12]) or 0, tonumber(s[13]) or 0

-- The horizon in two halves: a signal counts the current and the previous.
local h = math.floor(now / math.max(math.floor(horizon / 2), 1))
local cur, prev = KEYS[2 + h % 2], KEYS[2 + (h + 1) % 2]
if h > half then
  if h == half + 1 then
    eprev = ecur
    redis.call('DEL', cur) -- two halves old
  else
    eprev = 0
    redis.call('DEL', cur, prev)
  end
  ecur, half = 0, h
end
local b = math.floor(now / math.max(math.floor(burstw / 2), 1))
if b > bhalf then
  if b == bhalf + 1 then bprev = bcur else bprev = 0 end
  bcur, bhalf = 0, b
end

if judge > 0 and now < ru then ecur = ecur + judge end
ecur = ecur + early
if retry > 0 then ru = math.max(ru, now + retry) end
bcur = bcur + n
if #ARGV >= 30 and redis.call('PFCOUNT', cur) < maxscan then
  redis.call('PFADD', cur, unpack(ARGV, 30))
end
if fp ~= '' then
  if fp == lfp and now - ft <= gap then run = run + 1 else run = 0 end
  lfp, ft = fp, now
end
if q > 0 then lq = q end

-- Signals, score, level (Params.Signals, Score, Step).
local burst = 0
if lq > 0 then burst = (bprev + bcur) / lq end
local replay = 0
if lfp ~= '' and now - ft <= gap then replay = run end
local scan = redis.call('PFCOUNT', cur, prev)
local denial = eprev + ecur
local function over(raw, free, span) return math.max(0, raw - free) / span end
local f = num(12) * over(burst, num(16), num(17)) + num(13) * over(replay, num(18), num(19))
  + num(14) * over(scan, num(20), num(21)) + num(15) * over(denial, num(22), num(23))
local score = math.floor(f * 1000 + 0.5)
local up, down = 0, 0
for l = 1, 3 do
  if score >= num(23 + l) then up = l end
  if score >= num(26 + l) then down = l end
end
if up > lv then
  lv, ls = up, now
elseif down >= lv then
  ls = now
elseif now - ls >= cooldown then
  lv, ls = down, now
end
local hold = 0
if lv > 0 then hold = math.max(0, ls + cooldown - now) end

redis.call('HSET', k, 'h', half, 'ec', ecur, 'ep', eprev, 'b', bhalf, 'bc', bcur, 'bp', bprev,
  'fp', lfp, 'ft', ft, 'rr', run, 'ru', ru, 'lv', lv, 'ls', ls, 'q', lq)
-- Everything expires once nothing in it can matter: the signals after the
-- horizon, a level after its cool-down, a retry time when it passes.
local ttl = horizon + math.max(horizon, cooldown, ru - now)
redis.call('PEXPIRE', k, ttl)
redis.call('PEXPIRE', cur, ttl)
redis.call('PEXPIRE', prev, ttl)
return {lv, score, hold, math.floor(burst * 1000), replay, scan, denial}
