package edge

import "github.com/edgeguard/edgeguard/internal/edge/listen"

// TLSAddr is the bound TLS address ("" without --listen-tls).
func (e *Edge) TLSAddr() string {
	if e.tls == nil {
		return ""
	}
	return e.tls.Ln.Addr().String()
}

// certs and h2 are the TLS listener's certificates and HTTP/2 server (nil
// without --listen-tls; h2 nil without HTTP/2 too).
func (e *Edge) certs() *listen.Certs {
	if e.tls == nil {
		return nil
	}
	return e.tls.Certs
}

func (e *Edge) h2() *listen.H2Server {
	if e.tls == nil {
		return nil
	}
	return e.tls.H2
}
