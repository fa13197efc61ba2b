package peerbench

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
)

// originEnv, when set in the environment, makes ServeOriginIfAsked serve
// the origin on the address it holds.
const originEnv = "PEERBENCH_ORIGIN"

// maxObject bounds the size an object may be asked for (1 TiB).
const maxObject = 1 << 40

// patternSize is how much of the object stream is kept in memory: objects
// up to this size are written from it in one call, as a cache serving from
// memory would.
const patternSize = 4 << 20

// chunk is the unit in which larger objects are generated; a multiple of 8,
// so every object is a prefix of the same stream.
const chunk = 64 << 10

// objectStream yields the bytes every object is a prefix of: the
// little-endian words of a PCG seeded with fixed values.
type objectStream struct{ pcg *rand.PCG }

func newObjectStream() *objectStream { return &objectStream{pcg: rand.NewPCG(0x65646765, 0x67756172)} }

// fill writes the next len(p) bytes of the stream into p; len(p) must be a
// multiple of 8 except on the stream's last call.
func (s *objectStream) fill(p []byte) {
	i := 0
	for ; i+8 <= len(p); i += 8 {
		binary.LittleEndian.PutUint64(p[i:], s.pcg.Uint64())
	}
	if i < len(p) {
		var w [8]byte
		binary.LittleEndian.PutUint64(w[:], s.pcg.Uint64())
		copy(p[i:], w[:])
	}
}

var pattern = sync.OnceValue(func() []byte {
	p := make([]byte, patternSize)
	newObjectStream().fill(p)
	return p
})

// ParseObjectPath reads the size out of /obj/<bytes>.
func ParseObjectPath(path string) (int64, error) {
	s, ok := strings.CutPrefix(path, "/obj/")
	if !ok {
		return 0, errors.New("path is not /obj/<bytes>")
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > maxObject {
		return 0, fmt.Errorf("object size %q: want a whole number of bytes from 0 to %d", s, int64(maxObject))
	}
	return n, nil
}

// origin serves /obj/<bytes> (with Content-Length) and /sum/<id>: the
// SHA-256 of what the origin wrote for the request that asked ?sum=<id>.
type origin struct {
	mu   sync.Mutex
	sums map[string]string
}

func (o *origin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id, ok := strings.CutPrefix(r.URL.Path, "/sum/"); ok {
		o.mu.Lock()
		sum, ok := o.sums[id]
		o.mu.Unlock()
		if !ok {
			http.Error(w, "no sum for "+strconv.Quote(id)+" (yet)", http.StatusNotFound)
			return
		}
		_, _ = io.WriteString(w, sum)
		return
	}
	n, err := ParseObjectPath(r.URL.Path)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	id := r.URL.Query().Get("sum")
	if len(id) > 64 {
		http.Error(w, "sum id longer than 64 bytes", http.StatusBadRequest)
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(n, 10))
	var out io.Writer = w
	var h hash.Hash
	if id != "" {
		h = sha256.New()
		out = io.MultiWriter(w, h)
	}
	if err := writeObject(out, n); err != nil {
		return // the client went away
	}
	if h != nil {
		o.mu.Lock()
		o.sums[id] = hex.EncodeToString(h.Sum(nil))
		o.mu.Unlock()
	}
}

// writeObject writes the first n bytes of the object stream to w.
func writeObject(w io.Writer, n int64) error {
	if n <= patternSize {
		_, err := w.Write(pattern()[:n])
		return err
	}
	s := newObjectStream()
	buf := make([]byte, chunk)
	for n > 0 {
		b := buf[:min(n, chunk)]
		s.fill(b)
		if _, err := w.Write(b); err != nil {
			return err
		}
		n -= int64(len(b))
	}
	return nil
}

// ServeOriginIfAsked serves the origin and never returns when this process
// was started as one (by startOrigin), or drives a load and exits when it
// was started as one (by startLoad); otherwise it returns at once. Call it
// first thing in main (and TestMain).
func ServeOriginIfAsked() {
	if addr := os.Getenv(fastOriginEnv); addr != "" {
		serveFastOrigin(addr)
	}
	if addr := os.Getenv(hostOriginEnv); addr != "" {
		serveHostOrigin(addr)
	}
	if spec := os.Getenv(tenantLoadEnv); spec != "" {
		runTenantLoad(spec)
	}
	addr := os.Getenv(originEnv)
	if addr == "" {
		return
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, "origin:", err)
		os.Exit(1)
	}
	err = http.Serve(ln, &origin{sums: map[string]string{}})
	fmt.Fprintln(os.Stderr, "origin:", err)
	os.Exit(1)
}
