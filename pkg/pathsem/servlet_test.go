package pathsem

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"

	"github.com/edgeguard/edgeguard/internal/proc"
	"github.com/edgeguard/edgeguard/internal/testenv"
	"github.com/edgeguard/edgeguard/pkg/rules"
)

// The differential tests send raw paths to real Tomcat 10 and Jetty 9 (the
// Debian packages tomcat10 and jetty9, which `make tools` installs) and
// compare what each resolved with Normalize(raw, Servlet). TestMain starts
// both once for the package, in parallel, each from a base directory of its
// own on a free loopback port; the packages' system services are never used.

var update = flag.Bool("update", false, "rewrite testdata/servlet/resolved.txt from the containers' answers")

const (
	// servletEnv hands running containers to the fuzzing workers (they run
	// TestMain too): "tomcat=host:port jetty=host:port".
	servletEnv = "EDGEGUARD_PATHSEM_SERVLET"
	// startTimeout bounds the start of both containers (about 5 s each on
	// an idle machine, in parallel; the JSP is compiled before the first
	// answer).
	startTimeout = 2 * time.Minute
)

var containers struct {
	tomcat, jetty string // host:port
}

func TestMain(m *testing.M) {
	os.Exit(runMain(m))
}

func runMain(m *testing.M) int {
	flag.Parse()
	if env := os.Getenv(servletEnv); env != "" {
		for f := range strings.FieldsSeq(env) {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "tomcat":
				containers.tomcat = v
			case "jetty":
				containers.jetty = v
			}
		}
		if containers.tomcat == "" || containers.jetty == "" {
			fmt.Fprintf(os.Stderr, "%s=%q: want tomcat=host:port jetty=host:port\n", servletEnv, env)
			return 2
		}
		return m.Run()
	}
	ctx, cancel := context.WithTimeout(context.Background(), startTimeout)
	defer cancel()
	var (
		wg                sync.WaitGroup
		tomcat, jetty     *container
		tomcatErr, jetErr error
	)
	wg.Go(func() { tomcat, tomcatErr = startContainer(ctx, "tomcat", setUpTomcat) })
	wg.Go(func() { jetty, jetErr = startContainer(ctx, "jetty", setUpJetty) })
	wg.Wait()
	for _, c := range []*container{tomcat, jetty} {
		if c != nil {
			defer c.stop()
		}
	}
	if err := errors.Join(tomcatErr, jetErr); err != nil {
		fmt.Fprintf(os.Stderr, "pathsem: starting the servlet containers for the differential tests "+
			"(Debian packages tomcat10 and jetty9, installed by `make tools`): %v\n", err)
		return 1
	}
	containers.tomcat, containers.jetty = tomcat.addr, jetty.addr
	// Fuzzing workers are new processes of this binary: they use these.
	if err := os.Setenv(servletEnv, "tomcat="+tomcat.addr+" jetty="+jetty.addr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	return m.Run()
}

type container struct {
	name, addr, dir string
	p               *proc.Proc
}

func (c *container) stop() {
	c.p.Kill()
	_ = os.RemoveAll(c.dir)
}

// setUp writes a base directory for port into dir and returns the command
// that runs the container from it.
type setUp func(dir string, port int) (*exec.Cmd, error)

// startContainer starts a container and waits until the echo page answers;
// a container that exits first (its port taken meanwhile, say) is started
// again on another port, up to three times.
func startContainer(ctx context.Context, name string, set setUp) (*container, error) {
	var lastErr error
	for range 3 {
		c, err := startOnce(ctx, name, set)
		if err == nil {
			return c, nil
		}
		lastErr = err
		if ctx.Err() != nil {
			break
		}
	}
	return nil, lastErr
}

