package listen

import (
	"bytes"
	"errors"
	"io"
	"net"

	"github.com/valyala/fasthttp"
)

// HTTP/1.x framing (step 1, Accept): every byte of a plain or TLS HTTP/1.x
// connection passes a strict reader of the request framing (RFC 9112 §2.2,
// §5, §6, §7.1) on its way to fasthttp. It changes no byte; it stops the
// stream where a request stops having one meaning, so that the edge, the
// proxies in front of it and the origin never read one request two ways:
//
//   - lines end in CRLF: a bare LF or a bare CR is refused (fasthttp takes
//     a bare LF for a line end in some places and waits for a CRLF CRLF that
//     never comes in others; a balancer in front may do either);
//   - no obs-fold (a field line starting with a space or tab), no
//     whitespace in or after a field name, no field line without a colon;
//   - Content-Length once, digits only;
//   - Transfer-Encoding once, exactly "chunked", in HTTP/1.1 only
//     (another single coding is 501, anything else 400);
//   - Transfer-Encoding with Content-Length: the chunked body is read and
//     the request answered, then the stream ends (RFC 9112 §6.3: a server
//     MUST close the connection), so nothing after the body is read as a
//     request (the record stage also marks the answer Connection: close);
//   - chunk-size lines, chunk ends and trailer lines end in CRLF.
//
// The reader follows each request's framing (Content-Length or chunks) to
// find the next request's first byte, so a pipelined request is checked
// like the first. A violation delivers the bytes before it, then fails
// the next Read with a *framingError: fasthttp's ErrorHandler
// (serverError) answers with its status and closes the connection, and
// the origin sees nothing of the request. Its state is a few dozen bytes
// per connection; it buffers nothing.
//
// fasthttp hands h2 connections (ALPN) to the HTTP/2 server unread, which
// reads the TLS connection under this one (h1Unwrapped).

// framingError is a request the edge refuses at the framing: Reason is
// the refusal's label (edgeguard_edge_requests_refused_total), Status and
// Detail its answer.
type framingError struct {
	Reason string
	Status int
	Detail string
}

func (e *framingError) Error() string { return "request framing: " + e.Detail }

// FramingRefusal is the refusal of a request whose framing the reader
// refused (ok false for any other error).
func FramingRefusal(err error) (reason string, status int, detail string, ok bool) {
	var fe *framingError
	if !errors.As(err, &fe) {
		return "", 0, "", false
	}
	return fe.Reason, fe.Status, fe.Detail, true
}

// Refusal reasons of the framing.
const (
	reasonLineEnding       = "line_ending"
	reasonObsFold          = "obs_fold"
	reasonFieldSyntax      = "field_syntax"
	reasonContentLength    = "content_length"
	reasonTransferEncoding = "transfer_encoding"
	reasonTransferCoding   = "transfer_coding"
	reasonChunk            = "chunk_syntax"
)

// FramingReasons are the framing's refusal reasons.
var FramingReasons = []string{
	reasonLineEnding, reasonObsFold, reasonFieldSyntax, reasonContentLength, reasonTransferEncoding,
	reasonTransferCoding, reasonChunk,
}

var (
	errBareLF        = &framingError{reasonLineEnding, fasthttp.StatusBadRequest, "a line ends in a bare LF; lines end in CRLF"}
	errBareCR        = &framingError{reasonLineEnding, fasthttp.StatusBadRequest, "a CR is not followed by LF; lines end in CRLF"}
	errObsFold       = &framingError{reasonObsFold, fasthttp.StatusBadRequest, "a field line starts with whitespace (obs-fold)"}
	errFieldName     = &framingError{reasonFieldSyntax, fasthttp.StatusBadRequest, "a field name is empty or holds whitespace"}
	errFieldColon    = &framingError{reasonFieldSyntax, fasthttp.StatusBadRequest, "a field line has no colon"}
	errCLRepeated    = &framingError{reasonContentLength, fasthttp.StatusBadRequest, "Content-Length is sent more than once"}
	errCLValue       = &framingError{reasonContentLength, fasthttp.StatusBadRequest, "Content-Length is not a number of bytes"}
	errTERepeated    = &framingError{reasonTransferEncoding, fasthttp.StatusBadRequest, "Transfer-Encoding is sent more than once"}
	errTEHTTP10      = &framingError{reasonTransferEncoding, fasthttp.StatusBadRequest, "Transfer-Encoding is only served in HTTP/1.1 requests"}
	errTEList        = &framingError{reasonTransferEncoding, fasthttp.StatusBadRequest, "Transfer-Encoding must be exactly chunked"}
	errTEUnsupported = &framingError{reasonTransferCoding, fasthttp.StatusNotImplemented, "the only transfer coding served is chunked"}
	errChunk         = &framingError{reasonChunk, fasthttp.StatusBadRequest, "a chunk of the body is malformed"}
)

