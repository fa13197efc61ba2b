package accesslog

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func readLines(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	s := strings.TrimSuffix(string(b), "\n")
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

func TestJSONLineEscapesWhatClientsSend(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, JSON, nil)
	require.NoError(t, err)
	at := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC)
	l.Send(l.Begin(at).Str("path", "/a\"b\\c\n{\"forged\":1}\x00\xff").Int("status", 429).
		List("rules", []string{"per-ip", "per\"key"}).Dur("total", 1500*time.Microsecond).Bytes("host", []byte("h.example")))
	l.Close()
	lines := readLines(t, path)
	require.Len(t, lines, 1, "a newline in a field cannot start a line")
	var got map[string]any
	require.NoError(t, json.Unmarshal([]byte(lines[0]), &got), lines[0])
	require.Equal(t, "2026-01-02T03:04:05.000006Z", got["time"])
	require.Equal(t, "/a\"b\\c\n{\"forged\":1}\x00\ufffd", got["path"])
	require.Equal(t, 429.0, got["status"])
	require.Equal(t, []any{"per-ip", "per\"key"}, got["rules"])
	require.Equal(t, 0.0015, got["total"])
	require.Equal(t, "h.example", got["host"])
}

func TestLogfmtLine(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, Logfmt, nil)
	require.NoError(t, err)
	l.Send(l.Begin(time.Unix(0, 0)).Str("method", "GET").Str("path", "/a b").List("rules", []string{"a", "b"}).Str("empty", ""))
	l.Close()
	require.Equal(t, []string{`time="1970-01-01T00:00:00Z" method=GET path="/a b" rules=a,b empty=""`}, readLines(t, path))
}

// logrotate renames the file, then signals: Reopen starts a new file and
// no line is lost across the two.
func TestReopenAfterRename(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "access.log")
	l, err := Open(path, Logfmt, nil)
	require.NoError(t, err)
	defer l.Close()
	for i := range 100 {
		l.Send(l.Begin(time.Unix(int64(i), 0)).Int("n", int64(i)))
	}
	require.Eventually(t, func() bool { return l.Written() == 100 }, 5*time.Second, time.Millisecond)
	require.NoError(t, os.Rename(path, path+".1"))
	for i := 100; i < 150; i++ { // still to the renamed file
		l.Send(l.Begin(time.Unix(int64(i), 0)).Int("n", int64(i)))
	}
	require.NoError(t, l.Reopen())
	for i := 150; i < 200; i++ {
		l.Send(l.Begin(time.Unix(int64(i), 0)).Int("n", int64(i)))
	}
	l.Close()
	old, cur := readLines(t, path+".1"), readLines(t, path)
	require.Len(t, old, 150)
	require.Len(t, cur, 50)
	require.True(t, strings.HasSuffix(cur[0], " n=150"), cur[0])
	require.Zero(t, l.Dropped())

	require.Error(t, l.Reopen(), "closed")
}

// A writer that cannot keep up never blocks a request: lines past the
// queue are dropped and counted.
func TestFullQueueDropsAndCounts(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	defer r.Close()
	l := &Log{format: JSON, queue: make(chan *Line, 4), reopen: make(chan chan error), done: make(chan struct{}), errs: func(error) {}}
	go l.run(w) // nobody reads the pipe: the writer stalls once its buffer is full
	big := strings.Repeat("x", 32<<10)
	for range 200 { // would hang here if Send waited for the writer
		l.Send(l.Begin(time.Now()).Str("pad", big))
	}
	require.Positive(t, l.Dropped(), "lines past the queue are dropped")
	go func() { _, _ = bufio.NewReader(r).WriteTo(discard{}) }()
	l.Close()
	require.Equal(t, int64(200), l.Dropped()+l.Written())
}

type discard struct{}

func (discard) Write(p []byte) (int, error) { return len(p), nil }

func TestNilLogIsOff(t *testing.T) {
	var l *Log
	l.Send(l.Begin(time.Now()).Str("a", "b").Int("c", 1))
	require.NoError(t, l.Reopen())
	l.Close()
}

// BenchmarkLine is what one request pays for its line: formatting into a
// pooled buffer and a queue send (the write is the writer goroutine's).
func BenchmarkLine(b *testing.B) {
	for _, f := range []Format{JSON, Logfmt} {
		b.Run(string(f), func(b *testing.B) {
			l, err := Open(filepath.Join(b.TempDir(), "access.log"), f, nil)
			require.NoError(b, err)
			defer l.Close()
			rules := []string{"per-ip", "per-key"}
			host, path := []byte("api.example.com"), []byte("/v1/orders/12345")
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					l.Send(l.Begin(time.Now()).Str("id", "0123456789abcdef0123456789abcdef").Str("client", "203.0.113.7").
						Bytes("host", host).Str("method", "GET").Bytes("path", path).Int("status", 200).
						Str("outcome", "proxied").Str("decision", "allowed").Str("tier", "read").List("rules", rules).
						Str("source", "redis").Dur("upstream_seconds", 420*time.Microsecond).Dur("total_seconds", 610*time.Microsecond).
						Int("bytes_in", 0).Int("bytes_out", 1234))
				}
			})
			b.StopTimer()
			b.ReportMetric(float64(l.Dropped())/float64(b.N), "dropped/op")
		})
	}
}

// A request's line wakes nobody: the writer writes on its tick, or at once
// when half the queue is waiting (a burst), never for each line.
func TestSendWakesTheWriterOnlyForABurst(t *testing.T) {
	// No writer runs: what Send leaves in wake is what it asked for.
	l := &Log{format: JSON, queue: make(chan *Line, queueSize), wake: make(chan struct{}, 1), done: make(chan struct{}), errs: func(error) {}}
	for i := range wakeAt - 1 {
		l.Send(l.Begin(time.Unix(int64(i), 0)).Int("n", int64(i)))
		require.Empty(t, l.wake, "line %d woke the writer", i)
	}
	l.Send(l.Begin(time.Unix(0, 0)).Int("n", wakeAt))
	require.Len(t, l.wake, 1, "half the queue waiting wakes the writer")
}

// A lone line reaches the file on the writer's tick, with no burst and no
// Close to push it.
func TestLoneLineIsWrittenOnTheTick(t *testing.T) {
	path := filepath.Join(t.TempDir(), "access.log")
	l, err := Open(path, Logfmt, nil)
	require.NoError(t, err)
	defer l.Close()
	l.Send(l.Begin(time.Unix(0, 0)).Str("method", "GET"))
	require.Eventually(t, func() bool { return len(readLines(t, path)) == 1 }, 10*time.Second, 5*time.Millisecond)
	require.Equal(t, []string{`time="1970-01-01T00:00:00Z" method=GET`}, readLines(t, path))
}
