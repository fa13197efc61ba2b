package listen

import (
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/net/http/httpguts"
	"golang.org/x/net/http2/hpack"
	"golang.org/x/time/rate"
)

// The frames of an h2 connection, both ways, as the edge meters them
// (h2MeteredConn sits between the TLS connection and net/http's server).
//
// Every frame type a client sends spends a budget or does work net/http
// bounds itself (HEADERS: the stream limit; DATA with data: flow control):
//   - RST_STREAM, and the resets the server sends that the client provoked
//     (a WINDOW_UPDATE of 0 on a stream, DATA on a closed stream, a stream
//     beyond the limit: any code but NO_ERROR), spend one budget, so a
//     client cannot start handlers faster by making the server reset its
//     streams than by resetting them itself;
//   - PING, SETTINGS, PRIORITY, PRIORITY_UPDATE and GOAWAY spend the control
//     budget;
//   - WINDOW_UPDATE is allowed by the DATA the server sends (a client
//     updates a window only for what it received) and by the streams it
//     opens, as Envoy does; beyond that it spends a budget of its own;
//   - frames that do nothing spend the idle budget: DATA without data or
//     END_STREAM, a PING ACK no PING asked for, CONTINUATION without a
//     field or END_HEADERS, and frame types net/http does not know (which
//     it must ignore).
//
// A connection that spends a budget gets a GOAWAY (ENHANCE_YOUR_CALM) when
// the edge can write one at a frame boundary, and is closed.
//
// Two rules of RFC 9113 net/http does not keep are kept here by rewriting
// what the client sent before net/http reads it:
//   - §6.5.3: a SETTINGS frame may name a setting twice and the last value
//     holds (net/http refuses duplicates, against setting floods): the
//     earlier ones get identifiers nobody knows, which net/http ignores;
//   - §8.2.2: a request with a connection-specific field (Connection,
//     Keep-Alive, Proxy-Connection, Transfer-Encoding, Upgrade) or a TE
//     other than "trailers" is malformed, a stream error (net/http answers
//     400 instead): the edge decodes each header block with an HPACK
//     decoder of its own (in step with net/http's: same bytes, same table
//     size) and adds to a malformed one a field net/http refuses (an
//     upper-case name, a literal that leaves the dynamic table as it is),
//     so net/http resets the stream with PROTOCOL_ERROR.

// Budgets of the frames that do no work, and the WINDOW_UPDATEs each DATA
// frame sent allows: a few, and one more for every 2 KiB it carries (Envoy
// allows 10 a frame; Go's client updates the stream and the connection for
// every 4 KiB it reads, 8 for a 16 KiB frame; browsers far less often).
const (
	h2IdleBurst           = 100
	h2IdleRate            = 10 // per second
	h2WindowUpdateBurst   = 100
	h2WindowUpdateRate    = 10 // per second
	h2WindowUpdatePerData = 4
	h2WindowUpdateBytes   = 2 << 10
)

// The label values of edgeguard_tls_h2_floods_total{frame}.
var h2FloodFrames = []string{"rst_stream", "provoked_resets", "early_resets", "control", "window_update", "empty_data", "ping_ack", "continuation", "unknown"}

// HTTP/2 frame types and flags (RFC 9113 §6, RFC 9218 §7.1).
const (
	h2FrameData           = 0x0
	h2FrameHeaders        = 0x1
	h2FramePriority       = 0x2
	h2FrameRSTStream      = 0x3
	h2FrameSettings       = 0x4
	h2FramePushPromise    = 0x5
	h2FramePing           = 0x6
	h2FrameGoAway         = 0x7
	h2FrameWindowUpdate   = 0x8
	h2FrameContinuation   = 0x9
	h2FramePriorityUpdate = 0x10

	h2FlagAck        = 0x1
	h2FlagEndStream  = 0x1
	h2FlagEndHeaders = 0x4
	h2FlagPadded     = 0x8
	h2FlagPriority   = 0x20

	h2ErrNo              = 0x0
	h2ErrEnhanceYourCalm = 0xb
)

