package peerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// wrkResult is what one wrk run reports.
type wrkResult struct {
	Requests     int64
	Seconds      float64 // the run's length as wrk measured it
	PerSecond    float64
	P99          time.Duration
	SocketErrors int64 // connect, read, write and timeout errors together
	Non2xx       int64 // responses neither 2xx nor 3xx
}

// runWrk runs wrk with threads and conns against url for d and parses its
// report.
func runWrk(ctx context.Context, bin, url string, threads, conns int, d time.Duration) (wrkResult, error) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	return runReport(ctx, "wrk", url, parseWrk, bin, "-t"+strconv.Itoa(threads), "-c"+strconv.Itoa(conns),
		"-d"+strconv.Itoa(secs)+"s", "--latency", url)
}

// runReport runs a load generator's command line (bin first) and reads
// its report with parse; a failed run or an unreadable report is an error
// carrying the generator's output.
func runReport(ctx context.Context, name, url string, parse func(string) (wrkResult, error), bin string, args ...string) (wrkResult, error) {
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("%s %s: %w\n%s", name, url, err, out)
	}
	r, err := parse(string(out))
	if err != nil {
		return r, fmt.Errorf("%s %s: %w\n%s", name, url, err, out)
	}
	return r, nil
}

// parseWrk reads wrk's report (with --latency): the request count and
// time, requests/s, the 99th percentile, socket errors and non-2xx/3xx
// responses. A report without the count, the rate or the percentile is an
// error.
func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	var haveCount, haveRate, haveP99 bool
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		switch {
		case len(f) >= 4 && f[1] == "requests" && f[2] == "in":
			n, err := strconv.ParseInt(f[0], 10, 64)
			if err != nil {
				return r, fmt.Errorf("request count %q: %w", f[0], err)
			}
			d, err := parseWrkDuration(strings.TrimSuffix(f[3], ","))
			if err != nil {
				return r, err
			}
			r.Requests, r.Seconds, haveCount = n, d.Seconds(), true
		case len(f) == 2 && f[0] == "Requests/sec:":
			v, err := strconv.ParseFloat(f[1], 64)
			if err != nil {
				return r, fmt.Errorf("requests/s %q: %w", f[1], err)
			}
			r.PerSecond, haveRate = v, true
		case len(f) == 2 && f[0] == "99%":
			d, err := parseWrkDuration(f[1])
			if err != nil {
				return r, err
			}
			r.P99, haveP99 = d, true
		case len(f) >= 2 && f[0] == "Socket" && f[1] == "errors:":
			for _, kv := range strings.Split(strings.Join(f[2:], " "), ",") {
				kf := strings.Fields(kv)
				if len(kf) != 2 {
					return r, fmt.Errorf("socket errors %q", sc.Text())
				}
				n, err := strconv.ParseInt(kf[1], 10, 64)
				if err != nil {
					return r, fmt.Errorf("socket errors %q: %w", sc.Text(), err)
				}
				r.SocketErrors += n
			}
		case len(f) == 5 && strings.Join(f[:4], " ") == "Non-2xx or 3xx responses:":
			n, err := strconv.ParseInt(f[4], 10, 64)
			if err != nil {
				return r, fmt.Errorf("non-2xx count %q: %w", f[4], err)
			}
			r.Non2xx = n
		}
	}
	var missing []string
	if !haveCount {
		missing = append(missing, `"N requests in T"`)
	}
	if !haveRate {
		missing = append(missing, "Requests/sec")
	}
	if !haveP99 {
		missing = append(missing, "the 99% latency (was --latency given?)")
	}
	if len(missing) > 0 {
		return r, errors.New("no " + strings.Join(missing, ", ") + " in wrk's report")
	}
	return r, nil
}

// parseWrkDuration reads wrk's durations: 812.00us, 1.23ms, 10.00s, 1.02m.
func parseWrkDuration(s string) (time.Duration, error) {
	for _, u := range []struct {
		suffix string
		unit   time.Duration
	}{{"us", time.Microsecond}, {"ms", time.Millisecond}, {"s", time.Second}, {"m", time.Minute}, {"h", time.Hour}} {
		if v, ok := strings.CutSuffix(s, u.suffix); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 {
				return 0, fmt.Errorf("duration %q", s)
			}
			return time.Duration(f * float64(u.unit)), nil
		}
	}
	return 0, fmt.Errorf("duration %q: no unit", s)
}
