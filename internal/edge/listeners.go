package edge

// TLSAddr is the bound TLS address ("" without --listen-tls).
func (e *Edge) TLSAddr() string {
	if e.tlsLn == nil {
		return ""
	}
	return e.tlsLn.Addr().String()
}
