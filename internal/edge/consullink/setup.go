package consullink

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/hashicorp/consul/api"

	"github.com/edgeguard/edgeguard/pkg/region"
)

// agent is how the edge reaches its Consul agent (--consul and its
// credentials).
type agent struct {
	Addr     string // host:port, or an http:// or https:// URL
	Token    string // "": the api's defaults (CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE)
	CAFile   string
	CertFile string
	KeyFile  string
}

// dial is the client of the region's documents under prefix, through the
// agent a, and what closes its keep-alive connections (and their
// goroutines).
func dial(a agent, prefix string) (*region.Client, func(), error) {
	ccfg := apiConfig(a)
	client, err := region.NewClient(ccfg, prefix)
	if err != nil {
		return nil, nil, err
	}
	return client, ccfg.Transport.CloseIdleConnections, nil
}

func apiConfig(a agent) *api.Config {
	cfg := api.DefaultConfig()
	addr := a.Addr
	if rest, ok := strings.CutPrefix(addr, "https://"); ok {
		cfg.Scheme, addr = "https", rest
	}
	cfg.Address = strings.TrimPrefix(addr, "http://")
	if a.Token != "" {
		// Otherwise the api's defaults stand: CONSUL_HTTP_TOKEN, CONSUL_HTTP_TOKEN_FILE.
		cfg.Token = a.Token
	}
	cfg.TLSConfig = api.TLSConfig{CAFile: a.CAFile, CertFile: a.CertFile, KeyFile: a.KeyFile}
	return cfg
}

// addrs are what the edge's registrations say of it.
type addrs struct {
	Region, PoP string
	Advertise   string // --advertise ("" none): host[:port]
	Public      string // the bound public address
	Admin       string // the bound admin address
	RLS         string // the rate limit service's bound address ("" off)
	RLSTLS      bool   // the rate limit service answers TLS
	Version     string // the build's
}

// registrations are the edge's registration in the catalog and, with a
// rate limit service, the service's (nil without).
func registrations(a addrs) (region.Registration, *region.RLSRegistration) {
	host, _ := os.Hostname()
	_, port, _ := net.SplitHostPort(a.Public)
	portNum, _ := strconv.Atoi(port)
	advertise := ""
	if a.Advertise != "" {
		advertise, _, _ = strings.Cut(a.Advertise, ":")
		// Edges sharing a host (and a port, each on its own address) must
		// not share a service ID: the second would replace the first.
		host = advertise
	}
	reg := region.Registration{
		ID:       fmt.Sprintf("edge-%s-%s-%s-%s", a.Region, a.PoP, host, port),
		Region:   a.Region,
		PoP:      a.PoP,
		Address:  advertise,
		Port:     portNum,
		Version:  a.Version,
		CheckURL: "http://" + localAddr(a.Admin) + "/readyz",
	}
	if a.RLS == "" {
		return reg, nil
	}
	_, rlsPort, _ := net.SplitHostPort(a.RLS)
	rlsPortNum, _ := strconv.Atoi(rlsPort)
	_, adminPort, _ := net.SplitHostPort(a.Admin)
	adminPortNum, _ := strconv.Atoi(adminPort)
	return reg, &region.RLSRegistration{
		ID:          fmt.Sprintf("rls-%s-%s-%s-%s", a.Region, a.PoP, host, rlsPort),
		Region:      a.Region,
		PoP:         a.PoP,
		Edge:        reg.ID,
		Address:     advertise,
		Port:        rlsPortNum,
		MetricsPort: adminPortNum,
		CheckAddr:   localAddr(a.RLS),
		TLS:         a.RLSTLS,
	}
}

// localAddr turns a wildcard bind address into one the local agent can dial.
func localAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}

// defaultCache is where the last good rules are kept when --rules-cache
// is not set, the first that applies of:
//
//  1. $STATE_DIRECTORY (the first of its paths): systemd sets it for a unit
//     with StateDirectory=edgeguard;
//  2. stateDir (/var/lib/edgeguard), when the edge may write there;
//  3. the user cache dir (os.UserCacheDir: $XDG_CACHE_HOME or ~/.cache),
//     under edgeguard/.
//
// The file is rules-<region>.yaml. Never the temporary directory: anyone
// may write there and a reboot empties it, so a restarted edge would run
// what someone else left, or nothing. With none of them, there is no cache
// (an error says so).
func defaultCache(region, stateDir string, getenv func(string) string, userCache func() (string, error)) (string, error) {
	name := "rules-" + region + ".yaml"
	if dirs := getenv("STATE_DIRECTORY"); dirs != "" {
		dir, _, _ := strings.Cut(dirs, ":")
		return filepath.Join(dir, name), nil
	}
	if writableDir(stateDir) {
		return filepath.Join(stateDir, name), nil
	}
	dir, err := userCache()
	if err != nil {
		return "", fmt.Errorf("finding the rules cache: no $STATE_DIRECTORY, %s not writable, no user cache dir: %w", stateDir, err)
	}
	return filepath.Join(dir, "edgeguard", name), nil
}

// writableDir reports whether dir exists, or can be made, and takes files.
func writableDir(dir string) bool {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return false
	}
	f, err := os.CreateTemp(dir, ".probe-*")
	if err != nil {
		return false
	}
	f.Close()
	os.Remove(f.Name())
	return true
}
