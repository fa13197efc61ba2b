// Package accesslog writes one line per request, off the request path.
//
// The request's goroutine formats its line into a pooled buffer (cheap:
// appends, no reflection) and hands it to a bounded queue; one writer
// goroutine writes the queue to the file in batches, every flushEvery or
// as soon as half the queue is waiting, so a request wakes nobody. When
// the queue is full the line is dropped and counted, never waited for: a
// slow disk must not slow the edge. Reopen (on SIGHUP/SIGUSR1) closes and
// reopens the file, so logrotate's rename-then-signal works without losing
// lines.
package accesslog

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"
	"unsafe"
)

// Format is how a line is written.
type Format string

// The formats: JSON for machines, logfmt for people.
const (
	JSON   Format = "json"
	Logfmt Format = "logfmt"
)

// ParseFormat reads a format name.
func ParseFormat(s string) (Format, error) {
	switch Format(s) {
	case JSON, Logfmt:
		return Format(s), nil
	}
	return "", fmt.Errorf("unknown access log format %q (want json or logfmt)", s)
}

// queueSize bounds the lines waiting to be written.
const queueSize = 8192

// flushEvery is how long a line may wait in the queue before the writer
// writes it: the writer wakes on this tick, or when a Send finds half the
// queue waiting (wakeAt), not for each line. Waking it for each line cost
// the request path a goroutine hand-off (and often a futex call) per line.
const flushEvery = 100 * time.Millisecond

// wakeAt is the queue's length at which a Send wakes the writer before its
// tick, so a burst does not fill the queue and drop lines while it sleeps.
const wakeAt = queueSize / 2

// Log is an access log. Its methods are safe for concurrent use; a nil *Log
// logs nothing.
type Log struct {
	path   string
	format Format
	queue  chan *Line
	// Dropped counts lines the full queue turned away; Written those
	// written.
	dropped, written atomic.Int64
	reopen           chan chan error
	wake             chan struct{} // one waiting at most: write now (half the queue, or Close)
	done             chan struct{}
	mu               sync.RWMutex // Send holds it to read closed; Close to set it
	closed           bool
	errs             func(error) // write and reopen errors, for the edge's log
}

// Open starts an access log writing to path ("-" is standard output).
// onError hears about write and reopen failures (the line is lost).
func Open(path string, format Format, onError func(error)) (*Log, error) {
	if onError == nil {
		onError = func(error) {}
	}
	l := &Log{path: path, format: format, queue: make(chan *Line, queueSize),
		reopen: make(chan chan error), wake: make(chan struct{}, 1), done: make(chan struct{}), errs: onError}
	w, err := l.open()
	if err != nil {
		return nil, err
	}
	go l.run(w)
	return l, nil
}

func (l *Log) open() (io.WriteCloser, error) {
	if l.path == "-" {
		return nopCloser{os.Stdout}, nil
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("opening access log: %w", err)
	}
	return f, nil
}

type nopCloser struct{ io.Writer }

func (nopCloser) Close() error { return nil }

// run writes queued lines until Close: each tick of flushEvery, or when
// woken, it writes what is queued and flushes once.
func (l *Log) run(w io.WriteCloser) {
	bw := bufio.NewWriterSize(w, 64<<10)
	defer close(l.done)
	tick := time.NewTicker(flushEvery)
	defer tick.Stop()
	write := func(line *Line) {
		if _, err := bw.Write(line.buf); err != nil {
			l.errs(err)
		} else {
			l.written.Add(1)
		}
		line.release()
	}
	// drain writes the lines queued when it starts and flushes (the
	// flush's error is returned), so a queue that never empties cannot
	// keep the writer from a Reopen; open is false once the queue is
	// closed (Close), after the file is closed.
	drain := func() (open bool, err error) {
		for n := len(l.queue); n > 0; n-- {
			write(<-l.queue)
		}
		select {
		case line, ok := <-l.queue:
			if !ok {
				if err := errors.Join(bw.Flush(), w.Close()); err != nil {
					l.errs(err)
				}
				return false, nil
			}
			write(line)
		default:
		}
		return true, bw.Flush()
	}
	for {
		select {
		case <-tick.C:
		case <-l.wake:
		case reply := <-l.reopen:
			// Lines sent before Reopen was called belong to the old file:
			// they are queued already.
			open, err := drain()
			if !open {
				reply <- errors.New("access log closed")
				return
			}
			nw, oerr := l.open()
			if oerr != nil {
				reply <- errors.Join(err, oerr) // keep writing to the old file
				continue
			}
			err = errors.Join(err, w.Close())
			w = nw
			bw.Reset(w)
			reply <- err
			continue
		}
		open, err := drain()
		if err != nil {
			l.errs(err)
		}
		if !open {
			return
		}
	}
}

// Reopen closes and reopens the file (log rotation); on error the old file
// stays in use.
func (l *Log) Reopen() error {
	if l == nil {
		return nil
	}
	reply := make(chan error, 1)
	select {
	case l.reopen <- reply:
		return <-reply
	case <-l.done:
		return errors.New("access log closed")
	}
}

// Close writes what is queued and closes the file. Lines sent after Close
// are dropped.
func (l *Log) Close() {
	if l == nil {
		return
	}
	l.mu.Lock()
	if !l.closed {
		l.closed = true
		close(l.queue)
		l.nudge()
	}
	l.mu.Unlock()
	<-l.done
}

