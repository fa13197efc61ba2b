package testenv

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/servers"
)

// ScrapeJob is one Prometheus scrape job over static targets.
type ScrapeJob struct {
	Name    string
	Targets []string          // host:port, scraped at /metrics
	Labels  map[string]string // attached to every series of the job's targets
	// TargetLabels adds labels to one target's series (by target), as
	// relabeling from service discovery does (an edge's region and pop).
	TargetLabels map[string]map[string]string
	// Uncompressed scrapes the targets without compression, through a
	// relay in this process per target (Prometheus 2.42 always asks for
	// gzip and cannot be told otherwise); the series keep the target's
	// address as their instance label. For targets in a race-instrumented
	// test process, where gzip costs several times the rest of a scrape
	// (an edge's /metrics, ~60 KB: ~100 ms of CPU to gzip, ~20 ms to
	// gather and encode), and a busy machine stretches that past the
	// scrape timeout.
	Uncompressed bool
}

// PrometheusOptions configures StartPrometheus.
type PrometheusOptions struct {
	// ScrapeInterval applies to every job (default 1s).
	ScrapeInterval time.Duration
	Jobs           []ScrapeJob
	// RuleFiles are loaded as recording/alerting rules, evaluated every
	// ScrapeInterval.
	RuleFiles []string
}

// Prometheus is a prometheus server on loopback with its TSDB in a temp
// dir.
type Prometheus struct {
	Addr string // "127.0.0.1:port"
	URL  string // "http://127.0.0.1:port"

	d      *deployment
	proc   *process
	relays []*scrapeRelay
}

// StartPrometheus starts a Prometheus server scraping opts.Jobs and returns
// once it is ready (/-/ready answers 200).
func StartPrometheus(opts PrometheusOptions) (*Prometheus, error) {
	bin, err := servers.Lookup("prometheus")
	if err != nil {
		return nil, err
	}
	if opts.ScrapeInterval <= 0 {
		opts.ScrapeInterval = time.Second
	}
	d, err := newDeployment("prometheus")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting prometheus: %w", err)
	}
	var relays []*scrapeRelay
	fail := func(err error) (*Prometheus, error) {
		for _, rl := range relays {
			rl.close()
		}
		_ = d.Close()
		return nil, err
	}
	// JSON is YAML: the config needs no YAML library.
	type staticConfig struct {
		Targets []string          `json:"targets"`
		Labels  map[string]string `json:"labels,omitempty"`
	}
	type scrapeConfig struct {
		JobName       string         `json:"job_name"`
		StaticConfigs []staticConfig `json:"static_configs"`
	}
	cfg := struct {
		Global struct {
			ScrapeInterval     string `json:"scrape_interval"`
			ScrapeTimeout      string `json:"scrape_timeout"`
			EvaluationInterval string `json:"evaluation_interval"`
		} `json:"global"`
		RuleFiles     []string       `json:"rule_files,omitempty"`
		ScrapeConfigs []scrapeConfig `json:"scrape_configs"`
	}{RuleFiles: opts.RuleFiles}
	cfg.Global.ScrapeInterval = opts.ScrapeInterval.String()
	cfg.Global.ScrapeTimeout = opts.ScrapeInterval.String()
	cfg.Global.EvaluationInterval = opts.ScrapeInterval.String()
	for _, j := range opts.Jobs {
		sc := scrapeConfig{JobName: j.Name}
		if len(j.TargetLabels) == 0 && !j.Uncompressed {
			sc.StaticConfigs = []staticConfig{{Targets: j.Targets, Labels: j.Labels}}
		}
		for _, target := range j.Targets {
			if len(j.TargetLabels) == 0 && !j.Uncompressed {
				break
			}
			labels := maps.Clone(j.Labels)
			if labels == nil {
				labels = map[string]string{}
			}
			maps.Copy(labels, j.TargetLabels[target])
			scraped := target
			if j.Uncompressed {
				rl, err := startScrapeRelay(target)
				if err != nil {
					return fail(fmt.Errorf("testenv: relay to %s: %w", target, err))
				}
				relays = append(relays, rl)
				scraped, labels["instance"] = rl.addr, target
			}
			sc.StaticConfigs = append(sc.StaticConfigs, staticConfig{Targets: []string{scraped}, Labels: labels})
		}
		cfg.ScrapeConfigs = append(cfg.ScrapeConfigs, sc)
	}
	data, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		return fail(fmt.Errorf("testenv: prometheus config: %w", err))
	}
	conf := filepath.Join(d.dir, "prometheus.yml")
	if err := os.WriteFile(conf, data, 0o600); err != nil {
		return fail(fmt.Errorf("testenv: writing %s: %w", conf, err))
	}

	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		p, err := startPrometheus(d, bin, conf)
		if err == nil {
			err = waitHTTPReady(ctx, p, "http://"+p.addr+"/-/ready")
			if err == nil {
				return &Prometheus{Addr: p.addr, URL: "http://" + p.addr, d: d, proc: p, relays: relays}, nil
			}
			exited := !p.alive()
			p.kill()
			tail := p.logTail()
			if attempt < bindAttempts && exited && strings.Contains(tail, "address already in use") {
				continue
			}
			err = fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath, tail)
		}
		return fail(fmt.Errorf("testenv: starting prometheus: %w", err))
	}
}

