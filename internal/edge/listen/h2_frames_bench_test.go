package listen

import (
	"bytes"
	"io"
	"net"
	"testing"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// readerConn is a net.Conn that reads from a reader (the benchmark's
// client bytes); nothing else is called.
type readerConn struct {
	net.Conn
	r io.Reader
}

func (c *readerConn) Read(b []byte) (int, error) { return c.r.Read(b) }

// BenchmarkH2FrameMeter measures what the edge's frame meter costs a
// request on top of net/http: one browser-like HEADERS frame (a dozen
// fields, most from the dynamic table after the first), read as net/http
// reads it (the 9-byte header, then the payload).
func BenchmarkH2FrameMeter(b *testing.B) {
	var stream bytes.Buffer
	stream.WriteString(http2Preface)
	fr := http2.NewFramer(&stream, nil)
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	const n = 1000
	for i := range n {
		hb.Reset()
		for _, f := range [][2]string{{":method", "GET"}, {":scheme", "https"}, {":path", "/static/app.js?v=" + string(rune('a'+i%26))},
			{":authority", "shop.example.com"}, {"user-agent", "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/131.0 Safari/537.36"},
			{"accept", "*/*"}, {"accept-encoding", "gzip, deflate, br, zstd"}, {"accept-language", "en-US,en;q=0.9"},
			{"cookie", "session=0123456789abcdef0123456789abcdef"}, {"referer", "https://shop.example.com/"},
			{"sec-fetch-dest", "script"}, {"sec-fetch-mode", "no-cors"}, {"sec-fetch-site", "same-origin"}, {"priority", "u=1"}} {
			_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
		}
		_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: uint32(2*i + 1), BlockFragment: hb.Bytes(), EndStream: true, EndHeaders: true})
	}
	data := stream.Bytes()
	m := newH2Metrics()
	hdr := make([]byte, 9)
	payload := make([]byte, 16<<10)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i += n {
		c := &h2MeteredConn{Conn: &readerConn{r: bytes.NewReader(data)}, closed: make(chan struct{})}
		// No server write comes between the streams here, as none would
		// between a browser's: the limit is set above them, or the meter
		// would take them for streams net/http refuses.
		c.init(m, 8<<10, n)
		if _, err := io.ReadFull(c, make([]byte, len(http2Preface))); err != nil {
			b.Fatal(err)
		}
		for range n {
			if _, err := io.ReadFull(c, hdr); err != nil {
				b.Fatal(err)
			}
			l := int(hdr[0])<<16 | int(hdr[1])<<8 | int(hdr[2])
			if _, err := io.ReadFull(c, payload[:l]); err != nil {
				b.Fatal(err)
			}
		}
	}
}
