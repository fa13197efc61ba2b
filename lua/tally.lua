-- Tallied takes (fixed_window.lua, sliding_window.lua, gcra.lua,
-- leaky_bucket.lua). ARGV[8] '1': the caller saw a sign that the master
-- serving the key may have changed in the last minute (a window's take: in
-- this window), or has not read who serves it yet.
-- What the call admits (or gives back) is then also tallied for the server
-- it runs on, as it is now: a hash beside the count,
-- base..':post:'..run_id..':'..master_replid, one field per window start w
-- (a bucket's is 0: its level has no window), which lives for ends ms more
-- (while that window's count decides; a bucket's answer, a window). A
-- restore on this server of an answer another server gave adds the
-- window's tally (lua.Batch): the units admitted here since the change,
-- which that answer cannot hold, so they are not absorbed by it. tally
-- returns who ran the call (nil when INFO fails), and
-- such a take answers it as a sixth value, so the edge knows which server
-- its answer came from. Only such calls read INFO, once per script run
-- (identity(), lua.go). tally is defined only for a tallied call: an
-- untallied one (the steady state) makes no closure and no call for it,
-- and each call site reads `tally and tally(...)`.
local tally
if ARGV[8] == '1' then
  tally = function(base, w, units, ends)
    local here = identity()
    if not here then return end
    if units == 0 then return here end
    local pk = base .. ':post:' .. here
    if redis.call('HINCRBY', pk, w, units) <= 0 then
      redis.call('HDEL', pk, w)
    end
    ends = math.max(1, ends)
    if redis.call('PTTL', pk) < ends then
      redis.call('PEXPIRE', pk, ends)
    end
    return here
  end
end