// framer states.
const (
	fsLineStart   = iota // at the start of a line (header block or trailer)
	fsLine               // in a line
	fsLineCR             // after a CR: LF must follow
	fsBody               // in a Content-Length body
	fsChunkSize          // in a chunk-size
	fsChunkExt           // after the chunk-size, before its CR
	fsChunkSizeCR        // after the chunk-size line's CR
	fsChunkData          // in a chunk's data
	fsChunkDataCR        // after a chunk's data: CR
	fsChunkDataLF        // then LF
	fsClosed             // a TE+CL request ended: nothing more is read
)

// Where a line is.
const (
	inStart   = iota // before the request line (empty lines are skipped)
	inFields         // the header's field lines
	inTrailer        // the trailer's field lines
)

// Framing fields the framer reads.
const (
	fieldOther = iota
	fieldCL
	fieldTE
)

var (
	nameCL  = []byte("content-length")
	nameTE  = []byte("transfer-encoding")
	chunked = []byte("chunked")
)

// http11Word is "HTTP/1.1" as the framer's shift register holds a line's
// last eight bytes.
const http11Word = uint64('H')<<56 | uint64('T')<<48 | uint64('T')<<40 | uint64('P')<<32 |
	uint64('/')<<24 | uint64('1')<<16 | uint64('.')<<8 | uint64('1')

// framer follows one connection's request framing.
type framer struct {
	state, section int
	requestLine    bool   // the line is the request line
	tail           uint64 // the request line's last eight bytes
	http11         bool
	lineLen        int
	colon          bool // past the field name
	name           [17]byte
	nameLen        int
	field          int
	val            [24]byte
	valLen         int
	clSeen, teSeen bool
	left           int64 // bytes left of a body or chunk; a chunk-size
	digits         int
	closeAfter     bool
	err            *framingError
	got            bool // the client sent a byte
	// upgraded: the connection is a tunnel now (Upgraded); its bytes are
	// another protocol's and pass unread.
	upgraded bool
}

// scan follows p and returns how many of its bytes may go on: all of
// them, or those before a violation (f.err) or after the end of a request
// that closes the connection (fsClosed).
func (f *framer) scan(p []byte) int {
	i := 0
	for i < len(p) {
		if f.err != nil || f.state == fsClosed {
			return i
		}
		c := p[i]
		switch f.state {
		case fsBody, fsChunkData:
			n := int(min(int64(len(p)-i), f.left))
			f.left -= int64(n)
			i += n
			if f.left == 0 {
				if f.state == fsBody {
					f.endMessage()
				} else {
					f.state = fsChunkDataCR
				}
			}
			continue
		case fsChunkDataCR:
			if c != '\r' {
				f.err = errChunk
				continue
			}
			f.state = fsChunkDataLF
		case fsChunkDataLF:
			if c != '\n' {
				f.err = errChunk
				continue
			}
			f.state, f.left, f.digits = fsChunkSize, 0, 0
		case fsChunkSize:
			if h := unhex(c); h >= 0 {
				if f.digits == 15 { // past what an int64 holds
					f.err = errChunk
					continue
				}
				f.left = f.left<<4 | int64(h)
				f.digits++
				break
			}
			if f.digits == 0 {
				f.err = errChunk
				continue
			}
			f.state = fsChunkExt
			continue // the same byte, as an extension's
		case fsChunkExt:
			switch c {
			case '\r':
				f.state = fsChunkSizeCR
			case '\n':
				f.err = errBareLF
				continue
			}
		case fsChunkSizeCR:
			if c != '\n' {
				f.err = errBareCR
				continue
			}
			if f.left == 0 {
				f.state, f.section = fsLineStart, inTrailer
			} else {
				f.state = fsChunkData
			}
		case fsLineCR:
			if c != '\n' {
				f.err = errBareCR
				continue
			}
			f.endLine()
			if f.err != nil {
				continue // the LF stays back: fasthttp has no whole line
			}
		default: // fsLineStart, fsLine
			if f.state == fsLineStart && f.section != inTrailer {
				if n := f.wholeLine(p[i:]); n > 0 {
					i += n
					continue
				}
			}
			if f.state == fsLine && (f.requestLine || f.section == inTrailer || f.colon && f.field == fieldOther) {
				// The rest of a line nothing is read from, up to its CR or
				// LF, in one step.
				n := lineRest(p[i:])
				if f.requestLine {
					for _, c := range p[i+max(0, n-8) : i+n] {
						f.tail = f.tail<<8 | uint64(c)
					}
				}
				f.lineLen += n
				if i += n; i == len(p) || !f.lineByte(p[i]) {
					continue
				}
			} else if f.state == fsLine && !f.colon {
				// A field name, up to its colon, in one loop.
				j := i
				for ; j < len(p); j++ {
					c := p[j]
					if c == ':' || c == '\r' || c == '\n' || c == ' ' || c == '\t' {
						break
					}
					if f.nameLen < len(f.name) {
						f.name[f.nameLen] = c | 0x20
					}
					f.nameLen++
				}
				f.lineLen += j - i
				if i = j; i == len(p) || !f.lineByte(p[i]) {
					continue
				}
			} else if !f.lineByte(c) {
				continue
			}
		}
		i++
	}
	return i
}