// h2Poison is a field net/http's framer refuses as a stream error: a
// literal without indexing (the dynamic table stays in step) named "X"
// (upper case is malformed in HTTP/2), empty value.
var h2Poison = []byte{0x00, 0x01, 'X', 0x00}

// h2Meter is an h2MeteredConn's state: what it reads (net/http reads from
// one goroutine), what it writes (under wmu), and the budgets both spend
// (under mu).
type h2Meter struct {
	m        *H2Metrics
	maxList  int // net/http's header list limit
	holdMax  int // the largest header-block frame read whole
	failOnce sync.Once
	h2ReadSide
	h2WriteSide
	h2Budgets
}

// h2ReadSide is what the meter keeps of the client's frames.
type h2ReadSide struct {
	preface int // bytes of the client preface still to pass
	hdr     [9]byte
	hn      int    // bytes of hdr read
	left    int    // payload bytes of the current frame still to pass
	hold    []byte // a frame read whole before net/http gets it (holding)
	holding bool
	dataPad bool   // the next payload byte is a padded DATA frame's pad length
	dataEnd bool   // and that frame ends its stream
	dataLen int    // and its length
	pend    []byte // bytes for net/http not in its buffer, in order
	pendBuf []byte
	direct  bool // this read's output is still the caller's buffer as read
	pass    int  // bytes of the caller's buffer that go to net/http as read
	block   h2Block
	err     error
}

// h2WriteSide is what the meter keeps of the server's frames.
type h2WriteSide struct {
	wmu      sync.Mutex
	whdr     [9]byte
	whn      int
	wleft    int // payload bytes of the server's current frame
	wrst     []byte
	goneAway bool          // the GOAWAY is written (or the connection closed): no frame after it
	wfailed  bool          // a write failed: the TLS connection writes no more
	away     atomic.Bool   // a budget is spent: the GOAWAY goes at the next frame boundary
	last     atomic.Uint32 // the highest stream the client opened
}

// h2Budgets are the client's budgets of frames that cost the server work.
type h2Budgets struct {
	mu                                   sync.Mutex
	resets, control, idle, windowUpdates *rate.Limiter
	pingsOwed                            int // PINGs the server sent, not yet acknowledged
	updatesOwed                          int // WINDOW_UPDATEs the DATA sent and the streams opened allow
	// Resets spent before they were written (refusedEarly).
	maxStreams int  // net/http's SETTINGS_MAX_CONCURRENT_STREAMS
	unanswered int  // streams opened since the server last wrote, less those the client reset
	resetsOwed int  // resets spent on the read side, not yet written
	goneQuiet  bool // the server wrote a GOAWAY: net/http ignores new streams
}

func (c *h2Meter) init(m *H2Metrics, maxHeaderBytes, maxStreams int) {
	c.m, c.preface, c.maxStreams = m, len(http2Preface), maxStreams
	c.maxList = maxHeaderBytes + 10*32 // net/http's adjustment of MaxHeaderBytes
	c.holdMax = min(2*c.maxList+1+255+5, 1<<20-len(h2Poison))
	c.resets = rate.NewLimiter(h2ResetRate, h2ResetBurst)
	c.control = rate.NewLimiter(h2ControlRate, h2ControlBurst)
	c.idle = rate.NewLimiter(h2IdleRate, h2IdleBurst)
	c.windowUpdates = rate.NewLimiter(h2WindowUpdateRate, h2WindowUpdateBurst)
	c.block.init(c.maxList)
}