func startOnce(ctx context.Context, name string, set setUp) (*container, error) {
	ports, err := testenv.FreePorts(1)
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp("", "pathsem-"+name+"-")
	if err != nil {
		return nil, err
	}
	cmd, err := set(dir, ports[0])
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	logPath := filepath.Join(dir, name+".log")
	logf, err := os.Create(logPath)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, err
	}
	defer logf.Close()
	cmd.Dir, cmd.Stdout, cmd.Stderr = dir, logf, logf
	p, err := proc.Start(cmd)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	c := &container{name: name, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0])), dir: dir, p: p}
	err = proc.PollEvery(ctx, 100*time.Millisecond, name+" answering on "+c.addr, func(context.Context) error {
		if !p.Alive() {
			return proc.Permanent(errors.New("exited"))
		}
		status, body, err := rawGet(c.addr, "/ready")
		if err != nil {
			return err
		}
		if status != http.StatusOK || body != "/ready" {
			return fmt.Errorf("GET /ready: %d %q", status, body)
		}
		return nil
	})
	if err != nil {
		err = proc.WithTail(fmt.Errorf("%s: %w", name, err), logPath)
		c.stop()
		return nil, err
	}
	return c, nil
}

// Found where Debian's packages put them; EDGEGUARD_TOMCAT_HOME and
// EDGEGUARD_JETTY_HOME point elsewhere.
func home(env, def string) string {
	if v := os.Getenv(env); v != "" {
		return v
	}
	return def
}

// jvmStartFast trades peak speed for start time: the tests send a few
// hundred requests.
var jvmStartFast = [2]string{"-XX:TieredStopAtLevel=1", "-XX:+UseSerialGC"}

func setUpTomcat(dir string, port int) (*exec.Cmd, error) {
	h := home("EDGEGUARD_TOMCAT_HOME", "/usr/share/tomcat10")
	defaults, err := os.ReadFile(filepath.Join(h, "etc", "web.xml"))
	if err != nil {
		return nil, fmt.Errorf("the default web.xml of %s (is tomcat10 installed?): %w", h, err)
	}
	if err := writeTree(dir, map[string][]byte{
		"conf/server.xml":              withPort("tomcat-server.xml", port),
		"conf/web.xml":                 defaults,
		"webapps/ROOT/echo.jsp":        readTestdata("echo.jsp"),
		"webapps/ROOT/WEB-INF/web.xml": readTestdata("web-jakarta.xml"),
		"logs/.keep":                   nil,
		"temp/.keep":                   nil,
		"work/.keep":                   nil,
	}); err != nil {
		return nil, err
	}
	return exec.Command("java", jvmStartFast[0], jvmStartFast[1],
		// No TLD scanning of the server's jars: the echo page uses none.
		"-Dtomcat.util.scan.StandardJarScanFilter.jarsToSkip=*",
		// Exit when the port cannot be bound (taken since FreePorts), so
		// startContainer tries another instead of waiting out the timeout.
		"-Dorg.apache.catalina.startup.EXIT_ON_INIT_FAILURE=true",
		"-cp", filepath.Join(h, "bin", "bootstrap.jar")+":"+filepath.Join(h, "bin", "tomcat-juli.jar"),
		"-Dcatalina.home="+h, "-Dcatalina.base="+dir, "-Djava.io.tmpdir="+filepath.Join(dir, "temp"),
		"org.apache.catalina.startup.Bootstrap", "start"), nil
}

func setUpJetty(dir string, port int) (*exec.Cmd, error) {
	h := home("EDGEGUARD_JETTY_HOME", "/usr/share/jetty9")
	start := filepath.Join(h, "start.jar")
	if _, err := os.Stat(start); err != nil {
		return nil, fmt.Errorf("is jetty9 installed? %w", err)
	}
	if err := writeTree(dir, map[string][]byte{
		"start.ini":                    withPort("jetty-start.ini", port),
		"webapps/ROOT/echo.jsp":        readTestdata("echo.jsp"),
		"webapps/ROOT/WEB-INF/web.xml": readTestdata("web-javax.xml"),
		"tmp/.keep":                    nil,
	}); err != nil {
		return nil, err
	}
	return exec.Command("java", jvmStartFast[0], jvmStartFast[1], "-Djava.io.tmpdir="+filepath.Join(dir, "tmp"),
		"-jar", start, "jetty.home="+h, "jetty.base="+dir), nil
}

func readTestdata(name string) []byte {
	b, err := os.ReadFile(filepath.Join("testdata", "servlet", name))
	if err != nil {
		panic(err) // the package's own files: a broken checkout
	}
	return b
}