// wholeLine takes a request line or a field line that is whole in b, CRLF
// included, in one step, and returns its length: the line's bytes are
// looked at a few times with IndexByte instead of one at a time through
// the states, which is most of what the framer costs a request. It takes
// only a line nothing is refused in and no value is read from (a framing
// field's is), and leaves the framer as the bytes one at a time would
// (FuzzFramerCuts holds the two to the same bytes on and the same state);
// it returns 0 for any other line, which then goes byte by byte.
func (f *framer) wholeLine(b []byte) int {
	end := bytes.IndexByte(b, '\r')
	if end <= 0 || end+1 == len(b) || b[end+1] != '\n' {
		return 0 // empty, not whole, or a bare CR
	}
	line := b[:end]
	if bytes.IndexByte(line, '\n') >= 0 {
		return 0 // a bare LF
	}
	if f.section == inStart {
		for _, c := range line[max(0, len(line)-8):] {
			f.tail = f.tail<<8 | uint64(c)
		}
		f.http11, f.section = f.tail == http11Word, inFields
		f.lineLen, f.colon, f.nameLen, f.valLen, f.field, f.requestLine = 0, false, 0, 0, fieldOther, false
		return end + 2
	}
	colon := bytes.IndexByte(line, ':')
	if colon <= 0 {
		return 0 // no name, or no colon
	}
	name := line[:colon]
	for i, c := range name {
		if c == ' ' || c == '\t' {
			return 0 // obs-fold, or whitespace in the name
		}
		if i < len(f.name) {
			f.name[i] = c | 0x20
		}
	}
	f.nameLen = len(name)
	if f.field = f.classify(); f.field != fieldOther {
		f.nameLen = 0 // Content-Length and Transfer-Encoding go byte by byte
		return 0
	}
	f.lineLen, f.colon, f.valLen = 0, true, 0
	return end + 2
}

// lineByte takes a byte of a header or trailer line; false on a
// violation.
func (f *framer) lineByte(c byte) bool {
	switch c {
	case '\r':
		f.state = fsLineCR
		return true
	case '\n':
		f.err = errBareLF
		return false
	}
	if f.state == fsLineStart {
		if f.section != inStart && (c == ' ' || c == '\t') {
			f.err = errObsFold
			return false
		}
		f.state, f.lineLen, f.colon, f.nameLen, f.valLen, f.field = fsLine, 0, false, 0, 0, fieldOther
		f.requestLine = f.section == inStart
	}
	f.lineLen++
	switch {
	case f.requestLine:
		f.tail = f.tail<<8 | uint64(c)
	case f.section == inTrailer:
		// fasthttp refuses what a trailer may not hold.
	case !f.colon:
		switch c {
		case ':':
			if f.nameLen == 0 {
				f.err = errFieldName
				return false
			}
			f.colon = true
			f.field = f.classify()
		case ' ', '\t':
			f.err = errFieldName
			return false
		default:
			if f.nameLen < len(f.name) {
				f.name[f.nameLen] = c | 0x20
			}
			f.nameLen++
		}
	case f.field != fieldOther:
		if f.valLen < len(f.val) {
			f.val[f.valLen] = c
		}
		f.valLen++
	}
	return true
}

