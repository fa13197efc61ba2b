package listen

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/caddyserver/certmagic"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/edgeguard/edgeguard/internal/acmestore"
	"github.com/edgeguard/edgeguard/pkg/region"
)

// ACME: certificates for --acme-domains obtained and renewed by certmagic
// from --acme-ca, answering TLS-ALPN-01 challenges on --listen-tls. The
// state (account, certificates, keys, challenge tokens) lives in Consul KV
// under acme/<region>/ (internal/acmestore), shared by the region's edges:
// certmagic takes a Consul lock per certificate, so one edge obtains or
// renews it and the others load the result; a challenge the CA sends to
// another edge than the one that asked is answered from the shared token.
// An ACME name is served its managed certificate once there is one; until
// then (and for every other name) the certificate store answers.

// acmeState is the edge's certmagic setup.
type acmeState struct {
	magic   *certmagic.Config
	cache   *certmagic.Cache
	domains map[string]bool
	stop    context.CancelFunc
}

// StartACME starts managing --acme-domains, answering challenges on
// tlsAddr; their first certificates are obtained in the background. stop
// ends it.
func (e *Certs) StartACME(client *region.Client, tlsAddr string) (stop func(), err error) {
	storage := acmestore.New(client.API(), region.NewLayout(e.cfg.ConsulPrefix).ACME(e.cfg.Region))
	logger := zap.New(slogCore{log: e.log.With("component", "acme")})
	var roots *x509.CertPool
	if e.cfg.ACMECARoot != "" {
		pem, err := os.ReadFile(e.cfg.ACMECARoot)
		if err != nil {
			return nil, fmt.Errorf("acme-ca-root: %w", err)
		}
		roots = x509.NewCertPool()
		if !roots.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("acme-ca-root: no PEM certificate in %s", e.cfg.ACMECARoot)
		}
	}
	host, port, err := net.SplitHostPort(tlsAddr)
	if err != nil {
		return nil, err
	}
	portNum, _ := strconv.Atoi(port)
	a := &acmeState{domains: map[string]bool{}}
	for _, d := range e.cfg.ACMEDomains {
		a.domains[strings.ToLower(d)] = true
	}
	a.cache = certmagic.NewCache(certmagic.CacheOptions{
		GetConfigForCert:   func(certmagic.Certificate) (*certmagic.Config, error) { return a.magic, nil },
		RenewCheckInterval: e.cfg.ACMERenewCheck, // 0: certmagic's default
		Logger:             logger,
	})
	a.magic = certmagic.New(a.cache, certmagic.Config{
		Storage: storage,
		Logger:  logger,
		OnEvent: func(_ context.Context, event string, data map[string]any) error {
			switch event {
			case "cert_obtained", "cert_failed":
				e.log.Info("acme certificate event", "event", event, "identifier", data["identifier"], "renewal", data["renewal"], "error", data["error"])
				e.m.acme.WithLabelValues(event).Inc()
			}
			return nil
		},
	})
	a.magic.Issuers = []certmagic.Issuer{certmagic.NewACMEIssuer(a.magic, certmagic.ACMEIssuer{
		CA:                   e.cfg.ACMECA,
		Email:                e.cfg.ACMEEmail,
		Agreed:               true,
		DisableHTTPChallenge: true,
		// The edge's own TLS listener answers the challenges: certmagic
		// finds the port taken and leaves them to it.
		ListenHost:     host,
		AltTLSALPNPort: portNum,
		TrustedRoots:   roots,
		Logger:         logger,
	})}
	ctx, cancel := context.WithCancel(context.Background())
	a.stop = func() { cancel(); a.cache.Stop() }
	e.acme = a
	return a.stop, a.magic.ManageAsync(ctx, e.cfg.ACMEDomains)
}

// certificate serves a TLS-ALPN-01 challenge, or an ACME name's managed
// certificate; ok is false when the certificate store should answer.
func (a *acmeState) certificate(hello *tls.ClientHelloInfo) (c *tls.Certificate, ok bool, err error) {
	if slices.Equal(hello.SupportedProtos, []string{acmeALPN}) {
		c, err = a.magic.GetCertificate(hello)
		return c, true, err
	}
	if !a.domains[strings.ToLower(strings.TrimSuffix(hello.ServerName, "."))] {
		return nil, false, nil
	}
	c, err = a.magic.GetCertificate(hello)
	if err != nil {
		return nil, false, nil // not obtained yet
	}
	return c, true, nil
}

// slogCore hands certmagic's zap logs to the edge's slog logger.
type slogCore struct {
	log    *slog.Logger
	fields []zapcore.Field
}

func (c slogCore) Enabled(l zapcore.Level) bool { return l >= zapcore.InfoLevel }

func (c slogCore) With(fs []zapcore.Field) zapcore.Core {
	return slogCore{log: c.log, fields: append(slices.Clip(c.fields), fs...)}
}

func (c slogCore) Check(ent zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(ent.Level) {
		return ce.AddCore(ent, c)
	}
	return ce
}

func (c slogCore) Write(ent zapcore.Entry, fs []zapcore.Field) error {
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range append(slices.Clip(c.fields), fs...) {
		f.AddTo(enc)
	}
	args := make([]any, 0, 2*len(enc.Fields))
	for k, v := range enc.Fields {
		args = append(args, k, v)
	}
	level := slog.LevelInfo
	switch {
	case ent.Level >= zapcore.ErrorLevel:
		level = slog.LevelError
	case ent.Level == zapcore.WarnLevel:
		level = slog.LevelWarn
	}
	c.log.Log(context.Background(), level, "acme: "+ent.Message, args...)
	return nil
}

func (c slogCore) Sync() error { return nil }
