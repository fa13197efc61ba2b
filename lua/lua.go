// Package lua embeds the limiter's Redis scripts, one per algorithm. Each
// script is the shared prelude (argument parsing, TIME, helpers), the member
// helpers for the algorithms that keep one ZSET member per unit, and the
// algorithm's body; the limiter loads them with SCRIPT LOAD and runs them
// with EVALSHA.
package lua

import (
	"embed"
	"fmt"
	"regexp"
	"strings"
)

//go:embed *.lua
var files embed.FS

// Names of the embedded algorithm scripts.
const (
	SlidingLog    = "sliding_log"
	SlidingWindow = "sliding_window"
	GCRA          = "gcra"
	FixedWindow   = "fixed_window"
	Concurrency   = "concurrency"
	LeakyBucket   = "leaky_bucket"
	// Behaviour is the behaviour layer's script (no prelude: not a limiter
	// algorithm); read it with Plain.
	Behaviour = "behaviour"
)

// Source returns the complete script for an algorithm: the clock, the
// reading of the server's identity (in a tallied window's script only, and
// defined only for a call that is tallied: tally.lua is its one reader
// there, so an untallied call, the steady state, makes no closure for it),
// the prelude and the algorithm's body.
func Source(name string) (string, error) {
	body, err := algorithm(name)
	if err != nil {
		return "", err
	}
	if tallied(name) {
		return clock + "local ident_now, identity\nif ARGV[8] == '1' then\n  identity = " + identityFunc + "end\n" + body, nil
	}
	return clock + body, nil
}

// tallied says whether an algorithm's script tallies its takes after a sign
// of a master change (tally.lua; limit.Spec.Tallied says the same of the
// algorithms): the windows and the buckets.
func tallied(name string) bool {
	return name == FixedWindow || name == SlidingWindow || name == GCRA || name == LeakyBucket
}

// clock reads Redis's clock (prelude.lua calls it when ARGV[2] is 0).
const clock = `local function server_now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000000 + tonumber(t[2])
end
`

// identityFunc reads, once per script run, the identity of the server
// running it (as Identity does from INFO): "run_id:master_replid", or false
// when INFO fails or lacks either field; it keeps the reading in ident_now.
// A batch shares the one reading among its calls and its restores.
const identityFunc = `function()
  if ident_now == nil then
    ident_now = false
    local s, r = redis.pcall('INFO', 'server'), redis.pcall('INFO', 'replication')
    if type(s) == 'string' and type(r) == 'string' then
      local id, rid = string.match(s, 'run_id:(%x+)'), string.match(r, 'master_replid:(%x+)')
      if id and rid then ident_now = id .. ':' .. rid end
    end
  end
  return ident_now
end
`

// algorithm is an algorithm's prelude and body, without the clock.
func algorithm(name string) (string, error) {
	prelude, err := files.ReadFile("prelude.lua")
	if err != nil {
		return "", fmt.Errorf("reading prelude: %w", err)
	}
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %q: %w", name, err)
	}
	src := string(prelude) + "\n"
	if name == SlidingLog || name == Concurrency { // one member per unit
		members, err := files.ReadFile("members.lua")
		if err != nil {
			return "", fmt.Errorf("reading members helpers: %w", err)
		}
		src += string(members) + "\n"
	}
	if tallied(name) { // tallied after a master change
		tally, err := files.ReadFile("tally.lua")
		if err != nil {
			return "", fmt.Errorf("reading tally helper: %w", err)
		}
		src += string(tally) + "\n"
	}
	return src + string(body), nil
}

// Alg describes an algorithm to Batch: its code in the batch's ARGV, its
// script's name, and how many keys and arguments one call of it takes.
type Alg struct {
	Code       int
	Name       string
	Keys, Args int
}

var (
	argvRef = regexp.MustCompile(`\bARGV\[(\d+)\]`)
	keysRef = regexp.MustCompile(`\bKEYS\[(\d+)\]`)
)

