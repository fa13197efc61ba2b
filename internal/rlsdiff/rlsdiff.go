// Package rlsdiff holds the edge's rate limit service (`edge rls`) to
// envoyproxy/ratelimit, answer by answer. Both services serve the
// reference's own configuration files unchanged, each on its own
// redis-server, started with the reference's environment variables as a
// container would set them; the calls built from each configuration's
// descriptors (Cases) go to both over gRPC in lockstep, and every field
// of the two answers is compared (Compare). A difference that is not one
// of the Documented ones, each named in docs/envoy.md with its reason,
// fails the run. cmd/rlsdiff is its command line (make
// rls-differential).
package rlsdiff

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	rlv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	pb "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Options of one run.
type Options struct {
	Reference, Edge Command
	Sets            []Set
	RedisServer     string // the redis-server binary
	Out             io.Writer
	// Verbose prints every differing case, documented ones too.
	Verbose bool
}

// Summary counts a run's cases.
type Summary struct {
	Sets, Cases, Same, Documented, Undocumented int
	// ByDocumented counts the cases each documented difference explained.
	ByDocumented map[string]int
}

// Run serves every set to both services in turn and compares their
// answers. It fails only on trouble (a redis-server or a process that
// cannot start); differences are in the Summary.
func Run(ctx context.Context, o Options) (Summary, error) {
	sum := Summary{ByDocumented: map[string]int{}}
	if o.RedisServer == "" {
		o.RedisServer = "redis-server"
	}
	ra, err := startRedis(ctx, o.RedisServer)
	if err != nil {
		return sum, err
	}
	defer ra.close()
	rb, err := startRedis(ctx, o.RedisServer)
	if err != nil {
		return sum, err
	}
	defer rb.close()
	tmp, err := os.MkdirTemp("", "rlsdiff")
	if err != nil {
		return sum, err
	}
	defer os.RemoveAll(tmp)
	for i, s := range o.Sets {
		root, err := writeRuntime(filepath.Join(tmp, fmt.Sprint(i)), s)
		if err != nil {
			return sum, fmt.Errorf("set %s: %w", s.Name, err)
		}
		if err := runSet(ctx, o, s, root, ra, rb, &sum); err != nil {
			return sum, fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	fmt.Fprintf(o.Out, "\n%d sets, %d cases: %d answered alike, %d differ as documented, %d differ undocumented\n",
		sum.Sets, sum.Cases, sum.Same, sum.Documented, sum.Undocumented)
	for _, d := range Documented {
		if n := sum.ByDocumented[d.ID]; n > 0 {
			fmt.Fprintf(o.Out, "  %-28s %4d  %s\n", d.ID, n, d.Reason)
		}
	}
	return sum, nil
}

func runSet(ctx context.Context, o Options, s Set, root string, ra, rb *redisServer, sum *Summary) error {
	for _, r := range []*redisServer{ra, rb} {
		if err := r.client.FlushAll(ctx).Err(); err != nil {
			return fmt.Errorf("emptying redis %s: %w", r.addr, err)
		}
	}
	sum.Sets++
	a, err := startInstance(ctx, o.Reference, root, ra, s.Env)
	if err != nil {
		return err
	}
	defer a.stop()
	b, err := startInstance(ctx, o.Edge, root, rb, s.Env)
	if err != nil {
		return err
	}
	defer b.stop()
	// A service that started without a configuration answers that it has
	// none (the reference: "no rate limit configuration loaded", the edge:
	// UNAVAILABLE); that is refusing the set too.
	for _, in := range []*instance{a, b} {
		if !in.Refused {
			ans := call(ctx, in, &Case{Req: probe()})
			if ans.Code() == codes.Unavailable || strings.Contains(status.Convert(ans.Err).Message(), "no rate limit configuration") {
				in.Refused = true
			}
		}
	}
	verdict := func(in *instance) string {
		if in.Refused {
			return "refused"
		}
		return "accepted"
	}
	fmt.Fprintf(o.Out, "set %s: %s %s, %s %s", s.Name, o.Reference.Name, verdict(a), o.Edge.Name, verdict(b))
	if a.Refused != b.Refused {
		sum.Cases++
		c := &Case{Name: "accepts"}
		if d := documented(s, c, Answer{}, Answer{}, Diff{Field: "accepts"}, nil); d != "" {
			sum.Documented++
			sum.ByDocumented[d]++
			fmt.Fprintf(o.Out, " (documented: %s)\n", d)
		} else {
			sum.Undocumented++
			fmt.Fprintf(o.Out, " UNDOCUMENTED\n  %s log: %s\n  %s log: %s\n", o.Reference.Name, tail(a.out.String()), o.Edge.Name, tail(b.out.String()))
		}
		return nil
	}
	fmt.Fprintln(o.Out)
	if a.Refused {
		return nil
	}
	cases := Cases(s.Files)
	var same, doc, undoc int
	var h History
	var last *Case
	var lastAns Answer
	for i := range cases {
		c := &cases[i]
		earlyInWindow(c.Window)
		var x, y Answer
		var wg sync.WaitGroup
		wg.Add(2)
		go func() { defer wg.Done(); x = call(ctx, a, c) }()
		go func() { defer wg.Done(); y = call(ctx, b, c) }()
		wg.Wait()
		sum.Cases++
		ds := Compare(x, y)
		// The history the case is judged by ends before it.
		if last != nil {
			h.saw(last, lastAns)
		}
		last, lastAns = c, x
		if len(ds) == 0 {
			same++
			continue
		}
		var ids, undocumented []string
		for _, d := range ds {
			if id := documented(s, c, x, y, d, &h); id != "" {
				ids = append(ids, id)
			} else {
				undocumented = append(undocumented, d.String())
			}
		}
		if len(undocumented) == 0 {
			doc++
			for _, id := range dedup(ids) {
				sum.ByDocumented[id]++
			}
			if !o.Verbose {
				continue
			}
		} else {
			undoc++
		}
		fmt.Fprintf(o.Out, "  case %s: %s\n    request: %s\n    %-9s %s\n    %-9s %s\n", c.Name, diffList(ds), describe(c), o.Reference.Name+":", x, o.Edge.Name+":", y)
		if len(undocumented) > 0 {
			fmt.Fprintf(o.Out, "    UNDOCUMENTED: %s\n", strings.Join(undocumented, ", "))
		} else {
			fmt.Fprintf(o.Out, "    documented: %s\n", strings.Join(dedup(ids), ", "))
		}
	}
	sum.Same += same
	sum.Documented += doc
	sum.Undocumented += undoc
	fmt.Fprintf(o.Out, "  %d cases: %d alike, %d documented, %d undocumented\n", len(cases), same, doc, undoc)
	return nil
}

// earlyInWindow returns once both answers to a call counted in windows of
// w (Case.Window) will come from the same window: early enough in it, or
// after it ends. Most of a second, or all but its last second of a
// minute: two services asked at once answer well within either on a busy
// host, and waiting costs at most that much per window.
func earlyInWindow(w time.Duration) {
	if w <= 0 {
		return
	}
	need := time.Second
	if w <= time.Second {
		need = 400 * time.Millisecond
	}
	now := time.Now()
	if end := now.Truncate(w).Add(w); end.Sub(now) < need {
		time.Sleep(end.Sub(now) + 5*time.Millisecond)
	}
}

func probe() *pb.RateLimitRequest {
	return &pb.RateLimitRequest{Domain: "zz-probe", Descriptors: []*rlv3.RateLimitDescriptor{{Entries: []*rlv3.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}}}}}
}

