package peerbench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// runH2load runs h2load (nghttp2's HTTP/2 load generator) with clients
// connections of streams concurrent streams each against url for d, and
// reads its report as a wrkResult (no percentile: h2load prints none). A
// run that did not speak h2 (the proxy's ALPN offered only http/1.1) is an
// error.
func runH2load(ctx context.Context, bin, url string, clients, streams int, d time.Duration) (wrkResult, error) {
	secs := max(1, int(d.Round(time.Second)/time.Second))
	// One thread (h2load's default): the load generator takes one of the
	// machine's cores at most.
	return runReport(ctx, "h2load", url, parseH2load, bin, "-t1", "-c"+strconv.Itoa(clients), "-m"+strconv.Itoa(streams), "-D", strconv.Itoa(secs), url)
}

// parseH2load reads h2load's report: the requests/s (its "finished in"
// line), the requests done, the failed, errored and timed-out ones (as
// socket errors), the 4xx and 5xx answers (as non-2xx/3xx), and the
// application protocol, which must be h2. A report without one of them
// is an error.
func parseH2load(out string) (wrkResult, error) {
	var r wrkResult
	var haveRate, haveCount, haveStatus bool
	proto := ""
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		switch {
		case strings.HasPrefix(line, "finished in "):
			// finished in 1.00s, 10123.00 req/s, 395.44KB/s
			f := strings.Split(strings.TrimPrefix(line, "finished in "), ", ")
			if len(f) < 2 || !strings.HasSuffix(f[1], " req/s") {
				return r, fmt.Errorf("finish line %q", line)
			}
			d, err := parseWrkDuration(f[0])
			if err != nil {
				return r, err
			}
			v, err := strconv.ParseFloat(strings.TrimSuffix(f[1], " req/s"), 64)
			if err != nil || v < 0 {
				return r, fmt.Errorf("requests/s %q", f[1])
			}
			r.Seconds, r.PerSecond, haveRate = d.Seconds(), v, true
		case strings.HasPrefix(line, "requests: "):
			// requests: 10123 total, 10283 started, 10123 done, 10123 succeeded, 0 failed, 0 errored, 0 timeout
			n, err := h2loadCounts(strings.TrimPrefix(line, "requests: "))
			if err != nil {
				return r, fmt.Errorf("requests line %q: %w", line, err)
			}
			done, ok := n["done"]
			if !ok {
				return r, fmt.Errorf("requests line %q: no done count", line)
			}
			r.Requests = done
			r.SocketErrors = n["failed"] + n["timeout"] // failed counts the errored ones
			haveCount = true
		case strings.HasPrefix(line, "status codes: "):
			// status codes: 10123 2xx, 0 3xx, 0 4xx, 0 5xx
			n, err := h2loadCounts(strings.TrimPrefix(line, "status codes: "))
			if err != nil {
				return r, fmt.Errorf("status line %q: %w", line, err)
			}
			r.Non2xx = n["4xx"] + n["5xx"]
			haveStatus = true
		case strings.HasPrefix(line, "Application protocol:"):
			proto = strings.TrimSpace(strings.TrimPrefix(line, "Application protocol:"))
		}
	}
	var missing []string
	if !haveRate {
		missing = append(missing, `"finished in"`)
	}
	if !haveCount {
		missing = append(missing, `"requests:"`)
	}
	if !haveStatus {
		missing = append(missing, `"status codes:"`)
	}
	if len(missing) > 0 {
		return r, errors.New("no " + strings.Join(missing, ", ") + " in h2load's report")
	}
	if proto != "h2" {
		return r, fmt.Errorf("application protocol %q, want h2", proto)
	}
	return r, nil
}

// h2loadCounts reads "N what, N what, ..." into a map by what.
func h2loadCounts(s string) (map[string]int64, error) {
	m := map[string]int64{}
	for _, part := range strings.Split(s, ",") {
		f := strings.Fields(part)
		if len(f) != 2 {
			return nil, fmt.Errorf("count %q", part)
		}
		n, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil || n < 0 {
			return nil, fmt.Errorf("count %q", part)
		}
		m[f[1]] = n
	}
	return m, nil
}