func startPrometheus(d *deployment, bin, conf string) (*process, error) {
	ports, err := FreePorts(1)
	if err != nil {
		return nil, err
	}
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
	return d.startCommand("prometheus-"+strconv.Itoa(ports[0]), addr, bin,
		"--config.file="+conf,
		"--storage.tsdb.path="+filepath.Join(d.dir, "data-"+strconv.Itoa(ports[0])),
		"--web.listen-address="+addr,
		"--log.level=warn",
	)
}

// Close stops Prometheus and its relays and removes its data. It is
// idempotent.
func (p *Prometheus) Close() error {
	err := p.d.Close()
	for _, rl := range p.relays {
		rl.close()
	}
	return err
}

// RedisExporter is a prometheus-redis-exporter serving one Redis node's
// metrics on loopback.
type RedisExporter struct {
	Addr string // host:port of its /metrics

	d *deployment
}

// StartRedisExporter starts prometheus-redis-exporter for the Redis at
// redisAddr (password may be empty) and returns once it serves /metrics.
func StartRedisExporter(redisAddr, password string) (*RedisExporter, error) {
	bin, err := servers.Lookup("prometheus-redis-exporter")
	if err != nil {
		return nil, err
	}
	d, err := newDeployment("redis-exporter")
	if err != nil {
		return nil, fmt.Errorf("testenv: starting redis exporter: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	for attempt := 1; ; attempt++ {
		ports, err := FreePorts(1)
		if err != nil {
			_ = d.Close()
			return nil, err
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		args := []string{"--redis.addr=redis://" + redisAddr, "--web.listen-address=" + addr}
		if password != "" {
			args = append(args, "--redis.password="+password)
		}
		p, err := d.startCommand("exporter-"+strconv.Itoa(ports[0]), addr, bin, args...)
		if err == nil {
			err = waitHTTPReady(ctx, p, "http://"+addr+"/metrics")
			if err == nil {
				return &RedisExporter{Addr: addr, d: d}, nil
			}
			exited := !p.alive()
			p.kill()
			tail := p.logTail()
			if attempt < bindAttempts && exited && strings.Contains(tail, "address already in use") {
				continue
			}
			err = fmt.Errorf("%w\n--- last lines of %s ---\n%s", err, p.logPath, tail)
		}
		_ = d.Close()
		return nil, fmt.Errorf("testenv: starting redis exporter: %w", err)
	}
}

// Close stops the exporter. It is idempotent.
func (e *RedisExporter) Close() error { return e.d.Close() }

// startCommand runs bin with args in d, both output streams to a log named
// after name.
func (d *deployment) startCommand(name, addr, bin string, args ...string) (*process, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, errors.New("deployment is closed")
	}
	p := &process{addr: addr, logPath: filepath.Join(d.dir, name+".log")}
	logFile, err := os.OpenFile(p.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening %s: %w", p.logPath, err)
	}
	defer logFile.Close()
	cmd := exec.Command(bin, args...)
	cmd.Dir = d.dir
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if p.Proc, err = StartProc(cmd); err != nil {
		return nil, err
	}
	d.procs = append(d.procs, p)
	return p, nil
}

// waitHTTPReady polls url until it answers 200 or p exits.
func waitHTTPReady(ctx context.Context, p *process, url string) error {
	c := &http.Client{Timeout: time.Second}
	return proc.Poll(ctx, url, func(ctx context.Context) error {
		if !p.alive() {
			return proc.Permanent(fmt.Errorf("process exited: %s", p.Cmd.ProcessState))
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return proc.Permanent(err)
		}
		resp, err := c.Do(req)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("%s answered %d", url, resp.StatusCode)
		}
		return nil
	})
}
