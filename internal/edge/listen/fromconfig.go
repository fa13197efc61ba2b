package listen

import (
	"github.com/edgeguard/edgeguard/internal/edge/config"
	"github.com/edgeguard/edgeguard/internal/edge/trust"
)

// SettingsFrom are the public listeners' settings in cfg.
func SettingsFrom(c config.Config) Settings {
	return Settings{
		ReadTimeout: c.ReadTimeout, WriteTimeout: c.WriteTimeout, IdleTimeout: c.IdleTimeout,
		MaxHeaderBytes: c.MaxHeaderBytes, MaxBodyBytes: c.MaxBodyBytes,
		ProxyFrom: trust.Set(c.ProxyProtocolFrom), Trusted: trust.Set(c.TrustedProxies),
		MaxConnsPerIP: c.MaxConnsPerIP, IPv6Prefix: c.IPv6Prefix,
		Listen: c.Listen, ListenTLS: c.ListenTLS, H2MaxStreams: c.H2MaxStreams, H2MaxHeldBytes: c.H2MaxHeldBytes,
		Certs: CertsConfig{
			TLSCertDir:     c.TLSCertDir,
			TLSDefaultCert: c.TLSDefaultCert,
			TLSTicketKeys:  c.TLSTicketKeys,
			Consul:         c.Consul,
			ConsulPrefix:   c.ConsulPrefix,
			Region:         c.Region,
			ACMEDomains:    c.ACMEDomains,
			ACMEEmail:      c.ACMEEmail,
			ACMECA:         c.ACMECA,
			ACMECARoot:     c.ACMECARoot,
			ACMERenewCheck: c.ACMERenewCheck,
		},
	}
}