// Batch returns the script that runs many decisions in one call. Every
// algorithm's script runs unchanged as a function, its KEYS and ARGV read
// from its place in the batch's ARGV, one call after another, on one reading
// of Redis's clock. The keys travel in ARGV, so they may sit in any slot of
// the node (allow-cross-slot-keys): the caller groups calls by the master
// that serves them.
//
// ARGV: 1 the number of calls; then per call: its algorithm's code, its
// keys, its arguments (as many as the Alg says). The reply has one element
// per call: what the algorithm's script returns, or an error.
//
// A negative code is a restore of that algorithm: its take's cost is the
// most it may take and its need the remaining the store reported when last
// seen, at the take's time; the call first reads the remaining (a take of
// nothing) and takes only what is missing since, so a store that kept its
// state takes nothing, and one that lost it counts again what it had (as
// often as it is restored: a second restore finds nothing missing). A
// restore carries one argument more, after its algorithm's: the identity of
// the server that gave the answer it restores (its run_id and
// master_replid, as Identity reads them; "" unknown). A server that has that
// identity still is the one that answered, and has been its master since
// (neither id ever comes back once changed): it kept its state, and the
// restore takes nothing, whatever the count says. That count may have fallen
// since by what was given back, which is not missing. A server with
// another identity takes, on top of what is missing, what calls made after
// a sign of the change admitted on it in the answer's window (their tally,
// tally.lua: windows and buckets): a restore raises the count to the answer plus what
// was admitted here since, so an edge that reached the new master first
// does not have its admissions absorbed by a later edge's restore. A call whose
// keys the node does not serve (a slot moving) fails with "non local key"
// at its first redis.call, before it writes.
func Batch(algs []Alg) (string, error) {
	var b strings.Builder
	b.WriteString("#!lua flags=allow-cross-slot-keys\n")
	b.WriteString(batchClock)
	b.WriteString("local ident_now\nlocal identity = " + identityFunc)
	for _, a := range algs {
		body, err := algorithm(a.Name)
		if err != nil {
			return "", err
		}
		body = argvRef.ReplaceAllString(body, "ARGV[ab + $1]")
		body = keysRef.ReplaceAllString(body, "ARGV[kb + $1]")
		fmt.Fprintf(&b, "run[%d] = function(kb, ab)\n%s\nend\nwidth[%d] = {%d, %d}\n", a.Code, body, a.Code, a.Keys, a.Keys+a.Args)
	}
	b.WriteString(batchLoop)
	return b.String(), nil
}

// batchClock reads Redis's clock once per batch.
const batchClock = `local now_once
local function server_now()
  if not now_once then
    local t = redis.call('TIME')
    now_once = tonumber(t[1]) * 1000000 + tonumber(t[2])
  end
  return now_once
end
local run, width = {}, {}
`

const batchLoop = `local out = {}
local p = 2
for i = 1, tonumber(ARGV[1]) do
  local code = tonumber(ARGV[p])
  local restore = code < 0
  if restore then code = -code end
  local f, w = run[code], width[code]
  if not f then
    return redis.error_reply('ERR edgeguard: unknown algorithm in batch')
  end
  local ab = p + w[1]
  local ok, r
  if restore then
    local most, seen = tonumber(ARGV[ab + 6]), tonumber(ARGV[ab + 7])
    local answered_by = ARGV[p + 1 + w[2]]
    ARGV[ab + 6], ARGV[ab + 7] = '0', '1'
    ok, r = pcall(f, p, ab)
    if ok and type(r) == 'table' and not r.err then
      local missing = r[2] - seen
      local here = identity()
      if here and answered_by ~= '' and answered_by ~= here then
        -- Another server gave the answer: what was admitted here
        -- since the change (tallied by the calls made after it, per
        -- window: tally.lua) comes on top of it.
        missing = missing + (tonumber(redis.call('HGET', ARGV[p + 1] .. ':post:' .. here, r[5])) or 0)
      end
      missing = math.min(most, missing)
      if missing > 0 and (answered_by == '' or answered_by ~= here) then
        ARGV[ab + 6] = tostring(missing)
        ok, r = pcall(f, p, ab)
      end
    end
    p = p + 1
  else
    ok, r = pcall(f, p, ab)
  end
  p = p + 1 + w[2]
  if ok or (type(r) == 'table' and r.err) then
    out[i] = r
  else
    out[i] = redis.error_reply(tostring(r))
  end
end
return out
`

// Plain returns a script without the prelude.
func Plain(name string) (string, error) {
	body, err := files.ReadFile(name + ".lua")
	if err != nil {
		return "", fmt.Errorf("reading script %q: %w", name, err)
	}
	return string(body), nil
}

// Identity is a Redis server's identity as the batch script reads it (a
// restore's last argument): its run_id and master_replid from the server and
// replication sections of INFO; "" when either is missing.
func Identity(server, replication string) string {
	id, rid := infoField(server, "run_id"), infoField(replication, "master_replid")
	if id == "" || rid == "" {
		return ""
	}
	return id + ":" + rid
}

// infoField is a field's value in an INFO section ("" absent).
func infoField(info, name string) string {
	for line := range strings.Lines(info) {
		if v, ok := strings.CutPrefix(strings.TrimRight(line, "\r\n"), name+":"); ok {
			return v
		}
	}
	return ""
}