// Read hands net/http what the client sent, metered and rewritten.
func (c *h2MeteredConn) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	for {
		if len(c.pend) > 0 {
			n := copy(b, c.pend)
			c.pend = c.pend[n:]
			return n, nil
		}
		if c.err != nil {
			return 0, c.err
		}
		p := b
		if c.holding { // straight into the held frame
			p = c.hold[len(c.hold):cap(c.hold)]
		}
		n, err := c.Conn.Read(p)
		c.pend, c.direct, c.pass = c.pendBuf[:0], !c.holding, 0
		if label := c.scan(p[:n]); label != "" {
			c.flood(label)
			c.err = errH2Flood
			return 0, c.err
		}
		c.pendBuf = c.pend[:0]
		if err != nil {
			c.err = err
		}
		if c.pass > 0 {
			return c.pass, nil
		}
	}
}

// emit passes p[from:to] on to net/http.
func (c *h2Meter) emit(p []byte, from, to int) {
	if c.direct && from == c.pass {
		c.pass = to
		return
	}
	c.direct = false
	c.pend = append(c.pend, p[from:to]...)
}

// scan follows the frames in p and passes them on; it names the budget a
// frame spent ("" while none is).
func (c *h2Meter) scan(p []byte) string {
	for i := 0; i < len(p); {
		switch {
		case c.preface > 0:
			k := min(c.preface, len(p)-i)
			c.emit(p, i, i+k)
			c.preface, i = c.preface-k, i+k
			continue
		case c.holding:
			k := min(cap(c.hold)-len(c.hold), len(p)-i)
			c.hold = append(c.hold, p[i:i+k]...) // in place when read into hold
			i += k
			if len(c.hold) == cap(c.hold) {
				c.holding = false
				c.direct = false
				c.pend = c.held(c.pend, c.hold)
			}
			continue
		case c.left > 0:
			k := min(c.left, len(p)-i)
			if c.dataPad {
				c.dataPad = false
				if c.dataLen-1-int(p[i]) <= 0 && !c.dataEnd && !c.take(c.idle) {
					return "empty_data"
				}
			}
			c.emit(p, i, i+k)
			c.left, i = c.left-k, i+k
			continue
		}
		start, whole := i, c.hn == 0
		k := copy(c.hdr[c.hn:], p[i:])
		c.hn, i = c.hn+k, i+k
		if c.hn < len(c.hdr) {
			return "" // the rest of the header in the next read
		}
		c.hn = 0
		hold, label := c.frame(c.hdr)
		if label != "" {
			return label
		}
		n := int(c.hdr[0])<<16 | int(c.hdr[1])<<8 | int(c.hdr[2])
		if hold {
			if cap(c.hold) < 9+n {
				c.hold = make([]byte, 0, 9+n)
			}
			c.hold = append(c.hold[:0:9+n], c.hdr[:]...)
			c.holding = true
			if n == 0 {
				c.holding, c.direct = false, false
				c.pend = c.held(c.pend, c.hold)
			}
			continue
		}
		if whole {
			c.emit(p, start, i)
		} else {
			c.direct = false
			c.pend = append(c.pend, c.hdr[:]...)
		}
		c.left = n
	}
	return ""
}

// take spends one of a budget's tokens (the limiter locks: the reader
// and the writer of the connection both spend the reset budget).
func (c *h2Meter) take(b *rate.Limiter) bool { return b.Allow() }

// goAwayBeforeClose writes the GOAWAY a spent budget owes the client
// before the connection closes, once net/http's write in progress is done
// (bounded: the write gets a second at most from here).
func (c *h2MeteredConn) goAwayBeforeClose() {
	if !c.away.Load() {
		return
	}
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	c.wmu.Lock()
	c.goAwayLocked()
	c.goneAway = true
	c.wmu.Unlock()
}

// spendOwed takes one of what the server's own frames allow the client
// (PING ACKs for its PINGs, WINDOW_UPDATEs for its DATA), if one is left.
func (c *h2Meter) spendOwed(n *int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if *n > 0 {
		*n--
		return true
	}
	return false
}