// classify names the field whose name the framer has read.
func (f *framer) classify() int {
	name := f.name[:min(f.nameLen, len(f.name))]
	switch {
	case f.nameLen == len(nameCL) && bytes.Equal(name, nameCL):
		return fieldCL
	case f.nameLen == len(nameTE) && bytes.Equal(name, nameTE):
		return fieldTE
	}
	return fieldOther
}

// endLine ends a line at its CRLF.
func (f *framer) endLine() {
	f.state = fsLineStart
	empty := f.lineLen == 0
	f.lineLen = 0
	switch {
	case empty && f.section == inStart: // an empty line before the request line
	case empty && f.section == inFields:
		f.endHeader()
	case empty: // the trailer's end
		f.endMessage()
	case f.requestLine:
		f.requestLine, f.http11, f.section = false, f.tail == http11Word, inFields
	case f.section == inTrailer:
	case !f.colon:
		f.err = errFieldColon
	case f.field == fieldCL:
		f.contentLength()
	case f.field == fieldTE:
		f.transferEncoding()
	}
}

func (f *framer) contentLength() {
	if f.clSeen {
		f.err = errCLRepeated
		return
	}
	f.clSeen = true
	v := f.value()
	if len(v) == 0 || len(v) > 18 || f.valLen > len(f.val) {
		f.err = errCLValue
		return
	}
	var n int64
	for _, c := range v {
		if c < '0' || c > '9' {
			f.err = errCLValue
			return
		}
		n = n*10 + int64(c-'0')
	}
	f.left = n
}

func (f *framer) transferEncoding() {
	switch {
	case !f.http11:
		f.err = errTEHTTP10
	case f.teSeen:
		f.err = errTERepeated
	}
	if f.err != nil {
		return
	}
	f.teSeen = true
	v := f.value()
	switch {
	case f.valLen <= len(f.val) && bytes.EqualFold(v, chunked):
	case len(v) == 0 || bytes.IndexByte(v, ',') >= 0:
		f.err = errTEList
	default:
		f.err = errTEUnsupported
	}
}

// value is the field's value (as far as kept), without its leading and
// trailing whitespace.
func (f *framer) value() []byte {
	return bytes.Trim(f.val[:min(f.valLen, len(f.val))], " \t")
}

// endHeader follows the header's framing into the body.
func (f *framer) endHeader() {
	switch {
	case f.teSeen:
		f.closeAfter = f.clSeen
		f.state, f.left, f.digits = fsChunkSize, 0, 0
	case f.clSeen && f.left > 0:
		f.state = fsBody
	default:
		f.endMessage()
	}
}

// endMessage readies the framer for the next request, or ends the stream.
func (f *framer) endMessage() {
	f.state, f.section, f.clSeen, f.teSeen, f.left = fsLineStart, inStart, false, false, 0
	if f.closeAfter {
		f.state = fsClosed
	}
}

// lineRest is the length of b's bytes before its first CR or LF (all of
// b without one).
func lineRest(b []byte) int {
	end := bytes.IndexByte(b, '\r')
	if end < 0 {
		end = len(b)
	}
	if lf := bytes.IndexByte(b[:end], '\n'); lf >= 0 {
		return lf
	}
	return end
}

func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'a' && c <= 'f':
		return int(c-'a') + 10
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}

// read is Read through the framer: src reads the connection.
func (f *framer) read(src func([]byte) (int, error), p []byte) (int, error) {
	switch {
	case f.upgraded:
		return src(p)
	case f.err != nil:
		return 0, f.err
	case f.state == fsClosed:
		return 0, io.EOF
	}
	n, err := src(p)
	f.got = f.got || n > 0
	k := f.scan(p[:n])
	switch {
	case k > 0:
		if k < n {
			err = nil // what follows comes as the next Read's error or EOF
		}
		return k, err
	case f.err != nil:
		return 0, f.err
	case f.state == fsClosed:
		return 0, io.EOF
	}
	return n, err
}

