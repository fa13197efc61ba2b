package listen

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// The framer reads a stream the same however it is cut into reads.
func TestFramerReadsAnyCut(t *testing.T) {
	for _, tc := range []struct {
		name, stream string
		stop         string // what does not go on: the stream's end from the violation (or after the request that closes)
		err          *framingError
		closed       bool
	}{
		{"keep-alive requests", "GET / HTTP/1.1\r\nHost: a\r\n\r\n\r\nPOST / HTTP/1.1\r\ncontent-length: 3\r\n\r\nabcPOST / HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\nA;x=\"y\"\r\n0123456789\r\n0\r\nT: 1\r\n\r\n", "", nil, false},
		{"TE+CL ends the stream", "POST / HTTP/1.1\r\nContent-Length: 9\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nx\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n", "GET / HTTP/1.1\r\n\r\n", nil, true},
		{"a body's LF is body", "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n\n\nGET /\n", "\n", errBareLF, false},
		{"a chunk's CRLF missing", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nxy\r\n", "y\r\n", errChunk, false},
		{"a chunk-size of 16 digits", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1000000000000000\r\n", "0\r\n", errChunk, false},
		{"a bare LF in a trailer", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\n\r\n", "\n\r\n", errBareLF, false},
		{"obs-fold in a trailer", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nT: 1\r\n 2\r\n\r\n", " 2\r\n\r\n", errObsFold, false},
		{"a bare LF in a chunk extension", "POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n1;a\nx\r\n", "\nx\r\n", errBareLF, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			want := len(tc.stream) - len(tc.stop)
			require.True(t, strings.HasSuffix(tc.stream, tc.stop))
			for _, cut := range []int{len(tc.stream), 1, 2, 7} {
				var f framer
				got := 0
				for i := 0; i < len(tc.stream); i += cut {
					p := []byte(tc.stream[i:min(i+cut, len(tc.stream))])
					k := f.scan(p)
					got += k
					if k < len(p) {
						break
					}
				}
				require.Equal(t, want, got, "cut %d", cut)
				require.Equal(t, tc.err, f.err, "cut %d", cut)
				require.Equal(t, tc.closed, f.state == fsClosed, "cut %d", cut)
			}
		})
	}
}

// A framing refusal, wrapped or not, gives its reason, status and detail;
// any other error is not one.
func TestFramingRefusal(t *testing.T) {
	reason, status, detail, ok := FramingRefusal(fmt.Errorf("reading: %w", errTEUnsupported))
	require.True(t, ok)
	require.Equal(t, reasonTransferCoding, reason)
	require.Equal(t, 501, status)
	require.Equal(t, errTEUnsupported.Detail, detail)
	_, _, _, ok = FramingRefusal(errors.New("connection reset"))
	require.False(t, ok)
	_, _, _, ok = FramingRefusal(nil)
	require.False(t, ok)
}

// BenchmarkFramer is what the framer adds to a typical browser request
// (a header block of about 500 bytes, no body).
func BenchmarkFramer(b *testing.B) {
	req := []byte("GET /v1/orders/12345?expand=items&limit=20 HTTP/1.1\r\nHost: api.example.com\r\n" +
		"User-Agent: Mozilla/5.0 (X11; Linux x86_64; rv:128.0) Gecko/20100101 Firefox/128.0\r\n" +
		"Accept: text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8\r\n" +
		"Accept-Language: en-US,en;q=0.5\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n" +
		"Cookie: session=0123456789abcdef0123456789abcdef; theme=dark\r\n" +
		"Connection: keep-alive\r\nUpgrade-Insecure-Requests: 1\r\nSec-Fetch-Dest: document\r\n" +
		"Sec-Fetch-Mode: navigate\r\nSec-Fetch-Site: none\r\nPriority: u=0, i\r\n\r\n")
	b.SetBytes(int64(len(req)))
	b.ReportAllocs()
	var f framer
	for b.Loop() {
		if f.scan(req) != len(req) {
			b.Fatal(f.err)
		}
	}
}

// FuzzFramerCuts: however a stream is cut into reads, the framer lets the
// same bytes on and ends in the same state.
func FuzzFramerCuts(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
		"POST / HTTP/1.1\r\nContent-Length: 3\r\n\r\nabcGET / HTTP/1.1\n\n",
		"POST / HTTP/1.1\r\nTransfer-Encoding: chunked\r\nContent-Length: 1\r\n\r\n2;a=b\r\nxy\r\n0\r\nT: 1\r\n\r\nGET",
		"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET / HTTP/1.1\r\nX: a\r\n b\r\n\r\n",
		"GET / HTTP/1.0\r\nX-A-Long-Field-Name-Here: 1\r\ncOnTeNt-LeNgTh: 2\r\n\r\nabG\r\n\r\n",
		"P/1.1\r\n\r\nGET / HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		"GET / HTTP/1.1\r\nBad Name: 1\r\n\r\n",
		"GET / HTTP/1.1\r\n: empty\r\nA:\r\n\r\n",
		"GET / HTTP/1.1\r\nA: b\nc\r\n\r\n",
		"GET / HTTP/1.1\r\nA: b\rc\r\n\r\n",
		"GET /\r HTTP/1.1\r\n\r\n",
	} {
		f.Add([]byte(s), uint8(1))
	}
	f.Fuzz(func(t *testing.T, stream []byte, cut uint8) {
		var whole framer
		want := whole.scan(stream)
		var parts framer
		got := 0
		step := int(cut%64) + 1
		for i := 0; i < len(stream); i += step {
			p := stream[i:min(i+step, len(stream))]
			k := parts.scan(p)
			got += k
			if k < len(p) {
				break
			}
		}
		if got != want || parts.err != whole.err || (parts.state == fsClosed) != (whole.state == fsClosed) {
			t.Fatalf("cut %d: %d bytes on (%v), whole: %d (%v)", step, got, parts.err, want, whole.err)
		}
		if parts.err == nil && parts != whole {
			t.Fatalf("cut %d: the framer ends in another state than the whole stream's:\n%+v\n%+v", step, parts, whole)
		}
	})
}