// frame meters a frame by its header, and says whether it is read whole
// before net/http gets it.
func (c *h2Meter) frame(h [9]byte) (hold bool, label string) {
	n := int(h[0])<<16 | int(h[1])<<8 | int(h[2])
	typ, flags := h[3], h[4]
	stream := binary.BigEndian.Uint32(h[5:]) & (1<<31 - 1)
	if c.block.open && typ != h2FrameContinuation {
		c.block.lost() // net/http ends the connection (RFC 9113 §6.10)
	}
	switch typ {
	case h2FrameData:
		switch {
		case flags&h2FlagPadded != 0 && n > 0:
			c.dataPad, c.dataEnd, c.dataLen = true, flags&h2FlagEndStream != 0, n
		case n == 0 && flags&h2FlagEndStream == 0:
			if !c.take(c.idle) {
				return false, "empty_data"
			}
		}
	case h2FrameHeaders:
		opens := stream > c.last.Load()
		if opens {
			c.last.Store(stream)
		}
		c.mu.Lock()
		c.updatesOwed++ // a client may open a stream's window at once
		refused := opens && c.refusedEarly()
		c.mu.Unlock()
		if refused && !c.take(c.resets) {
			return false, "provoked_resets"
		}
		if stream != 0 && n <= c.holdMax && c.block.start(stream) {
			return true, ""
		}
		c.block.lost()
	case h2FrameContinuation:
		if n == 0 && flags&h2FlagEndHeaders == 0 && !c.take(c.idle) {
			return false, "continuation"
		}
		if c.block.open && stream == c.block.stream && n <= c.holdMax {
			return true, ""
		}
		if c.block.open {
			c.block.lost()
		}
	case h2FrameRSTStream:
		c.mu.Lock()
		c.unanswered = max(c.unanswered-1, 0) // a stream closed, or none
		c.mu.Unlock()
		if !c.take(c.resets) {
			return false, "rst_stream"
		}
	case h2FrameSettings:
		if flags&h2FlagAck != 0 {
			return false, "" // net/http ends a connection acknowledging what it never sent
		}
		if !c.take(c.control) {
			return false, "control"
		}
		// Held to rewrite duplicates: net/http refuses more than 100.
		return stream == 0 && n%6 == 0 && n > 6 && n <= 100*6, ""
	case h2FramePing:
		if flags&h2FlagAck != 0 {
			if !c.spendOwed(&c.pingsOwed) && !c.take(c.idle) {
				return false, "ping_ack"
			}
			return false, ""
		}
		if !c.take(c.control) {
			return false, "control"
		}
	case h2FramePriority, h2FramePriorityUpdate, h2FrameGoAway:
		if !c.take(c.control) {
			return false, "control"
		}
	case h2FrameWindowUpdate:
		if !c.spendOwed(&c.updatesOwed) && !c.take(c.windowUpdates) {
			return false, "window_update"
		}
	case h2FramePushPromise:
		// net/http ends the connection (clients never push).
	default:
		if !c.take(c.idle) {
			return false, "unknown"
		}
	}
	return false, ""
}

// refusedEarly reports whether a stream the client opens is one net/http
// will reset unasked, spending the reset budget on the read side (under
// mu). A client's stream ends only by a frame the server writes or by the
// client's RST_STREAM; so past maxStreams opened since the server last
// wrote, less those the client reset since, net/http refuses each further
// one (or resets it as malformed): that reset is owed. Spending it when
// the server writes it is too late when the writes stall (a client that
// does not read; net/http's writer not yet run while its reader is fed):
// net/http queues the resets unsent, and its own bound of 10,000 queued
// frames closes the connection with no budget spent. The resets written
// later pay off what is owed first (scanOut), so each is spent once.
func (c *h2Meter) refusedEarly() bool {
	c.unanswered++
	if c.unanswered <= c.maxStreams || c.goneQuiet {
		return false
	}
	c.resetsOwed++
	return true
}

// held appends to dst the frame f, read whole, as net/http gets it.
func (c *h2Meter) held(dst, f []byte) []byte {
	switch f[3] {
	case h2FrameSettings:
		return append(dst, h2SettingsLastWins(f)...)
	default:
		return c.headerFrame(dst, f)
	}
}

