// Command tlsfloor is the floor of scripts/bench-tls.sh: a TLS server with
// none of the edge's work that answers every request "200 ok" itself, built
// the way the edge serves TLS (crypto/tls, fasthttp for HTTP/1.1, net/http's
// HTTP/2 server for h2 through fasthttp's NextProto). Set against nginx's
// `return 200` in the same run, it shows what Go's TLS, fasthttp and net/http
// cost before the edge does anything of its own.
//
//	tlsfloor -listen 127.0.0.1:8443 -cert cert.pem -key key.pem
package main

import (
	"crypto/tls"
	"flag"
	"log"
	"net"
	"net/http"
	"sync"

	"github.com/valyala/fasthttp"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:8443", "TLS listen address")
	certFile := flag.String("cert", "", "certificate (PEM)")
	keyFile := flag.String("key", "", "private key (PEM)")
	flag.Parse()

	cert, err := tls.LoadX509KeyPair(*certFile, *keyFile)
	if err != nil {
		log.Fatal(err)
	}
	config := &tls.Config{
		MinVersion:   tls.VersionTLS12,
		Certificates: []tls.Certificate{cert},
		NextProtos:   []string{"h2", "http/1.1"},
	}
	ln, err := net.Listen("tcp", *listen)
	if err != nil {
		log.Fatal(err)
	}

	ok := []byte("ok\n")
	s := &fasthttp.Server{
		Handler: func(ctx *fasthttp.RequestCtx) {
			ctx.SetContentType("text/plain")
			ctx.SetBody(ok)
		},
		NoDefaultServerHeader: true,
	}
	h2 := newH2(ln.Addr(), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain")
		w.Header().Set("Content-Length", "3")
		_, _ = w.Write(ok)
	}))
	s.NextProto("h2", h2.serveConn)
	go func() { log.Fatal(h2.hs.Serve(h2)) }()
	log.Fatal(s.Serve(tls.NewListener(ln, config)))
}

// h2 hands fasthttp's h2 connections to net/http's HTTP/2 server (the
// edge's h2.go does the same, with its meters).
type h2 struct {
	addr  net.Addr
	conns chan net.Conn
	hs    *http.Server
}

func newH2(addr net.Addr, handler http.Handler) *h2 {
	var protos http.Protocols
	protos.SetUnencryptedHTTP2(true)
	return &h2{addr: addr, conns: make(chan net.Conn), hs: &http.Server{Handler: handler, Protocols: &protos}}
}

// serveConn passes c (decrypted) to net/http and waits until it is closed.
func (h *h2) serveConn(c net.Conn) error {
	tc, ok := c.(*tls.Conn)
	if !ok {
		return nil
	}
	dc := &doneConn{Conn: tc, done: make(chan struct{})}
	h.conns <- dc
	<-dc.done
	return nil
}

func (h *h2) Accept() (net.Conn, error) { return <-h.conns, nil }
func (h *h2) Close() error              { return nil }
func (h *h2) Addr() net.Addr            { return h.addr }

// doneConn is a connection net/http sees as plain (no second ALPN look).
type doneConn struct {
	net.Conn
	once sync.Once
	done chan struct{}
}

func (c *doneConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() { close(c.done) })
	return err
}
