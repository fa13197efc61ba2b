// Package buildinfo says which build of edgeguard is running: the release
// version stamped at build time (make build: git describe), the VCS
// revision the Go toolchain records, and the Go version.
package buildinfo

import (
	"runtime"
	"runtime/debug"
)

// version is set with -ldflags "-X github.com/edgeguard/edgeguard/internal/buildinfo.version=v1.2.3".
var version = ""

// Info is one build's identity.
type Info struct {
	Version, Revision, GoVersion string
}

// Get returns the running binary's build: the stamped version, else the
// module version (go install …@v1.2.3), else "devel"; the revision from
// the VCS stamp ("unknown" without one, "+dirty" when modified).
func Get() Info {
	i := Info{Version: version, Revision: "unknown", GoVersion: runtime.Version()}
	bi, ok := debug.ReadBuildInfo()
	if ok {
		if i.Version == "" && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
			i.Version = bi.Main.Version
		}
		dirty := false
		for _, s := range bi.Settings {
			switch s.Key {
			case "vcs.revision":
				i.Revision = s.Value
			case "vcs.modified":
				dirty = s.Value == "true"
			}
		}
		if dirty && i.Revision != "unknown" {
			i.Revision += "+dirty"
		}
	}
	if i.Version == "" {
		i.Version = "devel"
	}
	return i
}

// String is the one line --version prints.
func (i Info) String() string {
	return i.Version + " (revision " + i.Revision + ", " + i.GoVersion + ")"
}