// h2SettingsLastWins gives a SETTINGS frame's entries that a later one
// overrides identifiers of their own that nobody knows (RFC 9113 §6.5.2:
// ignored), so net/http, which refuses duplicates, processes the list as
// RFC 9113 §6.5.3 says: in order, the last value holding. An entry whose
// value is invalid stays, for net/http to refuse.
func h2SettingsLastWins(f []byte) []byte {
	p := f[9:]
	n := len(p) / 6
	id := func(i int) uint16 { return binary.BigEndian.Uint16(p[6*i:]) }
	used := func(x uint16) bool {
		for i := range n {
			if id(i) == x {
				return true
			}
		}
		return false
	}
	fresh := uint16(0xf000)
	for i := range n {
		dup := false
		for j := i + 1; j < n && !dup; j++ {
			dup = id(j) == id(i)
		}
		if !dup || !h2SettingValid(id(i), binary.BigEndian.Uint32(p[6*i+2:])) {
			continue
		}
		for used(fresh) {
			fresh++
		}
		binary.BigEndian.PutUint16(p[6*i:], fresh)
	}
	return f
}

// h2SettingValid is RFC 9113 §6.5.2's (and RFC 8441's) bound on a value.
func h2SettingValid(id uint16, v uint32) bool {
	switch id {
	case 0x2, 0x8: // ENABLE_PUSH, ENABLE_CONNECT_PROTOCOL
		return v <= 1
	case 0x4: // INITIAL_WINDOW_SIZE
		return v <= 1<<31-1
	case 0x5: // MAX_FRAME_SIZE
		return v >= 1<<14 && v <= 1<<24-1
	}
	return true
}

// headerFrame decodes a HEADERS or CONTINUATION frame's fragment, and
// appends the frame to dst: with h2Poison before its padding when it ends
// a malformed request's header block.
func (c *h2Meter) headerFrame(dst, f []byte) []byte {
	flags, payload := f[4], f[9:]
	frag, pad := payload, 0
	if f[3] == h2FrameHeaders {
		pre := 0
		if flags&h2FlagPadded != 0 {
			if len(payload) < 1 {
				c.block.lost()
				return append(dst, f...)
			}
			pad, pre = int(payload[0]), 1
		}
		if flags&h2FlagPriority != 0 {
			pre += 5
		}
		if pre+pad > len(payload) {
			c.block.lost() // net/http ends the connection
			return append(dst, f...)
		}
		frag = payload[pre : len(payload)-pad]
	}
	c.block.write(frag)
	if flags&h2FlagEndHeaders == 0 {
		return append(dst, f...)
	}
	if !c.block.end(len(frag)) {
		return append(dst, f...)
	}
	n := len(payload) + len(h2Poison)
	dst = append(dst, byte(n>>16), byte(n>>8), byte(n))
	dst = append(dst, f[3:len(f)-pad]...)
	dst = append(dst, h2Poison...)
	return append(dst, f[len(f)-pad:]...)
}

// h2Block follows the header blocks of one connection with an HPACK
// decoder in step with net/http's, and judges each request as net/http's
// framer and RFC 9113 §8.2.2 do.
type h2Block struct {
	dec     *hpack.Decoder
	maxList int
	broken  bool // out of step with net/http: judge no more
	open    bool
	stream  uint32
	// The block being read.
	remain, before      int // header list bytes left (net/http's remainSize), and before the last fragment
	sawRegular, invalid bool
	truncated, bad      bool
	te                  int
}

func (b *h2Block) init(maxList int) {
	b.maxList = maxList
	// net/http's decoder: the default table (the server never advertises
	// another) and its string limit.
	b.dec = hpack.NewDecoder(4096, b.field)
	b.dec.SetMaxStringLength(maxList)
}

// start begins a stream's header block (false when no longer in step).
func (b *h2Block) start(stream uint32) bool {
	if b.broken {
		return false
	}
	b.open, b.stream = true, stream
	b.remain, b.before = b.maxList, b.maxList
	b.sawRegular, b.invalid, b.truncated, b.bad, b.te = false, false, false, false, 0
	b.dec.SetEmitEnabled(true)
	return true
}