// Dropped and Written are the counts so far.
func (l *Log) Dropped() int64 { return l.dropped.Load() }
func (l *Log) Written() int64 { return l.written.Load() }

// Line is one line being built. Start one with Begin, add fields, then
// Send it.
type Line struct {
	buf    []byte
	format Format
	first  bool
}

var linePool = sync.Pool{New: func() any { return &Line{buf: make([]byte, 0, 512)} }}

// Begin starts a line with its time; nil when l is nil.
func (l *Log) Begin(t time.Time) *Line {
	if l == nil {
		return nil
	}
	line := linePool.Get().(*Line)
	line.buf, line.format, line.first = line.buf[:0], l.format, true
	if l.format == JSON {
		line.buf = append(line.buf, '{')
	}
	line.key("time")
	line.buf = append(line.buf, '"')
	line.buf = t.UTC().AppendFormat(line.buf, time.RFC3339Nano)
	line.buf = append(line.buf, '"')
	return line
}

func (line *Line) release() {
	if cap(line.buf) <= 64<<10 {
		linePool.Put(line)
	}
}

func (line *Line) key(k string) {
	switch {
	case line.format == JSON && line.first:
		line.buf = append(line.buf, '"')
	case line.format == JSON:
		line.buf = append(line.buf, ',', '"')
	case !line.first:
		line.buf = append(line.buf, ' ')
	}
	line.first = false
	line.buf = append(line.buf, k...)
	if line.format == JSON {
		line.buf = append(line.buf, '"', ':')
	} else {
		line.buf = append(line.buf, '=')
	}
}

// Str adds a string field (escaped; in logfmt quoted when needed).
func (line *Line) Str(k, v string) *Line {
	if line == nil {
		return nil
	}
	line.key(k)
	if line.format == JSON || needsQuote(v) {
		line.buf = appendQuoted(line.buf, v)
	} else {
		line.buf = append(line.buf, v...)
	}
	return line
}

// Bytes is Str for bytes.
func (line *Line) Bytes(k string, v []byte) *Line {
	if line == nil {
		return nil
	}
	return line.Str(k, unsafeString(v))
}

// Int adds an integer field.
func (line *Line) Int(k string, v int64) *Line {
	if line == nil {
		return nil
	}
	line.key(k)
	line.buf = strconv.AppendInt(line.buf, v, 10)
	return line
}

// Dur adds a duration in seconds (a float: 0.000412).
func (line *Line) Dur(k string, d time.Duration) *Line {
	if line == nil {
		return nil
	}
	line.key(k)
	line.buf = strconv.AppendFloat(line.buf, d.Seconds(), 'f', 6, 64)
	return line
}

// List adds a list of strings: a JSON array, or comma-joined in logfmt.
func (line *Line) List(k string, vs []string) *Line {
	if line == nil {
		return nil
	}
	line.key(k)
	if line.format == JSON {
		line.buf = append(line.buf, '[')
		for i, v := range vs {
			if i > 0 {
				line.buf = append(line.buf, ',')
			}
			line.buf = appendQuoted(line.buf, v)
		}
		line.buf = append(line.buf, ']')
		return line
	}
	start := len(line.buf)
	for i, v := range vs {
		if i > 0 {
			line.buf = append(line.buf, ',')
		}
		line.buf = append(line.buf, v...)
	}
	if needsQuote(string(line.buf[start:])) {
		joined := string(line.buf[start:])
		line.buf = appendQuoted(line.buf[:start], joined)
	}
	return line
}

// Send ends the line and queues it; a full queue drops it (counted).
func (l *Log) Send(line *Line) {
	if l == nil || line == nil {
		return
	}
	if line.format == JSON {
		line.buf = append(line.buf, '}')
	}
	line.buf = append(line.buf, '\n')
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.closed {
		l.dropped.Add(1)
		return
	}
	select {
	case l.queue <- line:
		if len(l.queue) >= wakeAt {
			l.nudge()
		}
	default:
		l.dropped.Add(1)
		line.release()
	}
}

// nudge wakes the writer before its tick (one wake waits at most).
func (l *Log) nudge() {
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func unsafeString(b []byte) string { return unsafe.String(unsafe.SliceData(b), len(b)) }

func needsQuote(s string) bool {
	if s == "" {
		return true
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c <= ' ' || c == '"' || c == '=' || c == '\\' || c >= utf8.RuneSelf {
			return true
		}
	}
	return false
}

// appendQuoted appends s as a JSON string (also valid logfmt quoting):
// control characters, quotes and backslashes escaped, invalid UTF-8
// replaced, so a client's bytes can never break a line or forge another.
func appendQuoted(dst []byte, s string) []byte {
	const hex = "0123456789abcdef"
	dst = append(dst, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				dst = append(dst, '\\', c)
			case c < ' ' || c == 0x7f:
				dst = append(dst, '\\', 'u', '0', '0', hex[c>>4], hex[c&0xf])
			default:
				dst = append(dst, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			dst = append(dst, `\ufffd`...)
		} else {
			dst = append(dst, s[i:i+size]...)
		}
		i += size
	}
	return append(dst, '"')
}