// readFrom is read for the connection c, which leaves q with the first
// byte its client sends (f.got).
func (f *framer) readFrom(c net.Conn, q *Quiet, src func([]byte) (int, error), p []byte) (int, error) {
	sent := f.got
	n, err := f.read(src, p)
	if !sent && f.got {
		q.drop(c)
	}
	return n, err
}

// framingListener puts a framer on each HTTP/1.x connection it accepts,
// and keeps it in q until it sends something.
type framingListener struct {
	net.Listener
	q *Quiet
}

// Framed is ln with each connection's request framing checked; q (nil:
// none) keeps the connections that have sent nothing yet.
func Framed(ln net.Listener, q *Quiet) net.Listener { return framingListener{ln, q} }

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	if tc, ok := c.(*serverTLSConn); ok {
		fc := &framedTLSConn{serverTLSConn: tc, q: l.q}
		l.q.add(fc, tc.NetConn()) // closed under TLS: no close_notify to a client that sent nothing

		return fc, nil
	}
	fc := &framedConn{Conn: c, q: l.q}
	l.q.add(fc, c)
	return fc, nil
}

// framedConn is a plain connection read through a framer, kept in q
// until it sends a byte.
type framedConn struct {
	net.Conn
	f framer
	q *Quiet
}

func (c *framedConn) Read(p []byte) (int, error) { return c.f.readFrom(c, c.q, c.Conn.Read, p) }

// Close closes the connection, which is no longer quiet.
func (c *framedConn) Close() error {
	c.q.drop(c)
	return c.Conn.Close()
}

// NetConn is the connection under the framer (ClientGone looks at it).
func (c *framedConn) NetConn() net.Conn { return c.Conn }

// framedTLSConn is a TLS connection read through a framer; fasthttp sees
// its TLS (Handshake, ConnectionState) as before.
type framedTLSConn struct {
	*serverTLSConn
	f framer
	q *Quiet
}

func (c *framedTLSConn) Read(p []byte) (int, error) {
	return c.f.readFrom(c, c.q, c.serverTLSConn.Read, p)
}

// Close closes the connection, which is no longer quiet.
func (c *framedTLSConn) Close() error {
	c.q.drop(c)
	return c.serverTLSConn.Close()
}

// h1Unwrapped hands an h2 connection's handler the TLS connection under
// the framer: HTTP/2 frames are not HTTP/1.x lines.
func h1Unwrapped(serve func(net.Conn) error) func(net.Conn) error {
	return func(c net.Conn) error {
		if fc, ok := c.(*framedTLSConn); ok {
			fc.q.drop(fc) // the HTTP/2 server reads it from here on
			return serve(fc.serverTLSConn)
		}
		return serve(c)
	}
}

// Upgraded switches c's framer off once its connection has become a
// tunnel (a 101 answer to an Upgrade request): what follows is no longer
// HTTP/1.x. It reports false when the framer had already refused bytes
// (a client that sent before the 101), which were lost: such a tunnel
// must not start. The origin package finds it through the connection's
// NetConn chain.
func (c *framedConn) Upgraded() bool { return c.f.upgrade() }

// Upgraded is framedConn's, for TLS.
func (c *framedTLSConn) Upgraded() bool { return c.f.upgrade() }

func (f *framer) upgrade() bool {
	if f.err != nil || f.state == fsClosed {
		return false
	}
	f.upgraded = true
	return true
}

// ClientSent reports whether the client sent any byte on c (true for a
// connection without a framer).
func ClientSent(c net.Conn) bool {
	switch c := c.(type) {
	case *framedConn:
		return c.f.got
	case *framedTLSConn:
		return c.f.got
	}
	return true
}

// ClosesAfter reports whether c's framer ends the connection after the
// request it is reading (Transfer-Encoding with Content-Length).
func ClosesAfter(c net.Conn) bool {
	switch c := c.(type) {
	case *framedConn:
		return c.f.closeAfter
	case *framedTLSConn:
		return c.f.closeAfter
	}
	return false
}