// lost notes a fragment the decoder never saw: it is out of step for good
// (net/http ends such a connection: the fragment was too large or the
// frame malformed).
func (b *h2Block) lost() { b.broken, b.open = true, false }

func (b *h2Block) write(frag []byte) {
	if b.broken {
		return
	}
	b.before = b.remain
	if _, err := b.dec.Write(frag); err != nil {
		b.lost()
	}
}

// end closes the block, and reports whether it is a request net/http
// would serve that RFC 9113 §8.2.2 calls malformed.
func (b *h2Block) end(lastFrag int) bool {
	b.open = false
	if b.broken {
		return false
	}
	if err := b.dec.Close(); err != nil {
		b.lost()
		return false
	}
	// net/http resets a stream with an invalid field itself, answers a
	// truncated list 431, and ends a connection whose fragment outgrows
	// twice what the list has left.
	return b.bad && !b.invalid && !b.truncated && lastFrag+len(h2Poison) <= 2*b.before
}

// field judges one field as net/http's framer does (readMetaFrame), then
// as RFC 9113 §8.2.2 does.
func (b *h2Block) field(f hpack.HeaderField) {
	if !h2ValidFieldValue(f.Value) {
		b.invalid = true
	}
	pseudo := strings.HasPrefix(f.Name, ":")
	if pseudo {
		if b.sawRegular {
			b.invalid = true
		}
	} else {
		b.sawRegular = true
		if !h2ValidWireName(f.Name) {
			b.invalid = true
		}
	}
	if b.invalid {
		b.dec.SetEmitEnabled(false)
		return
	}
	if size := int(f.Size()); size > b.remain {
		b.truncated, b.remain = true, 0
		b.dec.SetEmitEnabled(false)
		return
	} else {
		b.remain -= size
	}
	switch f.Name {
	case "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade":
		b.bad = true
	case "te":
		b.te++
		if b.te > 1 || (f.Value != "trailers" && f.Value != "") {
			b.bad = true
		}
	}
}

// h2WireNameByte and h2FieldValueByte judge a byte of a field's name and
// value as net/http does (httpguts's tests, one table lookup a byte): a
// name is a token in lower case (so ASCII: a byte of a multi-byte rune is
// refused as the rune is), a value holds no control character but tab.
var h2WireNameByte, h2FieldValueByte = h2ByteTables()

func h2ByteTables() (name, value [256]bool) {
	for i := range 256 {
		c := byte(i)
		name[i] = httpguts.IsTokenRune(rune(c)) && !('A' <= c && c <= 'Z')
		value[i] = httpguts.ValidHeaderFieldValue(string([]byte{c}))
	}
	return name, value
}

// h2ValidWireName is net/http's test of a field name on the wire: a token,
// in lower case.
func h2ValidWireName(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if !h2WireNameByte[s[i]] {
			return false
		}
	}
	return true
}

// h2ValidFieldValue is httpguts.ValidHeaderFieldValue.
func h2ValidFieldValue(s string) bool {
	for i := 0; i < len(s); i++ {
		if !h2FieldValueByte[s[i]] {
			return false
		}
	}
	return true
}