func call(ctx context.Context, in *instance, c *Case) Answer {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := in.client.ShouldRateLimit(ctx, c.Req)
	return Answer{Resp: resp, Err: err}
}

func describe(c *Case) string {
	var b strings.Builder
	fmt.Fprintf(&b, "domain %q hits_addend %d", c.Req.GetDomain(), c.Req.GetHitsAddend())
	for _, d := range c.Req.GetDescriptors() {
		var es []string
		for _, e := range d.GetEntries() {
			es = append(es, e.GetKey()+"="+e.GetValue())
		}
		fmt.Fprintf(&b, " {%s}", strings.Join(es, ","))
		if d.GetHitsAddend() != nil {
			fmt.Fprintf(&b, "+own hits_addend %d", d.GetHitsAddend().GetValue())
		}
	}
	return b.String()
}

func diffList(ds []Diff) string {
	s := make([]string, len(ds))
	for i, d := range ds {
		s[i] = d.String()
	}
	return strings.Join(s, ", ")
}

func dedup(s []string) []string {
	var out []string
	seen := map[string]bool{}
	for _, x := range s {
		if !seen[x] {
			seen[x] = true
			out = append(out, x)
		}
	}
	return out
}

// tail is the end of a process's output, on one line.
func tail(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 600 {
		s = "..." + s[len(s)-600:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