func withPort(name string, port int) []byte {
	return []byte(strings.ReplaceAll(string(readTestdata(name)), "PORT", strconv.Itoa(port)))
}

func writeTree(dir string, files map[string][]byte) error {
	for name, data := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, data, 0o644); err != nil {
			return err
		}
	}
	return nil
}

// rawGet sends path exactly as given, byte for byte, in an HTTP/1.1 request
// line and returns the status and, for a 200, the body (what the container
// resolved).
func rawGet(addr, path string) (int, string, error) {
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		return 0, "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(20 * time.Second)); err != nil {
		return 0, "", err
	}
	if _, err := io.WriteString(conn, "GET "+path+" HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n"); err != nil {
		return 0, "", err
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		return 0, "", fmt.Errorf("GET %q: %w", path, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
	if err != nil {
		return 0, "", fmt.Errorf("GET %q: reading the body: %w", path, err)
	}
	if resp.StatusCode != http.StatusOK {
		return resp.StatusCode, "", nil
	}
	return resp.StatusCode, string(body), nil
}

// canon puts a container's answer in the rules' form: Jetty keeps empty
// segments and a trailing slash in the servlet path, which the rules'
// form drops. Nothing is decoded.
func canon(resolved string) string {
	var b strings.Builder
	b.WriteByte('/')
	for seg := range strings.SplitSeq(resolved, "/") {
		if seg == "" {
			continue
		}
		if b.Len() > 1 {
			b.WriteByte('/')
		}
		b.WriteString(seg)
	}
	return b.String()
}

// answer is one container's answer to a raw path: its status and, for a
// 200, the path it resolved in the rules' form.
type answer struct {
	status       int
	path         string
	queryRefused bool // refused with its query, served without
}

func (a answer) String() string {
	if a.status != http.StatusOK {
		return strconv.Itoa(a.status)
	}
	if a.queryRefused {
		return "200 " + strconv.Quote(a.path) + " (query refused)"
	}
	return "200 " + strconv.Quote(a.path)
}

// ask sends raw to the container at addr. The query is not the path's
// business: when the container refuses raw (Tomcat refuses a '"' in the
// query, say) but serves its path alone, the answer is the path's, marked.
func ask(addr, raw string) (answer, error) {
	a, err := askOnce(addr, raw)
	if err != nil || a.status == http.StatusOK {
		return a, err
	}
	i := queryIndex(raw, true)
	if i <= 0 || raw[i] != '?' {
		return a, nil // no query, or no path to send alone
	}
	p, err := askOnce(addr, raw[:i])
	if err != nil || p.status != http.StatusOK {
		return a, err
	}
	p.queryRefused = true
	return p, nil
}

func askOnce(addr, raw string) (answer, error) {
	status, body, err := rawGet(addr, raw)
	if err != nil {
		return answer{}, err
	}
	if status != http.StatusOK {
		return answer{status: status}, nil
	}
	return answer{status: status, path: canon(body)}, nil
}

// apiRule is the edge's real matcher with a path_prefix rule: what the
// differential holds the edge's rule decision with.
var apiRule = func() *rules.Snapshot {
	s, err := rules.Load([]byte("version: 1\nrules:\n  - {id: api, key: [ip], algorithm: fixed_window, limit: 5, window: 1s, match: {path_prefix: [/api]}}\n"))
	if err != nil {
		panic(err)
	}
	return s
}()

// ruleApplies is the matcher's decision for a request of path.
func ruleApplies(path string) bool {
	req := rules.Request{Host: "h.example", Method: "GET", Path: path, ClientIP: netip.MustParseAddr("192.0.2.1")}
	return len(apiRule.Match(&req, nil)) > 0
}

// checkAgainst holds Normalize(raw, Servlet) to what the containers did:
//   - a container that served the path (200) resolved it to Normalize's
//     answer, unless the two containers disagree, when Normalize's answer
//     is the other's and the path is ambiguous;
//   - a container that refused the path (any other status) refused
//     something Normalize calls ambiguous, so the edge's "refuse ambiguous
//     paths" option refuses it too;
//   - the rule decision of the edge's matcher (a path_prefix rule) on the
//     path the edge computes from the raw path is its decision on the path
//     a container that served the request resolved, with the same
//     exception for a path the containers disagree on;
//   - a lone UTF-16 surrogate by "%u" is only held ambiguous.
func checkAgainst(raw string, tomcat, jetty answer) error {
	return checkWith(raw, tomcat, jetty, ruleApplies)
}

// checkWith is checkAgainst with the rule decision given.
func checkWith(raw string, tomcat, jetty answer, applies func(path string) bool) error {
	got, amb := Normalize(raw, Servlet)
	if strings.Contains(raw, "%u") && strings.ContainsRune(got, utf8.RuneError) {
		// A lone UTF-16 surrogate ("%uD800"): the container holds it in a
		// Java string, which the echo cannot write as UTF-8, so there is
		// nothing to compare; the path must be ambiguous.
		if !amb {
			return fmt.Errorf("%q: a lone surrogate, not ambiguous", raw)
		}
		return nil
	}
	var errs []error
	for _, c := range []struct {
		name        string
		self, other answer
	}{{"tomcat", tomcat, jetty}, {"jetty", jetty, tomcat}} {
		switch {
		case c.self.status != http.StatusOK && !amb:
			errs = append(errs, fmt.Errorf("%s refused %q with %d, Normalize gives %q, not ambiguous", c.name, raw, c.self.status, got))
		case c.self.status == http.StatusOK && c.self.path != got:
			if !amb || c.other.status != http.StatusOK || c.other.path != got {
				errs = append(errs, fmt.Errorf("%s resolved %q to %q, Normalize gives %q (ambiguous %v; other container %s)", c.name, raw, c.self.path, got, amb, c.other))
			}
		}
		if c.self.status == http.StatusOK && applies(got) != applies(c.self.path) {
			if !amb || c.other.status != http.StatusOK || c.other.path != got {
				errs = append(errs, fmt.Errorf("%s served %q as %q: the /api rule applies %v there, %v to the edge's %q", c.name, raw, c.self.path, applies(c.self.path), applies(got), got))
			}
		}
	}
	return errors.Join(errs...)
}

// corpus returns the named inputs of testdata/servlet/corpus.txt (one Go
// quoted string a line) and combinations of tricks around names.
func corpus(t testing.TB) []string {
	data, err := os.ReadFile(filepath.Join("testdata", "servlet", "corpus.txt"))
	require.NoError(t, err)
	var out []string
	for i, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		s, err := strconv.Unquote(line)
		require.NoError(t, err, "corpus.txt:%d", i+1)
		out = append(out, s)
	}
	tricks := []string{";x", ";", "..;", "..;x", ".;", "%2e%2e;", "%2e%2e", ".%2e", "%2e", "..", ".", "", "%2f", "%2F..", "%5c", `\`, "%3b", "%3B..", "%20", "%u002f", "%c0%af", "%00", "%25", "%252e%252e", "a.", "a%20", "A"}
	for _, tr := range tricks {
		out = append(out, "/a/"+tr+"/b", "/a"+tr+"/b", "/public/"+tr+"/api/x", "/a/b/"+tr)
	}
	return out
}

func TestServletDifferential(t *testing.T) {
	inputs := corpus(t)
	type result struct{ tomcat, jetty answer }
	results := make([]result, len(inputs))
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		errs []error
		next = make(chan int)
	)
	for range 4 {
		wg.Go(func() {
			for i := range next {
				tc, err1 := ask(containers.tomcat, inputs[i])
				jt, err2 := ask(containers.jetty, inputs[i])
				if err := errors.Join(err1, err2); err != nil {
					mu.Lock()
					errs = append(errs, err)
					mu.Unlock()
					continue
				}
				results[i] = result{tc, jt}
			}
		})
	}
	for i := range inputs {
		next <- i
	}
	close(next)
	wg.Wait()
	require.NoError(t, errors.Join(errs...))

	// The answers, as the docs' abuse table quotes them; a change in either
	// container shows up here.
	var b strings.Builder
	b.WriteString("# raw path\ttomcat\tjetty\tNormalize(raw, servlet)\tambiguous\n")
	seen := map[string]bool{}
	for i, raw := range inputs {
		if err := checkAgainst(raw, results[i].tomcat, results[i].jetty); err != nil {
			t.Error(err)
		}
		if seen[raw] {
			continue
		}
		seen[raw] = true
		p, amb := Normalize(raw, Servlet)
		fmt.Fprintf(&b, "%q\t%s\t%s\t%q\t%v\n", raw, results[i].tomcat, results[i].jetty, p, amb)
	}
	golden := filepath.Join("testdata", "servlet", "resolved.txt")
	if *update {
		require.NoError(t, os.WriteFile(golden, []byte(b.String()), 0o644))
	}
	want, err := os.ReadFile(golden)
	require.NoError(t, err)
	require.Equal(t, string(want), b.String(), "the containers' answers differ from %s (after a deliberate change: go test ./pkg/pathsem -run TestServletDifferential -update)", golden)
}

// The harness itself: a Normalize that ignored parameters would be caught.
func TestCheckAgainstCatchesAMismatch(t *testing.T) {
	tomcat, err := ask(containers.tomcat, "/api;x/y")
	require.NoError(t, err)
	jetty, err := ask(containers.jetty, "/api;x/y")
	require.NoError(t, err)
	require.Equal(t, answer{status: 200, path: "/api/y"}, tomcat)
	require.NoError(t, checkAgainst("/api;x/y", tomcat, jetty))
	// What the edge would see without servlet semantics.
	require.Error(t, checkAgainst("/api;x/y", answer{status: 200, path: "/api;x/y"}, answer{status: 200, path: "/api;x/y"}))
	// A refusal of a path Normalize does not call ambiguous.
	require.Error(t, checkAgainst("/api/y", answer{status: 400}, jetty))
	// The rule decision: "/public/..;/api/x" is "/api/x" to Tomcat, and so
	// to the edge; a matcher that saw the raw path would not apply the rule.
	tomcat, err = ask(containers.tomcat, "/public/..;/api/x")
	require.NoError(t, err)
	require.Equal(t, answer{status: 200, path: "/api/x"}, tomcat)
	require.True(t, ruleApplies("/api/x"))
	require.False(t, ruleApplies("/public/..;/api/x"))
	require.NoError(t, checkAgainst("/public/..;/api/x", tomcat, answer{status: 400}))
	blind := func(path string) bool { return path != "/api/x" && ruleApplies(path) }
	require.ErrorContains(t, checkWith("/api;x/y", answer{status: 200, path: "/api/x"}, answer{status: 200, path: "/api/x"}, blind), "the /api rule applies")
}

// FuzzServletDifferential sends each input to both containers and holds
// Normalize to their answers (checkAgainst). Inputs that cannot be a
// request target's bytes (space, controls) cannot be sent: Normalize must
// call them ambiguous when those bytes are in the path, and so must it
// call a target that does not start with '/'. Run with `make fuzz-paths FUZZTIME=10m`.
func FuzzServletDifferential(f *testing.F) {
	for _, s := range corpus(f) {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		// A target not in origin form ("0:/" is absolute form to Jetty) is
		// not a path: the caller takes the path out of it first.
		if !strings.HasPrefix(raw, "/") {
			if _, amb := Normalize(raw, Servlet); !amb {
				t.Fatalf("Normalize(%q, servlet): not ambiguous", raw)
			}
			return
		}
		unsendable := func(r rune) bool { return r <= ' ' || r == 0x7f }
		if raw == "" || len(raw) > 2048 || strings.ContainsFunc(raw, unsendable) {
			path := raw
			if i := queryIndex(raw, true); i >= 0 {
				path = raw[:i]
			}
			if _, amb := Normalize(raw, Servlet); !amb && (path == "" || strings.ContainsFunc(path, unsendable)) {
				t.Fatalf("Normalize(%q, servlet): not ambiguous", raw)
			}
			return
		}
		tomcat, err := ask(containers.tomcat, raw)
		if err != nil {
			t.Fatal(err)
		}
		jetty, err := ask(containers.jetty, raw)
		if err != nil {
			t.Fatal(err)
		}
		if err := checkAgainst(raw, tomcat, jetty); err != nil {
			t.Fatal(err)
		}
	})
}