// Write passes net/http's frames to the client, noting the DATA frames and
// PINGs it sends and spending the reset budget on the resets it sends.
func (c *h2MeteredConn) Write(b []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.goneAway {
		return 0, net.ErrClosed
	}
	if c.away.Load() && c.whn == 0 && c.wleft == 0 {
		// A budget was spent while net/http was writing: its GOAWAY goes
		// here, at the frame boundary, and nothing after it.
		c.goAwayLocked()
		return 0, net.ErrClosed
	}
	if c.wfailed { // TLS fails every write after one failed
		return c.Conn.Write(b)
	}
	// What the server writes is noted before it leaves, so the client
	// cannot answer it first: the WINDOW_UPDATEs a DATA frame allows, the
	// PING ACK a PING asks for, the streams a response ends (refusedEarly's
	// count starts again). A write cut short by an error ends the
	// connection: what did not go out no longer matters (net/http may
	// write the rest again; it is not scanned twice).
	c.mu.Lock()
	c.unanswered = 0
	c.mu.Unlock()
	label := c.scanOut(b)
	n, err := c.Conn.Write(b)
	c.wfailed = err != nil
	if label != "" {
		c.failOnce.Do(func() {
			c.m.floods.WithLabelValues(label).Inc()
			c.away.Store(true)
			c.goAwayLocked()
			_ = c.Conn.Close() // net/http's read ends, and with it the connection
		})
	} else if c.away.Load() {
		c.goAwayLocked()
	}
	return n, err
}

// scanOut follows the server's frames in p (under wmu).
func (c *h2MeteredConn) scanOut(p []byte) string {
	for len(p) > 0 {
		if c.wleft > 0 {
			k := min(c.wleft, len(p))
			if c.wrst != nil { // a RST_STREAM's error code
				c.wrst = append(c.wrst, p[:min(k, 4-len(c.wrst))]...)
				if len(c.wrst) == 4 {
					code := binary.BigEndian.Uint32(c.wrst)
					c.wrst = nil
					if code != h2ErrNo && !c.payOwed() && !c.take(c.resets) {
						return "provoked_resets"
					}
				}
			}
			c.wleft, p = c.wleft-k, p[k:]
			continue
		}
		k := copy(c.whdr[c.whn:], p)
		c.whn, p = c.whn+k, p[k:]
		if c.whn < len(c.whdr) {
			return ""
		}
		c.whn = 0
		c.wleft = int(c.whdr[0])<<16 | int(c.whdr[1])<<8 | int(c.whdr[2])
		switch c.whdr[3] {
		case h2FrameData:
			c.mu.Lock()
			c.updatesOwed += h2WindowUpdatePerData + c.wleft/h2WindowUpdateBytes
			c.mu.Unlock()
		case h2FramePing:
			if c.whdr[4]&h2FlagAck == 0 {
				c.mu.Lock()
				c.pingsOwed++
				c.mu.Unlock()
			}
		case h2FrameGoAway:
			c.mu.Lock()
			c.goneQuiet = true
			c.mu.Unlock()
		case h2FrameRSTStream:
			if c.wleft == 4 {
				c.wrst = make([]byte, 0, 4)
			}
		}
	}
	return ""
}

// payOwed takes one of the resets spent before they were written, if one
// is left.
func (c *h2Meter) payOwed() bool { return c.spendOwed(&c.resetsOwed) }

// flood counts a connection that spent a budget, and tells the client
// (GOAWAY ENHANCE_YOUR_CALM): at once when net/http is not writing, else
// at the end of the frame it writes (Write), else when net/http closes the
// connection (Close).
func (c *h2MeteredConn) flood(label string) {
	c.failOnce.Do(func() {
		c.m.floods.WithLabelValues(label).Inc()
		c.away.Store(true)
		if c.wmu.TryLock() {
			c.goAwayLocked()
			c.wmu.Unlock()
		}
	})
}

// goAwayLocked writes a GOAWAY (ENHANCE_YOUR_CALM) at a frame boundary,
// and no frame after it; in the middle of a frame it waits for the frame's
// end (the next Write).
func (c *h2MeteredConn) goAwayLocked() {
	if c.goneAway || c.whn != 0 || c.wleft != 0 {
		return
	}
	c.goneAway = true
	f := [9 + 8]byte{2: 8, 3: h2FrameGoAway}
	binary.BigEndian.PutUint32(f[9:], c.last.Load())
	binary.BigEndian.PutUint32(f[13:], h2ErrEnhanceYourCalm)
	_ = c.Conn.SetWriteDeadline(time.Now().Add(time.Second))
	_, _ = c.Conn.Write(f[:])
}
